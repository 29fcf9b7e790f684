"""A cluster a node joins with a bootstrap token, for the API server double: a CA, the double's TLS serving
certificate, the CSR signer kube-controller-manager would be, and kube-public/cluster-info signed for the token.
Made for tests and benchmarks only; it protects nothing."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import ipaddress
import json
import ssl
import textwrap
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

TOKEN_ID, TOKEN_SECRET = "abcdef", "0123456789abcdef"
CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
FIRST_CERT_SECONDS = 20  # the join's certificate: rotated at 70-90 % of it, within a test or benchmark
LATER_CERT_SECONDS = 86_400


class ClusterPKI:
    """A CA, the double's serving certificate for 127.0.0.1, and the signer kube-controller-manager would be."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgelet-bench-ca")])
        self.ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
                        .public_key(self.ca_key.public_key()).serial_number(x509.random_serial_number())
                        .not_valid_before(now - datetime.timedelta(minutes=5))
                        .not_valid_after(now + datetime.timedelta(days=1))
                        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                        .sign(self.ca_key, hashes.SHA256()))
        self.ca_pem = self.ca_cert.public_bytes(serialization.Encoding.PEM)
        server_key = ec.generate_private_key(ec.SECP256R1())
        server_cert = self._issue(server_key.public_key(), "kube-apiserver", [], 86_400,
                                  alt_names=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
                                  usage=ExtendedKeyUsageOID.SERVER_AUTH)
        self.ca_file = directory / "ca.crt"
        self.ca_file.write_bytes(self.ca_pem)
        self.server_cert_file, self.server_key_file = directory / "apiserver.crt", directory / "apiserver.key"
        self.server_cert_file.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
        self.server_key_file.write_bytes(server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        self.issued: list[str] = []  # signer names, in order

    def _issue(self, public_key: Any, common_name: str, organizations: list[str], seconds: int, *,
               alt_names: list | None = None, usage=ExtendedKeyUsageOID.CLIENT_AUTH) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
                            + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.ca_cert.subject)
                   .public_key(public_key).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(now + datetime.timedelta(seconds=seconds))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        return builder.sign(self.ca_key, hashes.SHA256())

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert_file, self.server_key_file)
        context.load_verify_locations(cadata=self.ca_pem.decode())
        context.verify_mode = ssl.CERT_OPTIONAL  # bootstrap-token requests carry no client certificate
        return context

    def sign(self, csr_object: dict[str, Any]) -> dict[str, Any]:
        """Approve and sign, as the csrapproving and csrsigning controllers do; the first client certificate is
        short-lived so the agent rotates it during the benchmark."""
        spec = csr_object["spec"]
        request = x509.load_pem_x509_csr(base64.b64decode(spec["request"]))
        clients = sum(1 for signer in self.issued if signer == CLIENT_SIGNER)
        seconds = FIRST_CERT_SECONDS if spec["signerName"] == CLIENT_SIGNER and clients == 0 else LATER_CERT_SECONDS
        names = request.subject
        common_name = names.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        organizations = [a.value for a in names.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        usage = (ExtendedKeyUsageOID.CLIENT_AUTH if spec["signerName"] == CLIENT_SIGNER
                 else ExtendedKeyUsageOID.SERVER_AUTH)
        certificate = self._issue(request.public_key(), common_name, organizations, seconds, usage=usage)
        self.issued.append(spec["signerName"])
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved",
                                "message": "approved by the benchmark", "lastUpdateTime": now}],
                "certificate": base64.b64encode(certificate.public_bytes(serialization.Encoding.PEM)).decode()}

    def ca_cert_hash(self) -> str:
        spki = self.ca_cert.public_key().public_bytes(serialization.Encoding.DER,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo)
        return "sha256:" + hashlib.sha256(spki).hexdigest()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def cluster_info(server: str, ca_pem: bytes) -> dict[str, Any]:
    """kube-public/cluster-info as kubeadm writes it, signed for our token as the bootstrapsigner signs it."""
    kubeconfig = json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [
        {"name": "", "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}]})
    protected = _b64url(json.dumps({"alg": "HS256", "kid": TOKEN_ID}).encode())
    signature = hmac.new(TOKEN_SECRET.encode(), f"{protected}.{_b64url(kubeconfig.encode())}".encode(),
                         hashlib.sha256).digest()
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": kubeconfig, f"jws-kubeconfig-{TOKEN_ID}": f"{protected}..{_b64url(signature)}"}}


def join_toml(server: str, ca_cert_hash: str, kubelet_api_port: int) -> str:
    """The [cluster] of a bootstrap-token join with the CA pin, and the kubelet API on a loopback port."""
    return textwrap.dedent(f"""
        [cluster]
        server = "{server}"
        bootstrap_token = "{TOKEN_ID}.{TOKEN_SECRET}"
        ca_cert_hash = "{ca_cert_hash}"

        [kubelet_api]
        address = "127.0.0.1:{kubelet_api_port}"
        """)


def crypto_mapped(pid: int) -> bool:
    """Whether a library of the cryptography package is mapped into the process."""
    with open(f"/proc/{pid}/maps") as maps:
        return any("/cryptography/" in line for line in maps)
