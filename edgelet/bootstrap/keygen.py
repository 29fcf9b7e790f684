"""New keys with a CSR or a self-signed certificate, made by `edgelet keygen` in a short-lived child process.

`cryptography` costs an agent about 13 MiB that never leaves once it is imported; the agent needs it only for
the moment a key is made (a token join, each certificate rotation, the kubelet API's first start). So the agent
asks a child (the same edgelet, `edgelet keygen`) with one JSON request on stdin and reads the PEMs from stdout.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
from typing import Any

from edgelet.util.errors import TemporaryError

CHILD_TIMEOUT = 60.0


class KeygenError(TemporaryError):
    """The child could not make the key (retried: a busy or short-of-memory device may manage next time)."""


def child_command() -> list[str]:
    """This edgelet as a command: the bundle's binary, or this interpreter running the package."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "keygen"]
    return [sys.executable, "-m", "edgelet", "keygen"]


def in_child(request: dict[str, Any], *, timeout: float = CHILD_TIMEOUT) -> dict[str, str]:
    """What `make(request)` returns, made in a child process. Blocking: call it from a thread in async code."""
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))  # this edgelet
    try:
        done = subprocess.run(child_command(), input=json.dumps(request).encode(), capture_output=True,
                              env=env, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KeygenError(f"cannot run {' '.join(child_command())}: {exc}") from None
    if done.returncode != 0:
        raise KeygenError(f"edgelet keygen failed (exit {done.returncode}): "
                          f"{done.stderr.decode(errors='replace').strip()}")
    try:
        answer = json.loads(done.stdout)
        return {str(name): str(value) for name, value in answer.items()}
    except (ValueError, AttributeError) as exc:
        raise KeygenError(f"edgelet keygen answered something that is not a JSON object: {exc}") from None


def make(request: dict[str, Any]) -> dict[str, str]:
    """{"key": PKCS#8 PEM, "csr" or "certificate": PEM} for a request of kind "csr" or "self-signed".

    Both: a new ECDSA P-256 key (the kubelet's choice), a subject CN (and O for a CSR), SANs from "dns_names"
    and "ip_addresses". A self-signed certificate is a TLS server's: valid "days" from "not_before" (epoch s).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, request["common_name"])]
    if request.get("organization"):
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, request["organization"]))
    subject = x509.Name(attributes)
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in request.get("dns_names") or ()]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in request.get("ip_addresses") or ()]
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode("ascii")
    if request["kind"] == "csr":
        builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        csr = builder.sign(key, hashes.SHA256())
        return {"key": key_pem, "csr": csr.public_bytes(serialization.Encoding.PEM).decode("ascii")}
    if request["kind"] != "self-signed":
        raise ValueError(f"unknown kind {request['kind']!r}: csr or self-signed")
    start = datetime.datetime.fromtimestamp(request["not_before"], datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=request["days"]))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, content_commitment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return {"key": key_pem, "certificate": certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")}


def main() -> int:
    """`edgelet keygen`: one JSON request on stdin, one JSON answer on stdout."""
    try:
        answer = make(json.load(sys.stdin))
    except (ValueError, KeyError, TypeError) as exc:
        print(f"edgelet keygen: bad request: {exc!r}", file=sys.stderr)
        return 2
    json.dump(answer, sys.stdout)
    return 0
