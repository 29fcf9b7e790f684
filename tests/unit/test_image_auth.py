"""Pull-secret credentials: both secret types, `auth` decoding, and keyring-style registry matching."""

from __future__ import annotations

import base64
import json
import logging

import pytest

from edgelet.images import reference
from edgelet.images.auth import credentials_for, key_matches, parse_pull_secret, parse_registry_key


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def dockerconfigjson(auths: dict, name: str = "regcred") -> dict:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": b64(json.dumps({"auths": auths}))},
    }


def dockercfg(auths: dict, name: str = "legacy") -> dict:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "type": "kubernetes.io/dockercfg",
        "data": {".dockercfg": b64(json.dumps(auths))},
    }


def user(name: str) -> dict:
    return {"username": name, "password": f"{name}-pw"}


@pytest.mark.parametrize(
    ("key", "image", "matches"),
    [
        ("registry.example.com", "registry.example.com/team/app:1", True),
        ("https://registry.example.com/v1/", "registry.example.com/team/app:1", True),
        ("http://registry.example.com/v2/", "registry.example.com/app", True),
        ("registry.example.com", "other.example.com/team/app:1", False),
        ("registry.example.com:5000", "registry.example.com:5000/app", True),
        ("registry.example.com:5000", "registry.example.com/app", False),
        ("registry.example.com", "registry.example.com:5000/app", False),
        ("127.0.0.1:5000", "127.0.0.1:5000/app:1", True),
        ("registry.example.com/team", "registry.example.com/team/app", True),
        ("registry.example.com/team", "registry.example.com/teams/app", False),
        ("registry.example.com/team/app", "registry.example.com/team", False),
        ("*.example.com", "registry.example.com/app", True),
        ("*.example.com", "example.com/app", False),
        ("*.example.com", "a.b.example.com/app", False),
        ("REGISTRY.Example.com", "registry.example.com/app", True),
        # docker.io and its aliases name one registry; short names live there.
        ("docker.io", "busybox", True),
        ("https://index.docker.io/v1/", "busybox:1.36", True),
        ("index.docker.io", "library/busybox", True),
        ("registry-1.docker.io", "myorg/app", True),
        ("index.docker.io/myorg", "myorg/app", True),
        ("index.docker.io/myorg", "otherorg/app", False),
        ("docker.io", "quay.io/org/app", False),
        ("quay.io", "busybox", False),
    ],
)
def test_registry_key_matching(key, image, matches):
    parsed = parse_registry_key(key)
    assert parsed is not None
    assert key_matches(parsed, reference.parse(image)) is matches


def test_both_secret_types_give_the_same_credentials():
    auths = {"registry.example.com": user("alice")}
    assert parse_pull_secret(dockerconfigjson(auths)) == parse_pull_secret(dockercfg(auths))
    assert credentials_for("registry.example.com/app:1", [dockercfg(auths)]) == [
        {"username": "alice", "password": "alice-pw"}
    ]


def test_auth_field_is_base64_user_colon_password_and_wins():
    entry = {"auth": b64("bob:pa:ss"), "username": "ignored", "password": "ignored", "email": "b@example.com"}
    creds = credentials_for("registry.example.com/app", [dockerconfigjson({"registry.example.com": entry})])
    assert creds == [{"username": "bob", "password": "pa:ss"}]


def test_identity_token_is_carried():
    entry = {"identitytoken": "tok123"}
    assert credentials_for("reg.example.com/a", [dockerconfigjson({"reg.example.com": entry})]) == [
        {"identity_token": "tok123"}
    ]


def test_most_specific_key_first_then_secret_order_and_no_duplicates():
    first = dockerconfigjson({"reg.example.com": user("host"), "*.example.com": user("wildcard")})
    second = dockerconfigjson(
        {
            "reg.example.com/team/app": user("repo"),
            "reg.example.com/team": user("team"),
            "reg.example.com": user("host"),
        }
    )
    creds = credentials_for("reg.example.com/team/app:2", [first, second])
    assert [c["username"] for c in creds] == ["repo", "team", "host", "wildcard"]


def test_no_match_gives_nothing():
    assert credentials_for("quay.io/org/app", [dockerconfigjson({"reg.example.com": user("x")})]) == []
    assert credentials_for("reg.example.com/app", []) == []


def raw_secret(data: dict, kind: str = "kubernetes.io/dockerconfigjson") -> dict:
    return {"metadata": {"name": "s"}, "type": kind, "data": data}


@pytest.mark.parametrize(
    ("secret", "complaint"),
    [
        (raw_secret({}, kind="Opaque"), "type 'Opaque'"),
        (raw_secret({}), "data[.dockerconfigjson] is missing"),
        (raw_secret({".dockerconfigjson": "%%%"}), "not base64"),
        (raw_secret({".dockerconfigjson": b64("{")}), "not JSON"),
        (raw_secret({".dockerconfigjson": b64("[]")}), 'under "auths"'),
        (raw_secret({".dockercfg": b64("[]")}, kind="kubernetes.io/dockercfg"), "expected an object of registries"),
        (dockerconfigjson({"reg.example.com": {"auth": b64("no-colon")}}, name="s"), "user:password"),
        (dockerconfigjson({"reg.example.com": "text"}, name="s"), "expected an object"),
    ],
)
def test_bad_secrets_are_named_and_skipped(secret, complaint, caplog):
    good = dockerconfigjson({"reg.example.com": user("good")})
    with caplog.at_level(logging.WARNING):
        creds = credentials_for("reg.example.com/app", [secret, good])
    assert creds == [{"username": "good", "password": "good-pw"}]
    assert "secret default/s" in caplog.text
    assert complaint in caplog.text


def test_invalid_image_gives_no_credentials():
    assert credentials_for("UPPER/case", [dockerconfigjson({"docker.io": user("x")})]) == []
