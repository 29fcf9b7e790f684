"""The kubelet API's TLS material: the self-signed serving certificate made once (with no openssl program
on PATH), its key private, its names; the server context that loads it; clear errors for unusable files."""

from __future__ import annotations

import ipaddress
import ssl
import stat

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from edgelet.kubeletapi.certs import TLSSetupError, ensure_self_signed, server_context
from tests.kubeapi_double.testcerts import make_ca


def test_self_signed_certificate_is_made_once_with_a_private_key(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))  # the deb and rpm do not depend on openssl
    directory = tmp_path / "pki"
    cert, key = ensure_self_signed(str(directory), "node-1", ["192.0.2.7", "127.0.0.1"])
    assert stat.S_IMODE((directory / "kubelet.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    first = (directory / "kubelet.crt").read_bytes()
    assert ensure_self_signed(str(directory), "node-1", ["192.0.2.7"]) == (cert, key)
    assert (directory / "kubelet.crt").read_bytes() == first  # kept, not made again
    certificate = x509.load_pem_x509_certificate(first)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["node-1", "localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("192.0.2.7"),
                                                         ipaddress.ip_address("127.0.0.1")]
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert certificate.subject.rfc4514_string().startswith("CN=node-1@")
    assert certificate.issuer == certificate.subject
    assert server_context(cert, key).verify_mode == ssl.CERT_NONE  # the pair loads into a serving context
    assert sorted(p.name for p in directory.iterdir()) == ["kubelet.crt", "kubelet.key"]  # no leftovers


def test_server_context_asks_for_client_certificates_only_with_a_ca(tmp_path):
    cert, key = ensure_self_signed(str(tmp_path), "node-1", [])
    assert server_context(cert, key).verify_mode == ssl.CERT_NONE
    ca_cert, _ = make_ca(str(tmp_path))
    assert server_context(cert, key, client_ca_file=ca_cert).verify_mode == ssl.CERT_OPTIONAL
    with open(ca_cert, "rb") as file:
        assert server_context(cert, key, client_ca_data=file.read()).verify_mode == ssl.CERT_OPTIONAL


def test_unusable_files_name_the_setting(tmp_path):
    cert, key = ensure_self_signed(str(tmp_path), "node-1", [])
    with pytest.raises(TLSSetupError, match="kubelet_api.tls_cert_file"):
        server_context(str(tmp_path / "missing.crt"), key)
    not_a_ca = tmp_path / "ca.pem"
    not_a_ca.write_text("not a certificate")
    with pytest.raises(TLSSetupError, match="kubelet_api.client_ca_file"):
        server_context(cert, key, client_ca_file=str(not_a_ca))
