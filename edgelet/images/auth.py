"""Registry credentials from a pod's image pull secrets, matched to an image the way the kubelet's keyring does.

Secrets are Kubernetes JSON dicts of type `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`
holding `{"auths": {...}}`) or `kubernetes.io/dockercfg` (`.dockercfg` holding the map itself). A
key is a registry location: `host`, `host:port`, `host/path/prefix`, optionally with a scheme and
a `/v1/` or `/v2/` suffix; host labels may use `*` wildcards (`*.example.com`). docker.io,
index.docker.io and registry-1.docker.io name the same registry.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from edgelet.images import reference

log = logging.getLogger(__name__)

DOCKER_CONFIG_JSON_TYPE = "kubernetes.io/dockerconfigjson"
DOCKER_CONFIG_JSON_KEY = ".dockerconfigjson"
DOCKERCFG_TYPE = "kubernetes.io/dockercfg"
DOCKERCFG_KEY = ".dockercfg"

DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

# The fields of CRI's AuthConfig a credential fills (server_address stays unset: containerd 1.6
# rejects a bare host:port there, and the kubelet leaves it empty too).
AuthFields = dict[str, str]


@dataclass(frozen=True, slots=True)
class RegistryKey:
    """A parsed location key of a docker config: host labels may hold globs, path is a prefix."""

    host: str
    port: str
    path: tuple[str, ...]

    @property
    def specificity(self) -> tuple[int, int]:
        """Sort key: longer path prefixes first, then fewer wildcards."""
        return (-len(self.path), self.host.count("*"))


def parse_registry_key(location: str) -> RegistryKey | None:
    """`https://host:port/v1/path/` -> RegistryKey; None when the location has no host."""
    text = location.strip()
    for scheme in ("https://", "http://"):
        if text.lower().startswith(scheme):
            text = text[len(scheme) :]
            break
    hostport, _, path = text.partition("/")
    segments = [segment for segment in path.split("/") if segment]
    # The Docker client treats /v1/ and /v2/ as the registry root.
    if segments and segments[0] in ("v1", "v2"):
        segments = segments[1:]
    host, port = _split_port(hostport.lower())
    if not host:
        return None
    if host in DOCKER_HUB_ALIASES:
        host = reference.DEFAULT_DOMAIN
    return RegistryKey(host, port, tuple(segments))


def _split_port(hostport: str) -> tuple[str, str]:
    if hostport.startswith("["):
        host, _, rest = hostport.partition("]")
        return host + "]", rest.removeprefix(":")
    host, _, port = hostport.partition(":")
    return host, port


def key_matches(key: RegistryKey, ref: reference.ImageReference) -> bool:
    """Host labels match one by one (globs allowed), ports are equal, the key's path prefixes the image's."""
    host, port = _split_port(ref.domain.lower())
    key_labels, host_labels = key.host.split("."), host.split(".")
    if len(key_labels) != len(host_labels):
        return False
    if not all(fnmatch.fnmatchcase(label, pattern) for pattern, label in zip(key_labels, host_labels)):
        return False
    if key.port != port:
        return False
    return tuple(ref.path.split("/")[: len(key.path)]) == key.path


def _decode(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError(f"{what}: not base64 ({err})") from None


def parse_config_entry(entry: Any, where: str) -> AuthFields:
    """One `auths` entry -> AuthConfig fields; `auth` (base64 "user:password") wins over the plain fields."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected an object")
    fields: AuthFields = {}
    for source, target in (("username", "username"), ("password", "password"), ("identitytoken", "identity_token")):
        value = entry.get(source)
        if isinstance(value, str) and value:
            fields[target] = value
    encoded = entry.get("auth")
    if isinstance(encoded, str) and encoded:
        user, colon, password = _decode(encoded, f"{where}.auth").decode("utf-8", "replace").partition(":")
        if not colon:
            raise ValueError(f"{where}.auth: expected base64 of user:password")
        fields["username"], fields["password"] = user, password
    return fields


def _secret_name(secret: Mapping[str, Any]) -> str:
    metadata = secret.get("metadata") or {}
    return f"secret {metadata.get('namespace') or 'default'}/{metadata.get('name') or '?'}"


def parse_pull_secret(secret: Mapping[str, Any]) -> list[tuple[RegistryKey, AuthFields]]:
    """The (registry key, credential) pairs of one secret. Raises ValueError naming the secret and field."""
    name = _secret_name(secret)
    kind = secret.get("type")
    if kind == DOCKER_CONFIG_JSON_TYPE:
        field, wrapped = DOCKER_CONFIG_JSON_KEY, True
    elif kind == DOCKERCFG_TYPE:
        field, wrapped = DOCKERCFG_KEY, False
    else:
        raise ValueError(f"{name}: type {kind!r} is not {DOCKER_CONFIG_JSON_TYPE} or {DOCKERCFG_TYPE}")
    encoded = (secret.get("data") or {}).get(field)
    if not isinstance(encoded, str):
        raise ValueError(f"{name}: data[{field}] is missing")
    try:
        config = orjson.loads(_decode(encoded, f"{name}: data[{field}]"))
    except orjson.JSONDecodeError as err:
        raise ValueError(f"{name}: data[{field}]: not JSON ({err})") from None
    return parse_auths(config, wrapped, f"{name}: data[{field}]")


def parse_auths(config: Any, wrapped: bool, where: str) -> list[tuple[RegistryKey, AuthFields]]:
    """The (registry key, credential) pairs of a docker config: `{"auths": {...}}` when `wrapped` (config.json),
    else the map itself (.dockercfg). Raises ValueError naming `where` and the registry."""
    auths = config.get("auths") if wrapped and isinstance(config, dict) else config
    if not isinstance(auths, dict):
        under = ' under "auths"' if wrapped else ""
        raise ValueError(f"{where}: expected an object of registries{under}")
    pairs = []
    for location, entry in auths.items():
        key = parse_registry_key(location)
        if key is None:
            raise ValueError(f"{where}: registry {location!r} has no host")
        pairs.append((key, parse_config_entry(entry, f"{where}[{location!r}]")))
    return pairs


def matching_credentials(pairs: Iterable[tuple[RegistryKey, AuthFields]], ref: reference.ImageReference
                         ) -> list[AuthFields]:
    """The credentials of `pairs` whose key matches the image, most specific key first, duplicates dropped."""
    matching = sorted(((key.specificity, index), fields) for index, (key, fields) in enumerate(pairs)
                      if fields and key_matches(key, ref))
    unique: list[AuthFields] = []
    for _, fields in matching:
        if fields not in unique:
            unique.append(fields)
    return unique


def credentials_for(image: str, pull_secrets: Iterable[Mapping[str, Any]]) -> list[AuthFields]:
    """The credentials worth trying for `image`, most specific registry key first, duplicates dropped.

    A secret that cannot be read is logged (naming it and the field) and skipped, so one bad secret
    does not hide the others. An unparseable image gives no credentials.
    """
    try:
        ref = reference.parse(image)
    except reference.InvalidReference:
        return []
    pairs: list[tuple[RegistryKey, AuthFields]] = []
    for secret in pull_secrets:
        try:
            pairs += parse_pull_secret(secret)
        except ValueError as err:
            log.warning("ignoring image pull secret: %s", err)
    return matching_credentials(pairs, ref)
