"""The node's own registry credentials, as the kubelet finds them: a docker config.json (or legacy .dockercfg) in
its search path or at a configured place, and the credential provider plugins when configured
(`edgelet.images.credentialprovider`). Pull secrets come first, then these, then an anonymous pull.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Sequence
from typing import Protocol

import orjson

from edgelet.images import auth, reference

log = logging.getLogger(__name__)

# kubelet's search for a node-wide docker config: its root dir, the working directory, $HOME/.docker, /.docker
# (config.json), then the legacy .dockercfg in its root dir, the working directory, $HOME and /.
DOCKER_CONFIG_JSON = "config.json"
DOCKERCFG = ".dockercfg"
MAX_CONFIG_BYTES = 1024 * 1024


def docker_config_candidates(root_dir: str, home: str | None, cwd: str) -> list[tuple[str, bool]]:
    """(path, wrapped in "auths") in the kubelet's search order."""
    homes = [home] if home else []
    json_dirs = [root_dir, cwd, *(os.path.join(h, ".docker") for h in homes), "/.docker"]
    legacy_dirs = [root_dir, cwd, *homes, "/"]
    return ([(os.path.join(d, DOCKER_CONFIG_JSON), True) for d in json_dirs]
            + [(os.path.join(d, DOCKERCFG), False) for d in legacy_dirs])


def docker_config_file(path: str) -> list[tuple[str, bool]]:
    """A configured docker config: a legacy .dockercfg when named so, else a config.json."""
    return [(path, os.path.basename(path) != DOCKERCFG)]


def parse_docker_config(data: bytes, wrapped: bool, where: str) -> list[tuple[auth.RegistryKey, auth.AuthFields]]:
    try:
        config = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ValueError(f"{where}: not JSON") from None
    return auth.parse_auths(config, wrapped, where)


class DockerConfigKeyring:
    """The node's docker config: the first of `candidates` (path, wrapped) that reads, as the kubelet searches;
    read again when any of them changes (a stat each per lookup)."""

    def __init__(self, candidates: Sequence[tuple[str, bool]]):
        self._candidates = list(candidates)
        self._seen: list[tuple[float, int] | None] | None = None
        self._pairs: list[tuple[auth.RegistryKey, auth.AuthFields]] = []

    def _stat(self, path: str) -> tuple[float, int] | None:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        return stat.st_mtime, stat.st_size

    def _load(self) -> None:
        seen = [self._stat(path) for path, _ in self._candidates]
        if seen == self._seen:
            return
        self._seen, self._pairs = seen, []
        for (path, wrapped), stat in zip(self._candidates, seen):
            if stat is None:
                continue
            try:
                with open(path, "rb") as file:
                    self._pairs = parse_docker_config(file.read(MAX_CONFIG_BYTES), wrapped, path)
            except (OSError, ValueError) as err:
                log.warning("ignoring a docker config of the node: %s", err)
                continue
            log.info("registry credentials of the node from %s (%d registries)", path, len(self._pairs))
            return

    def lookup(self, image: str) -> list[auth.AuthFields]:
        self._load()
        try:
            return auth.matching_credentials(self._pairs, reference.parse(image))
        except reference.InvalidReference:
            return []


class Keyring(Protocol):
    def lookup(self, image: str) -> Awaitable[list[auth.AuthFields]]: ...


class NodeKeyring:
    """The node's credentials for an image: the plugins' first, then the docker config's."""

    def __init__(self, docker_config: DockerConfigKeyring, providers: Keyring | None = None):
        self._providers = providers
        self._docker_config = docker_config

    async def lookup(self, image: str) -> list[auth.AuthFields]:
        found = await self._providers.lookup(image) if self._providers is not None else []
        for fields in self._docker_config.lookup(image):
            if fields not in found:
                found.append(fields)
        return found


def node_keyring(*, root_dir: str, docker_config: str = "", provider_config: str = "",
                 provider_bin_dir: str = "") -> NodeKeyring:
    """The node's keyring from its settings ([images] docker_config, credential_provider_config and _bin_dir).
    A provider config that cannot be used raises ProviderConfigError (naming the file and field), as the kubelet
    refuses to start with one."""
    candidates = (docker_config_file(docker_config) if docker_config
                  else docker_config_candidates(root_dir, os.environ.get("HOME"), os.getcwd()))
    providers = None
    if provider_config:
        from edgelet.images import credentialprovider  # nodes without plugins never load it

        providers = credentialprovider.ProviderKeyring(
            credentialprovider.load_provider_config(provider_config, provider_bin_dir))
    return NodeKeyring(DockerConfigKeyring(candidates), providers)
