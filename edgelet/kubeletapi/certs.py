"""TLS for the kubelet API: the serving certificate (a self-signed one made once with openssl when none is
configured, as the kubelet does) and the server context that asks callers for a client certificate.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterable

from edgelet.errors import PermanentError

SELF_SIGNED_DAYS = 365
_OPENSSL_TIMEOUT = 60.0


class TLSSetupError(PermanentError):
    """The kubelet API cannot serve TLS; the message names the setting or file at fault."""


def subject_alt_names(names: Iterable[str]) -> str:
    """openssl's subjectAltName value: IP: for addresses, DNS: for the rest, each once, in order."""
    entries: list[str] = []
    for name in names:
        if not name:
            continue
        try:
            entry = f"IP:{ipaddress.ip_address(name)}"
        except ValueError:
            entry = f"DNS:{name}"
        if entry not in entries:
            entries.append(entry)
    return ",".join(entries)


def ensure_self_signed(directory: str, node_name: str, addresses: Iterable[str]) -> tuple[str, str]:
    """(cert, key) under `directory`, made on the first call and kept: `kubelet.crt` and a 0600 `kubelet.key`."""
    cert_path = os.path.join(directory, "kubelet.crt")
    key_path = os.path.join(directory, "kubelet.key")
    if os.path.exists(cert_path) and os.path.exists(key_path):
        return cert_path, key_path
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as work:
        tmp_cert, tmp_key = os.path.join(work, "crt"), os.path.join(work, "key")
        command = [
            "openssl", "req", "-x509", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", tmp_key, "-out", tmp_cert, "-days", str(SELF_SIGNED_DAYS),
            "-subj", f"/CN={node_name}@{int(time.time())}",
            "-addext", f"subjectAltName={subject_alt_names([node_name, 'localhost', *addresses])}",
            "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
            "-addext", "extendedKeyUsage=serverAuth",
        ]
        old_umask = os.umask(0o077)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_OPENSSL_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise TLSSetupError(f"kubelet_api: cannot run openssl to make a serving certificate: {err}") from None
        finally:
            os.umask(old_umask)
        if done.returncode != 0:
            raise TLSSetupError(f"kubelet_api: openssl could not make a serving certificate: {done.stderr.strip()}")
        os.chmod(tmp_key, 0o600)
        # The key first: a certificate alone on disk would be taken as a complete pair next start.
        os.replace(tmp_key, key_path)
        os.replace(tmp_cert, cert_path)
    return cert_path, key_path


def server_context(cert_file: str, key_file: str, *, client_ca_file: str = "",
                   client_ca_data: bytes | None = None) -> ssl.SSLContext:
    """TLS 1.2+ serving `cert_file`; a client certificate is asked for (not required) and verified
    against the client CA when one is given. A certificate from another CA fails the handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as err:
        raise TLSSetupError(f"kubelet_api.tls_cert_file / tls_private_key_file ({cert_file}, {key_file}): "
                            f"cannot load the serving certificate and key: {err}") from None
    if client_ca_file or client_ca_data:
        try:
            if client_ca_file:
                context.load_verify_locations(cafile=client_ca_file)
            else:
                context.load_verify_locations(cadata=(client_ca_data or b"").decode("ascii"))
        except (OSError, ssl.SSLError, UnicodeDecodeError, ValueError) as err:
            where = f"kubelet_api.client_ca_file ({client_ca_file})" if client_ca_file else \
                "kubelet_api.client_ca_file (default: the kubeconfig's certificate-authority)"
            raise TLSSetupError(f"{where}: not a usable CA certificate: {err}") from None
        context.verify_mode = ssl.CERT_OPTIONAL
    return context
