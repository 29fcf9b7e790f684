"""TLS bootstrap's pure parts: token and pin formats, the cluster-info JWS and pin checks, certificate
fields read without a crypto library, CSR building and the rotation deadline."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import random
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edgelet.bootstrap.csr import (
    CLIENT_SIGNER,
    CLIENT_USAGES,
    csr_object,
    csr_outcome,
    new_key_and_request,
    rotation_deadline,
)
from edgelet.bootstrap.discovery import UnsignedClusterInfo, trusted_ca, unverified_context
from edgelet.bootstrap.manager import Credentials
from edgelet.bootstrap.tokens import (
    BootstrapToken,
    DiscoveryError,
    ca_hash_error,
    spki_hash,
    token_error,
    verify_detached,
)
from edgelet.bootstrap.x509 import CertificateError, first_certificate, parse_certificate
from edgelet.config import ConfigError, format_effective, parse_config

TOKEN = BootstrapToken.parse("abcdef.0123456789abcdef")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jws(payload: bytes, secret: str = TOKEN.secret, header: dict | None = None) -> str:
    """RFC 7515 compact JWS with the payload left out, as the bootstrapsigner stores it."""
    protected = b64url(json.dumps(header or {"alg": "HS256", "kid": TOKEN.id}).encode())
    signature = hmac.new(secret.encode(), f"{protected}.{b64url(payload)}".encode(), hashlib.sha256).digest()
    return f"{protected}..{b64url(signature)}"


def make_cert(not_before: datetime.datetime, not_after: datetime.datetime, *, serial: int = 0x1234,
              key: ec.EllipticCurvePrivateKey | None = None) -> tuple[bytes, ec.EllipticCurvePrivateKey]:
    key = key or ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(serial).not_valid_before(not_before).not_valid_after(not_after)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), key


@pytest.mark.parametrize("text, ok", [
    ("abcdef.0123456789abcdef", True),
    ("ABCDEF.0123456789abcdef", False),
    ("abcde.0123456789abcdef", False),
    ("abcdef.0123456789abcde", False),
    ("abcdef:0123456789abcdef", False),
    ("abcdef.0123456789abcdef\n", False),
])
def test_token_format(text, ok):
    assert (token_error(text) is None) == ok


def test_token_repr_hides_the_secret():
    assert TOKEN.secret not in repr(TOKEN) and str(TOKEN) == "abcdef.0123456789abcdef"


@pytest.mark.parametrize("text, ok", [
    ("sha256:" + "ab" * 32, True),
    ("sha256:" + "AB" * 32, False),
    ("sha256:" + "ab" * 31, False),
    ("sha1:" + "ab" * 32, False),
    ("ab" * 32, False),
])
def test_ca_cert_hash_format(text, ok):
    assert (ca_hash_error(text) is None) == ok


def test_certificate_fields_match_a_crypto_library():
    start = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    end = datetime.datetime(2051, 6, 7, 8, 9, 10, tzinfo=datetime.UTC)  # GeneralizedTime after 2049
    pem, key = make_cert(start, end, serial=0xDEADBEEF)
    cert = first_certificate(pem)
    assert (cert.not_before, cert.not_after) == (start.timestamp(), end.timestamp())
    assert cert.serial == 0xDEADBEEF
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert cert.spki_der == spki
    assert spki_hash(cert.spki_der) == "sha256:" + hashlib.sha256(spki).hexdigest()


@pytest.mark.parametrize("data", [b"", b"\x30\x03\x02\x01", b"\x02\x01\x00", b"\x30\x82\xff\xff" + b"\x00" * 10])
def test_damaged_certificates_raise_certificate_error(data):
    with pytest.raises(CertificateError):
        parse_certificate(data)


def test_pem_without_certificate():
    with pytest.raises(CertificateError, match="no CERTIFICATE"):
        first_certificate(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")


def test_detached_jws_accepts_the_tokens_signature():
    verify_detached(jws(b"kubeconfig text"), b"kubeconfig text", TOKEN)


@pytest.mark.parametrize("signature, problem", [
    (jws(b"other text"), "does not match"),
    (jws(b"kubeconfig text", secret="0" * 16), "does not match"),
    (jws(b"kubeconfig text", header={"alg": "none", "kid": TOKEN.id}), "not an HS256 JWS"),
    (jws(b"kubeconfig text", header={"alg": "HS256", "kid": "zzzzzz"}), "not an HS256 JWS"),
    (jws(b"kubeconfig text").replace("..", ".eA."), "not a detached JWS"),
    ("garbage", "not a detached JWS"),
    ("!!..!!", "not valid base64url"),
])
def test_detached_jws_refuses(signature, problem):
    with pytest.raises(DiscoveryError, match=problem):
        verify_detached(signature, b"kubeconfig text", TOKEN)


def cluster_info(ca_pem: bytes, *, signed: bool = True) -> dict:
    kubeconfig = ("apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: "
                  f"{base64.b64encode(ca_pem).decode()}\n    server: https://127.0.0.1:6443\n  name: ''\n")
    data = {"kubeconfig": kubeconfig}
    if signed:
        data[f"jws-kubeconfig-{TOKEN.id}"] = jws(kubeconfig.encode())
    return {"data": data}


def test_cluster_info_with_the_pinned_ca_is_trusted():
    now = datetime.datetime.now(datetime.UTC)
    ca_pem, _ = make_cert(now, now + datetime.timedelta(days=1))
    pin = spki_hash(first_certificate(ca_pem).spki_der)
    assert trusted_ca(cluster_info(ca_pem), TOKEN, pin) == ca_pem


def test_cluster_info_with_another_ca_names_both_hashes():
    now = datetime.datetime.now(datetime.UTC)
    ca_pem, _ = make_cert(now, now + datetime.timedelta(days=1))
    actual = spki_hash(first_certificate(ca_pem).spki_der)
    wrong = "sha256:" + "0" * 64
    with pytest.raises(DiscoveryError) as refused:
        trusted_ca(cluster_info(ca_pem), TOKEN, wrong)
    assert actual in str(refused.value) and wrong in str(refused.value)


@pytest.mark.parametrize("pinned", [0, 1])
def test_the_pin_may_name_any_certificate_of_the_bundle(pinned):
    """kubeadm accepts cluster-info when any CA of its bundle has the pinned hash (an old and a new CA)."""
    now = datetime.datetime.now(datetime.UTC)
    bundle = [make_cert(now, now + datetime.timedelta(days=1))[0] for _ in range(2)]
    ca_pem = b"".join(bundle)
    pin = spki_hash(first_certificate(bundle[pinned]).spki_der)
    assert trusted_ca(cluster_info(ca_pem), TOKEN, pin) == ca_pem


def test_a_bundle_without_the_pinned_certificate_names_every_hash():
    now = datetime.datetime.now(datetime.UTC)
    bundle = [make_cert(now, now + datetime.timedelta(days=1))[0] for _ in range(2)]
    wrong = "sha256:" + "0" * 64
    with pytest.raises(DiscoveryError) as refused:
        trusted_ca(cluster_info(b"".join(bundle)), TOKEN, wrong)
    for pem in bundle:
        assert spki_hash(first_certificate(pem).spki_der) in str(refused.value)


def test_the_unverified_read_checks_nothing_and_loads_no_ca_store():
    context = unverified_context()
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_NONE, False)
    assert context.cert_store_stats()["x509_ca"] == 0


def test_unsigned_or_tampered_cluster_info():
    now = datetime.datetime.now(datetime.UTC)
    ca_pem, _ = make_cert(now, now + datetime.timedelta(days=1))
    pin = spki_hash(first_certificate(ca_pem).spki_der)
    with pytest.raises(UnsignedClusterInfo, match=TOKEN.id):
        trusted_ca(cluster_info(ca_pem, signed=False), TOKEN, pin)
    tampered = cluster_info(ca_pem)
    tampered["data"]["kubeconfig"] += "# changed\n"
    with pytest.raises(DiscoveryError, match="does not match"):
        trusted_ca(tampered, TOKEN, pin)
    with pytest.raises(DiscoveryError, match="no kubeconfig"):
        trusted_ca({"data": {}}, TOKEN, pin)


def test_csr_is_the_kubelets():
    request = new_key_and_request("system:node:edge-1", "system:nodes")
    csr = x509.load_pem_x509_csr(request.csr_pem)
    assert csr.is_signature_valid
    assert csr.subject.rfc4514_string() == "CN=system:node:edge-1,O=system:nodes"
    key = serialization.load_pem_private_key(request.key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert key.public_key() == csr.public_key()
    obj = csr_object("csr-", request.csr_pem, CLIENT_SIGNER, CLIENT_USAGES)
    assert obj["metadata"] == {"generateName": "csr-"}
    assert obj["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
    assert obj["spec"]["usages"] == ["digital signature", "key encipherment", "client auth"]
    assert base64.b64decode(obj["spec"]["request"]) == request.csr_pem


def test_serving_csr_carries_the_addresses():
    request = new_key_and_request("system:node:edge-1", "system:nodes", dns_names=("edge-1",),
                                  ip_addresses=("10.0.0.7",))
    sans = x509.load_pem_x509_csr(request.csr_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert sans.value.get_values_for_type(x509.DNSName) == ["edge-1"]
    assert [str(ip) for ip in sans.value.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]


@pytest.mark.parametrize("status, outcome", [
    ({}, ("pending", "")),
    ({"conditions": [{"type": "Approved", "status": "True"}]}, ("pending", "")),
    ({"conditions": [{"type": "Approved", "status": "True"}], "certificate": "Q0VSVA=="}, ("issued", "Q0VSVA==")),
    ({"conditions": [{"type": "Denied", "status": "True", "message": "no"}]}, ("denied", "no")),
    ({"conditions": [{"type": "Failed", "status": "True", "reason": "SignerValidationFailure"}]},
     ("failed", "SignerValidationFailure")),
])
def test_csr_outcome(status, outcome):
    assert csr_outcome({"status": status}) == outcome


def test_rotation_deadline_lies_in_70_to_90_percent_of_the_life():
    rng = random.Random(7)
    deadlines = [rotation_deadline(1000.0, 2000.0, rng) for _ in range(500)]
    assert all(1700.0 <= d <= 1900.0 for d in deadlines)
    assert max(deadlines) - min(deadlines) > 150  # spread over the window, not one point


def test_stored_credentials_split_back_into_key_and_certificate():
    now = datetime.datetime.now(datetime.UTC)
    cert_pem, key = make_cert(now - datetime.timedelta(minutes=1), now + datetime.timedelta(hours=1))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    stored = Credentials(key_pem, cert_pem, first_certificate(cert_pem)).pem
    loaded = Credentials.from_pem(stored)
    assert (loaded.key_pem, loaded.cert_pem) == (key_pem, cert_pem)
    assert loaded.valid(now.timestamp()) and not loaded.valid((now + datetime.timedelta(hours=2)).timestamp())
    # A clock behind (booted without RTC, before NTP) does not throw a good certificate away.
    assert loaded.valid((now - datetime.timedelta(days=365 * 50)).timestamp())
    with pytest.raises(CertificateError, match="no private key"):
        Credentials.from_pem(cert_pem)


JOIN = {"server": "https://10.0.0.1:6443", "bootstrap_token": "abcdef.0123456789abcdef"}


@pytest.mark.parametrize("cluster, key, problem", [
    ({**JOIN}, "cluster.ca_file", "exactly one of ca_file or ca_cert_hash"),
    ({**JOIN, "ca_file": "/ca", "ca_cert_hash": "sha256:" + "a" * 64}, "cluster.ca_file", "exactly one"),
    ({"bootstrap_token": JOIN["bootstrap_token"], "ca_file": "/ca"}, "cluster.server", "required"),
    ({**JOIN, "server": "http://10.0.0.1:6443", "ca_file": "/ca"}, "cluster.server", "https://"),
    ({**JOIN, "bootstrap_token": "short.token", "ca_file": "/ca"}, "cluster.bootstrap_token", "bootstrap token"),
    ({**JOIN, "ca_cert_hash": "abc"}, "cluster.ca_cert_hash", "sha256:"),
    ({**JOIN, "ca_file": "/ca", "kubeconfig": "/k"}, "cluster.bootstrap_token", "not both"),
    ({"kubeconfig": "/k", "server": "https://10.0.0.1:6443"}, "cluster.server", "bootstrap token join"),
])
def test_join_settings_are_checked(cluster, key, problem):
    with pytest.raises(ConfigError) as error:
        parse_config({"node_name": "n", "cluster": cluster})
    assert error.value.key == key and problem in error.value.message


def test_the_token_is_never_shown():
    config = parse_config({"node_name": "n", "cluster": {**JOIN, "ca_cert_hash": "sha256:" + "a" * 64}})
    assert config.cluster.bootstrap_token == JOIN["bootstrap_token"]
    assert JOIN["bootstrap_token"].split(".")[1] not in format_effective(config)
    assert JOIN["bootstrap_token"].split(".")[1] not in repr(config)


def _join(**cluster):
    return parse_config({"node_name": "edge-1", "cluster": {**JOIN, **cluster}}).cluster


def test_manager_refuses_an_unreadable_ca_file_before_touching_root_dir(tmp_path):
    from edgelet.bootstrap.manager import ClientCertificateManager

    with pytest.raises(ConfigError) as error:
        ClientCertificateManager(_join(ca_file=str(tmp_path / "missing.crt")), "edge-1", str(tmp_path / "pki"))
    assert "cluster.ca_file" in str(error.value) and not (tmp_path / "pki").exists()
    (tmp_path / "junk.crt").write_text("not a certificate")
    with pytest.raises(ConfigError, match="not a PEM certificate"):
        ClientCertificateManager(_join(ca_file=str(tmp_path / "junk.crt")), "edge-1", str(tmp_path / "pki"))


def test_manager_uses_a_stored_certificate_until_it_ends(tmp_path):
    from edgelet.bootstrap.manager import CLIENT_KEY, ClientCertificateManager
    from edgelet.util.checkpoint import CheckpointStore

    now = datetime.datetime.now(datetime.UTC)
    ca_pem, _ = make_cert(now - datetime.timedelta(days=1), now + datetime.timedelta(days=1))
    (tmp_path / "ca.crt").write_bytes(ca_pem)
    cert_pem, key = make_cert(now - datetime.timedelta(hours=1), now + datetime.timedelta(hours=1))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    CheckpointStore(tmp_path / "pki", kind="pki").write(CLIENT_KEY, key_pem + cert_pem)
    clock = [now.timestamp()]
    manager = ClientCertificateManager(_join(ca_file=str(tmp_path / "ca.crt")), "edge-1", str(tmp_path / "pki"),
                                       clock=lambda: clock[0], rng=random.Random(1))
    assert manager.valid() and manager.tls_context() is not None
    life = first_certificate(cert_pem)
    assert life.not_before + 0.7 * life.lifetime <= manager._deadline <= life.not_before + 0.9 * life.lifetime
    clock[0] = life.not_after + 1
    assert not manager.valid()


def test_manager_discovers_again_when_the_stored_ca_has_another_pin(tmp_path):
    from edgelet.bootstrap.manager import CA_KEY, CLIENT_KEY, ClientCertificateManager
    from edgelet.util.checkpoint import CheckpointStore

    now = datetime.datetime.now(datetime.UTC)
    ca_pem, _ = make_cert(now, now + datetime.timedelta(days=1))
    cert_pem, key = make_cert(now - datetime.timedelta(hours=1), now + datetime.timedelta(hours=1))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    store = CheckpointStore(tmp_path / "pki", kind="pki")
    store.write(CA_KEY, ca_pem)
    store.write(CLIENT_KEY, key_pem + cert_pem)
    pin = spki_hash(first_certificate(ca_pem).spki_der)
    same = ClientCertificateManager(_join(ca_cert_hash=pin), "edge-1", str(tmp_path / "pki"))
    assert same.ca_pem == ca_pem and same.valid()
    other = "sha256:" + "1" * 64
    moved = ClientCertificateManager(_join(ca_cert_hash=other), "edge-1", str(tmp_path / "pki"))
    # The stored certificate is the old cluster's: no credentials until the new CA is discovered (an agent
    # pointed at another cluster once started its API work at once, and crashed on the unknown CA).
    assert moved.ca_pem is None and not moved.valid()


def test_manager_keeps_a_stored_bundle_whose_second_certificate_is_pinned(tmp_path):
    from edgelet.bootstrap.manager import CA_KEY, ClientCertificateManager
    from edgelet.util.checkpoint import CheckpointStore

    now = datetime.datetime.now(datetime.UTC)
    old, new = (make_cert(now, now + datetime.timedelta(days=1))[0] for _ in range(2))
    CheckpointStore(tmp_path / "pki", kind="pki").write(CA_KEY, old + new)
    pin = spki_hash(first_certificate(new).spki_der)
    assert ClientCertificateManager(_join(ca_cert_hash=pin), "edge-1", str(tmp_path / "pki")).ca_pem == old + new


def test_run_and_check_config_read_the_ca_file_of_a_token_join(tmp_path):
    from edgelet.cli.main import check_referenced_files

    config = parse_config({"node_name": "n", "cluster": {**JOIN, "ca_file": str(tmp_path / "ca.crt")}})
    with pytest.raises(ConfigError, match="cluster.ca_file"):
        check_referenced_files(config)
    now = datetime.datetime.now(datetime.UTC)
    (tmp_path / "ca.crt").write_bytes(make_cert(now, now + datetime.timedelta(days=1))[0])
    check_referenced_files(config)
    check_referenced_files(parse_config({"node_name": "n", "cluster": {**JOIN, "ca_cert_hash": "sha256:" + "a" * 64}}))
