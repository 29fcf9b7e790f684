"""Credential provider plugins and the node's docker config (edgelet.images.credentialprovider, .nodeauth):
matchImages as the kubelet matches them, the config's and the answer's checks, the cache by cacheKeyType and
duration, one run for concurrent pulls, and no credential in any log line (pure units: a fake plugin runner and
clock; tests/integration/test_credential_provider_plugin.py runs a real plugin)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os

import pytest

from edgelet.images import credentialprovider as cp
from edgelet.images import nodeauth


@pytest.mark.parametrize(
    ("glob", "image", "matches"),
    [
        # The kubelet's documented examples.
        ("*.kubernetes.io", "abcde.kubernetes.io", True),
        ("*.*.kubernetes.io", "abcde.xyz.kubernetes.io", True),
        ("*.kubernetes.io", "kubernetes.io", False),  # one glob is one label
        ("*.kubernetes.io", "a.b.kubernetes.io", False),
        ("kubernetes.*", "kubernetes.io", True),
        ("app*.k8s.io", "app1.k8s.io", True),
        ("app*.k8s.io", "other.k8s.io", False),
        ("*.dkr.ecr.*.amazonaws.com", "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/app", True),
        ("*.dkr.ecr.*.amazonaws.com", "123456789012.dkr.ecr.us-east-1.amazonaws.com.cn/team/app", False),
        # Ports: equal or both absent.
        ("registry.io:8080", "registry.io:8080/path", True),
        ("registry.io:8080", "registry.io/path", False),
        ("registry.io", "registry.io:8080/path", False),
        ("127.0.0.1:5000", "127.0.0.1:5000/edgelet-test/app", True),
        # Paths: a prefix of the image's, as a string (the kubelet's strings.HasPrefix).
        ("registry.io/team", "registry.io/team/app", True),
        ("registry.io/team", "registry.io/teammate/app", True),
        ("registry.io/team/app", "registry.io/team", False),
        ("registry.io/other", "registry.io/team/app", False),
    ],
)
def test_match_images_as_the_kubelet(glob, image, matches):
    assert cp.url_matches(glob, image) is matches


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [("", "must not be empty"), ("https://r.io", "scheme"), ("r.io:*", "port"), ("r.io:80a", "port"),
     ("r.io/team/*", "path"), (":5000", "no host")],
)
def test_match_image_patterns_are_checked(pattern, problem):
    assert problem in cp.match_image_error(pattern)


@pytest.fixture
def bin_dir(tmp_path):
    plugin = tmp_path / "bin" / "acme-credential-provider"
    plugin.parent.mkdir()
    plugin.write_text("#!/bin/sh\n")
    plugin.chmod(0o755)
    return str(plugin.parent)


def config(*providers: dict) -> str:
    return json.dumps({"apiVersion": "kubelet.config.k8s.io/v1", "kind": "CredentialProviderConfig",
                       "providers": list(providers)})


def provider(**fields) -> dict:
    return {"name": "acme-credential-provider", "matchImages": ["*.acme.io"], "defaultCacheDuration": "10m",
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1", **fields}


def test_provider_config_in_yaml_with_args_and_env(bin_dir):
    text = """\
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: acme-credential-provider
    matchImages: ["*.acme.io", "registry.local:5000/team"]
    defaultCacheDuration: 12h
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [get-credentials, --region=eu]
    env:
      - name: ACME_TOKEN
        value: sekrit-token
"""
    (found,) = cp.parse_provider_config(text, bin_dir)
    assert found.executable == os.path.join(bin_dir, "acme-credential-provider")
    assert found.match_images == ("*.acme.io", "registry.local:5000/team")
    assert (found.default_cache_duration, found.args) == (43200.0, ("get-credentials", "--region=eu"))
    assert dict(found.env) == {"ACME_TOKEN": "sekrit-token"}
    assert "sekrit-token" not in repr(found)
    assert found.matches("registry.local:5000/team/app") and not found.matches("registry.local/team/app")


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        (json.dumps({"apiVersion": "kubelet.config.k8s.io/v1", "kind": "Other", "providers": []}), "kind"),
        (json.dumps({"apiVersion": "v1", "kind": "CredentialProviderConfig"}), "apiVersion"),
        (config(), "providers: at least one"),
        (config(provider(matchImages=[])), "providers[0].matchImages: must not be empty"),
        (config(provider(matchImages=["r.io/*"])), "providers[0].matchImages[0]"),
        (config(provider(defaultCacheDuration="soon")), "providers[0].defaultCacheDuration"),
        (config(provider(apiVersion="credentialprovider.kubelet.k8s.io/v1alpha1")), "providers[0].apiVersion"),
        (config(provider(name="../x")), "providers[0].name"),
        (config(provider(name="missing")), "no executable"),
        (config(provider(), provider()), "providers[1].name: 'acme-credential-provider' is listed twice"),
        (config(provider(env=[{"value": "x"}])), "providers[0].env[0].name"),
        (config(provider(args=[1])), "providers[0].args[0]"),
        (config(provider(colour="red")), "unknown field 'colour'"),
        (config(provider(tokenAttributes={})), "tokenAttributes"),
        ("{", "not YAML or JSON"),
    ],
)
def test_provider_config_errors_name_the_field(bin_dir, document, problem):
    with pytest.raises(ValueError) as caught:
        cp.parse_provider_config(document, bin_dir)
    assert problem in str(caught.value)


def test_load_provider_config_names_the_file(tmp_path, bin_dir):
    path = tmp_path / "providers.yaml"
    path.write_text(config(provider(matchImages=[])))
    with pytest.raises(cp.ProviderConfigError) as caught:
        cp.load_provider_config(str(path), bin_dir)
    assert str(caught.value).startswith(f"{path}: providers[0].matchImages")


def answer(key_type="Image", duration=None, auth=None) -> bytes:
    body = {"apiVersion": "credentialprovider.kubelet.k8s.io/v1", "kind": "CredentialProviderResponse",
            "cacheKeyType": key_type,
            "auth": auth if auth is not None else {"*.acme.io": {"username": "robot", "password": "pa55word"}}}
    if duration is not None:
        body["cacheDuration"] = duration
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("output", "problem"),
    [(b"not json", "not JSON"), (b"[]", "not a JSON object"), (answer(key_type="Pod"), "cacheKeyType"),
     (answer(duration="x"), "cacheDuration"), (answer(auth=[]), "auth: expected an object"),
     (json.dumps({"kind": "CredentialProviderResponse", "apiVersion": "v0"}).encode(), "expected kind")],
)
def test_bad_answers_are_refused_without_quoting_them(output, problem):
    with pytest.raises(ValueError) as caught:
        cp.parse_response(output, cp.PLUGIN_API_VERSION)
    assert problem in str(caught.value)
    assert "pa55word" not in str(caught.value)


class Plugin:
    """A fake plugin runner: counts runs per image and answers as told."""

    def __init__(self, output: bytes, gate: asyncio.Event | None = None):
        self.output = output
        self.gate = gate
        self.runs: list[str] = []

    async def __call__(self, provider: cp.Provider, image: str) -> bytes:
        self.runs.append(image)
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(self.output, Exception):
            raise self.output
        return self.output


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def keyring(plugin: Plugin, clock: Clock, *, default: float = 600.0, matches=("*.acme.io",)) -> cp.ProviderKeyring:
    acme = cp.Provider("acme", "/bin/true", tuple(matches), default)
    return cp.ProviderKeyring([acme], runner=plugin, clock=clock)


ROBOT = {"username": "robot", "password": "pa55word"}


@pytest.mark.parametrize(
    ("key_type", "second_image", "runs"),
    [
        ("Image", "eu.acme.io/team/app:2", 1),  # same repository, another tag: cached
        ("Image", "eu.acme.io/team/other:1", 2),  # another image
        ("Registry", "eu.acme.io/team/other:1", 1),  # same registry
        ("Registry", "us.acme.io/team/app:1", 2),  # another registry
        ("Global", "us.acme.io/team/app:1", 1),  # anything
    ],
)
async def test_answers_are_kept_per_cache_key_type(key_type, second_image, runs):
    plugin, clock = Plugin(answer(key_type)), Clock()
    ring = keyring(plugin, clock)
    assert await ring.lookup("eu.acme.io/team/app:1") == [ROBOT]
    assert await ring.lookup(second_image) == [ROBOT]
    assert len(plugin.runs) == runs
    assert plugin.runs[0] == "eu.acme.io/team/app"  # the repository, as the kubelet asks


@pytest.mark.parametrize(("duration", "default", "kept"), [(None, 600.0, 600.0), ("30s", 600.0, 30.0),
                                                            ("0s", 600.0, 0.0), (None, 0.0, 0.0)])
async def test_an_answer_is_kept_for_its_duration_else_the_default(duration, default, kept):
    plugin, clock = Plugin(answer("Global", duration)), Clock()
    ring = keyring(plugin, clock, default=default)
    await ring.lookup("eu.acme.io/app")
    clock.now += kept - 1 if kept else 0
    await ring.lookup("eu.acme.io/app")
    assert len(plugin.runs) == (1 if kept else 2)
    clock.now += 2
    await ring.lookup("eu.acme.io/app")
    assert len(plugin.runs) == (2 if kept else 3)


async def test_images_the_provider_does_not_match_never_run_it_and_auth_keys_are_matched():
    plugin, clock = Plugin(answer(auth={"eu.acme.io/team": ROBOT,
                                        "other.io": {"username": "x", "password": "y"}})), Clock()
    ring = keyring(plugin, clock)
    assert await ring.lookup("docker.io/library/busybox:1") == []
    assert plugin.runs == []
    assert await ring.lookup("eu.acme.io/team/app") == [ROBOT]
    assert await ring.lookup("eu.acme.io/elsewhere/app") == []


async def test_concurrent_pulls_wait_for_one_run():
    gate = asyncio.Event()
    plugin, clock = Plugin(answer(), gate), Clock()
    ring = keyring(plugin, clock)
    lookups = [asyncio.ensure_future(ring.lookup("eu.acme.io/app:1")) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*lookups) == [[ROBOT]] * 5
    assert len(plugin.runs) == 1


async def test_a_failing_plugin_gives_no_credentials_and_is_asked_again(caplog):
    plugin, clock = Plugin(cp.ProviderError("credential provider acme exited with status 1: denied")), Clock()
    ring = keyring(plugin, clock)
    with caplog.at_level(logging.WARNING):
        assert await ring.lookup("eu.acme.io/app") == []
    assert "exited with status 1: denied" in caplog.text
    plugin.output = answer()
    assert await ring.lookup("eu.acme.io/app") == [ROBOT]


async def test_no_credential_reaches_a_log_line(tmp_path, caplog):
    """The whole path at debug level, a real plugin process included: neither the password, nor the plugin's
    env value, nor the docker config's appear in any record."""
    plugin = tmp_path / "acme"
    plugin.write_text("#!/bin/sh\ncat >/dev/null\nprintf '%s' \"$ANSWER\"\n")
    plugin.chmod(0o755)
    acme = cp.Provider("acme", str(plugin), ("*.acme.io",), 600.0,
                       env={"ANSWER": answer().decode(), "ACME_TOKEN": "env-s3cret"})
    docker_config = tmp_path / "config.json"
    encoded = base64.b64encode(b"dock:docker-s3cret").decode()
    docker_config.write_text(json.dumps({"auths": {"eu.acme.io": {"auth": encoded}}}))
    ring = nodeauth.NodeKeyring(nodeauth.DockerConfigKeyring(nodeauth.docker_config_file(str(docker_config))),
                                cp.ProviderKeyring([acme]))
    with caplog.at_level(logging.DEBUG):
        found = await ring.lookup("eu.acme.io/team/app:1")
        failing = cp.ProviderKeyring([cp.Provider("acme", "/bin/false", ("*.acme.io",), 0.0,
                                                  env={"ACME_TOKEN": "env-s3cret"})])
        assert await failing.lookup("eu.acme.io/team/app:1") == []
    assert found == [ROBOT, {"username": "dock", "password": "docker-s3cret"}]
    assert caplog.records, "the path logs something"
    for secret in ("pa55word", "env-s3cret", "docker-s3cret", encoded):
        assert secret not in caplog.text


def test_docker_config_search_order_is_the_kubelets():
    assert nodeauth.docker_config_candidates("/var/lib/edgelet", "/root", "/srv") == [
        ("/var/lib/edgelet/config.json", True), ("/srv/config.json", True), ("/root/.docker/config.json", True),
        ("/.docker/config.json", True), ("/var/lib/edgelet/.dockercfg", False), ("/srv/.dockercfg", False),
        ("/root/.dockercfg", False), ("/.dockercfg", False)]
    assert nodeauth.docker_config_file("/etc/edgelet/.dockercfg") == [("/etc/edgelet/.dockercfg", False)]


def test_docker_config_first_readable_file_wins_and_changes_are_read(tmp_path, caplog):
    broken, good = tmp_path / "a" / "config.json", tmp_path / "b" / ".dockercfg"
    broken.parent.mkdir()
    good.parent.mkdir()
    broken.write_text("{not json")
    good.write_text(json.dumps({"https://eu.acme.io/v1/": {"username": "u1", "password": "p1"}}))
    ring = nodeauth.DockerConfigKeyring([(str(broken), True), (str(good), False)])
    with caplog.at_level(logging.WARNING):
        assert ring.lookup("eu.acme.io/app") == [{"username": "u1", "password": "p1"}]
    assert f"{broken}: not JSON" in caplog.text
    broken.write_text(json.dumps({"auths": {"eu.acme.io": {"username": "u2", "password": "p2-longer"}}}))
    assert ring.lookup("eu.acme.io/app") == [{"username": "u2", "password": "p2-longer"}]
    assert ring.lookup("us.acme.io/app") == []


def test_run_and_check_config_refuse_a_provider_config_they_cannot_use(tmp_path, bin_dir, capsys):
    from edgelet.cli.main import load_checked_config

    providers = tmp_path / "providers.json"
    providers.write_text(config(provider(matchImages=["r.io/*"])))
    path = tmp_path / "edgelet.toml"
    path.write_text(f'node_name = "n"\n[images]\ncredential_provider_config = "{providers}"\n'
                    f'credential_provider_bin_dir = "{bin_dir}"\n')
    assert load_checked_config(str(path)) is None
    assert capsys.readouterr().err.strip() == (
        f"edgelet: invalid config: {providers}: providers[0].matchImages[0]: 'r.io/*': globs are allowed only in "
        "host labels, not in the path")
    providers.write_text(config(provider()))
    assert load_checked_config(str(path)).images.credential_provider_config == str(providers)
