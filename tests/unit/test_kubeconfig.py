"""Kubeconfig parsing: context resolution, credentials, TLS material and errors that name the field."""

from __future__ import annotations

import base64
import logging
import ssl

import pytest

from edgelet.kubeapi.client import ApiClient, BearerAuth
from edgelet.kubeapi.kubeconfig import KubeConfig, KubeconfigError, load_kubeconfig, parse_kubeconfig, ssl_context
from tests.kubeapi_double.testcerts import OTHER_KEY, TEST_CERT, TEST_KEY

SECRET_TOKEN = "s3cr3t-token-value-0123456789"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def kubeconfig(cluster: dict | None = None, user: dict | None = None, *, context: dict | None = None,
               current: str | None = "edge") -> dict:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "prod", "cluster": {"server": "https://10.0.0.1:6443", **(cluster or {})}}],
        "users": [{"name": "edge-user", "user": user or {}}],
        "contexts": [{"name": "edge", "context": context or {"cluster": "prod", "user": "edge-user"}}],
    }
    if current is not None:
        doc["current-context"] = current
    return doc


PATH = "/etc/edgelet/kubeconfig"


@pytest.mark.parametrize(
    "doc, expected",
    [
        (kubeconfig(user={"token": SECRET_TOKEN}), {"server": "https://10.0.0.1:6443", "token": SECRET_TOKEN}),
        (kubeconfig({"server": "http://127.0.0.1:8080/"}), {"server": "http://127.0.0.1:8080", "token": None}),
        (kubeconfig({"insecure-skip-tls-verify": True}), {"insecure_skip_tls_verify": True}),
        (kubeconfig({"certificate-authority": "ca.crt"}), {"ca_file": "/etc/edgelet/ca.crt"}),
        (kubeconfig({"certificate-authority": "/pki/ca.crt"}), {"ca_file": "/pki/ca.crt"}),
        (kubeconfig({"certificate-authority-data": b64(TEST_CERT)}), {"ca_data": TEST_CERT.encode()}),
        (kubeconfig(user={"tokenFile": "token"}), {"token_file": "/etc/edgelet/token", "token": None}),
        (kubeconfig(user={"tokenFile": "token", "token": SECRET_TOKEN}), {"token_file": None, "token": SECRET_TOKEN}),
        (
            kubeconfig(user={"client-certificate-data": b64(TEST_CERT), "client-key-data": b64(TEST_KEY)}),
            {"client_cert_data": TEST_CERT.encode(), "client_key_data": TEST_KEY.encode()},
        ),
        (
            kubeconfig(user={"client-certificate": "c.pem", "client-key": "/k.pem"}),
            {"client_cert_file": "/etc/edgelet/c.pem", "client_key_file": "/k.pem"},
        ),
    ],
)
def test_parse_resolves_the_current_context(doc: dict, expected: dict) -> None:
    config = parse_kubeconfig(doc, PATH)
    assert config.context == "edge"
    for field, value in expected.items():
        assert getattr(config, field) == value, field


def test_an_explicit_context_wins_over_current_context() -> None:
    doc = kubeconfig()
    doc["clusters"].append({"name": "lab", "cluster": {"server": "https://lab:6443"}})
    doc["contexts"].append({"name": "lab", "context": {"cluster": "lab"}})
    assert parse_kubeconfig(doc, PATH, context="lab").server == "https://lab:6443"


@pytest.mark.parametrize(
    "doc, field, words",
    [
        ("just text", "", "not a kubeconfig"),
        (kubeconfig(current=None), "current-context", "not set"),
        (kubeconfig(current="nope"), "contexts[name=nope]", "no entry"),
        (kubeconfig(context={"user": "edge-user"}), "contexts[name=edge].context.cluster", "missing"),
        (kubeconfig(context={"cluster": "gone"}), "clusters[name=gone]", "no entry"),
        (kubeconfig({"server": "10.0.0.1:6443"}), "clusters[name=prod].cluster.server", "http:// or https://"),
        (kubeconfig({"insecure-skip-tls-verify": "yes"}), "clusters[name=prod].cluster.insecure-skip-tls-verify",
         "true or false"),
        (kubeconfig({"certificate-authority-data": "not base64!"}),
         "clusters[name=prod].cluster.certificate-authority-data", "base64"),
        (kubeconfig(user={"token": ""}), "users[name=edge-user].user.token", "non-empty string"),
        (kubeconfig(user={"token": 42}), "users[name=edge-user].user.token", "non-empty string"),
        (kubeconfig(user={"client-certificate-data": b64(TEST_CERT)}), "users[name=edge-user].user.client-key",
         "missing"),
        (kubeconfig(user={"client-key": "k.pem"}), "users[name=edge-user].user.client-certificate", "missing"),
        (kubeconfig(user={"client-key-data": "%%%", "client-certificate": "c"}),
         "users[name=edge-user].user.client-key-data", "base64"),
        (kubeconfig(user={"exec": {"command": "aws"}}), "users[name=edge-user].user.exec", "not supported"),
    ],
)
def test_errors_name_the_file_and_the_field(doc: object, field: str, words: str) -> None:
    with pytest.raises(KubeconfigError) as caught:
        parse_kubeconfig(doc, PATH)
    assert caught.value.path == PATH
    assert caught.value.key.startswith(field)
    assert words in str(caught.value)
    assert str(caught.value).startswith(PATH)


def test_secrets_never_show_in_repr_str_or_errors(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_kubeconfig(kubeconfig(user={"token": SECRET_TOKEN, "client-certificate-data": b64(TEST_CERT),
                                               "client-key-data": b64(TEST_KEY)}), PATH)
    key_body = TEST_KEY.splitlines()[1]
    for text in (repr(config), str(config), repr(BearerAuth(SECRET_TOKEN)),
                 repr(ApiClient("https://x", token=SECRET_TOKEN))):
        assert SECRET_TOKEN not in text
        assert key_body not in text
    assert "token=<redacted>" in repr(config)
    # A key that does not match the certificate: the error names the field, not the key.
    bad = parse_kubeconfig(kubeconfig(user={"client-certificate-data": b64(TEST_CERT),
                                            "client-key-data": b64(OTHER_KEY)}), PATH)
    with caplog.at_level(logging.DEBUG), pytest.raises(KubeconfigError) as caught:
        ssl_context(bad)
    assert "client-certificate" in caught.value.key
    assert OTHER_KEY.splitlines()[1] not in str(caught.value) + caplog.text


def test_inline_client_certificate_loads_into_the_tls_context() -> None:
    config = parse_kubeconfig(
        kubeconfig({"certificate-authority-data": b64(TEST_CERT)},
                   {"client-certificate-data": b64(TEST_CERT), "client-key-data": b64(TEST_KEY)}),
        PATH,
    )
    ctx = ssl_context(config)
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "edgelet-test-client"),),)]


def test_insecure_skip_tls_verify_disables_verification_and_http_needs_no_tls() -> None:
    insecure = ssl_context(parse_kubeconfig(kubeconfig({"insecure-skip-tls-verify": True}), PATH))
    assert insecure is not None and insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    assert ssl_context(parse_kubeconfig(kubeconfig({"server": "http://127.0.0.1:1"}), PATH)) is None
    verified = ssl_context(parse_kubeconfig(kubeconfig(), PATH))
    assert verified is not None and verified.verify_mode == ssl.CERT_REQUIRED


def test_bad_ca_data_is_reported_on_its_field() -> None:
    config = parse_kubeconfig(kubeconfig({"certificate-authority-data": b64("not a certificate")}), PATH)
    with pytest.raises(KubeconfigError) as caught:
        ssl_context(config)
    assert caught.value.key == "clusters[name=prod].cluster.certificate-authority-data"


def test_load_reads_files_relative_to_the_kubeconfig(tmp_path) -> None:
    import yaml

    (tmp_path / "token").write_text(SECRET_TOKEN + "\n")
    (tmp_path / "client.crt").write_text(TEST_CERT)
    (tmp_path / "client.key").write_text(TEST_KEY)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(user={"tokenFile": "token", "client-certificate": "client.crt",
                                                    "client-key": "client.key"})))
    config = load_kubeconfig(str(path))
    assert isinstance(config, KubeConfig)
    assert config.token == SECRET_TOKEN
    assert config.client_key_file == str(tmp_path / "client.key")
    assert ssl_context(config) is not None


@pytest.mark.parametrize(
    "content, field, words",
    [
        (None, "", "cannot read"),
        ("clusters: [unclosed", "", "not valid YAML"),
        ("MISSING_TOKEN", "users[name=edge-user].user.tokenFile", "cannot read token file"),
    ],
)
def test_load_errors_name_the_file(tmp_path, content: str | None, field: str, words: str) -> None:
    import yaml

    path = tmp_path / "kubeconfig"
    if content == "MISSING_TOKEN":
        path.write_text(yaml.safe_dump(kubeconfig(user={"tokenFile": "absent"})))
    elif content is not None:
        path.write_text(content)
    with pytest.raises(KubeconfigError) as caught:
        load_kubeconfig(str(path))
    assert caught.value.path == str(path)
    assert caught.value.key == field
    assert words in str(caught.value)
