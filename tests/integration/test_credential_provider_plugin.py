"""A credential provider plugin written here (a shell script: args, env, a request on stdin, a response on stdout)
gives the credentials of the loopback registry that wants authentication: the pulls succeed, the plugin runs once
per cache period, and neither its credentials nor its env reach a log line."""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from edgelet.images import credentialprovider, nodeauth
from edgelet.images.manager import ImageError, ImageManager
from edgelet.util.backoff import Backoff
from tests.integration.registry_harness import AUTH_PASSWORD, AUTH_USER, image_config_id, make_image

pytestmark = pytest.mark.containerd

PLUGIN = """\
#!/bin/sh
# args: --log FILE; env: REGISTRY_USER, REGISTRY_PASSWORD, REGISTRY
[ "$1" = --log ] || { echo "usage: $0 --log FILE" >&2; exit 2; }
request=$(cat)
printf '%s\\n' "$request" >>"$2"
printf '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse",'
printf '"cacheKeyType":"Registry","cacheDuration":"1h",'
printf '"auth":{"%s":{"username":"%s","password":"%s"}}}' "$REGISTRY" "$REGISTRY_USER" "$REGISTRY_PASSWORD"
"""


def provider_config(registry_address: str, log_file: str) -> str:
    host, port = registry_address.split(":")
    return f"""\
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: loopback-credential-provider
    matchImages: ["127.0.0.*:{port}"]
    defaultCacheDuration: 5m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [--log, {log_file}]
    env:
      - {{name: REGISTRY, value: "{registry_address}"}}
      - {{name: REGISTRY_USER, value: {AUTH_USER}}}
      - {{name: REGISTRY_PASSWORD, value: {AUTH_PASSWORD}}}
"""


def pod() -> dict:
    return {"metadata": {"name": "web", "namespace": "default", "uid": str(uuid.uuid4())}}


async def test_a_provider_plugin_gives_the_registry_credentials_once_per_cache_period(
        cri, auth_registry, base_images, tmp_path, caplog):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    plugin = bin_dir / "loopback-credential-provider"
    plugin.write_text(PLUGIN)
    plugin.chmod(0o755)
    requests = tmp_path / "requests.log"
    config = tmp_path / "providers.yaml"
    config.write_text(provider_config(auth_registry.address, str(requests)))

    now = [1000.0]
    providers = credentialprovider.ProviderKeyring(
        credentialprovider.load_provider_config(str(config), str(bin_dir)), clock=lambda: now[0])
    keyring = nodeauth.NodeKeyring(nodeauth.DockerConfigKeyring(nodeauth.docker_config_file(str(tmp_path / "none"))),
                                   providers)
    with_plugin = ImageManager(cri, pull_backoff=Backoff(10, 300), node_keyring=keyring)
    without = ImageManager(cri, pull_backoff=Backoff(10, 300))

    archives = [make_image(base_images, tmp_path / f"{name}.tar") for name in ("a", "b", "c")]
    images = [auth_registry.push(archive, "app", f"edgelet-test/{uuid.uuid4().hex[:12]}:1") for archive in archives]
    try:
        with pytest.raises(ImageError) as anonymous:
            await without.ensure_image(pod(), {"name": "app", "image": images[0]})
        assert anonymous.value.reason == "ErrImagePull"
        with caplog.at_level(logging.DEBUG):
            assert await with_plugin.ensure_image(pod(), {"name": "app", "image": images[0]}) \
                == image_config_id(archives[0])
            # Another repository of the same registry, within the hour: the cached answer serves.
            assert await with_plugin.ensure_image(pod(), {"name": "app", "image": images[1]}) \
                == image_config_id(archives[1])
            assert len(requests.read_text().splitlines()) == 1
            now[0] += 3601  # past cacheDuration: the plugin is asked again
            assert await with_plugin.ensure_image(pod(), {"name": "app", "image": images[2]}) \
                == image_config_id(archives[2])
        asked = [json.loads(line) for line in requests.read_text().splitlines()]
        assert [request["image"] for request in asked] == [images[0].rsplit(":", 1)[0], images[2].rsplit(":", 1)[0]]
        assert asked[0]["kind"] == "CredentialProviderRequest"
        assert asked[0]["apiVersion"] == "credentialprovider.kubelet.k8s.io/v1"
        assert "credential provider loopback-credential-provider answered" in caplog.text
        assert AUTH_PASSWORD not in caplog.text
    finally:
        for archive in archives:
            await cri.remove_image(image_config_id(archive))
