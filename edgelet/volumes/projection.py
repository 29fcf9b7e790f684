"""The files a configMap, secret, downwardAPI or projected volume must hold (pure): key selection with
items and modes, optional sources, and the kubelet's error messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from edgelet.api import podutil
from edgelet.api.env import metadata_field_value
from edgelet.api.objectstore import InvalidObjectError, configmap_binary_data, configmap_data, secret_data
from edgelet.api.podutil import Pod
from edgelet.api.resources import ResourceError, resource_field_value

from .atomic_writer import FileProjection
from .errors import VolumeError
from .tokens import fs_user, token_file_mode

DEFAULT_MODE = 0o644

Payload = dict[str, FileProjection]


class Store(Protocol):
    def get_configmap(self, namespace: str, name: str) -> dict | None: ...
    def get_secret(self, namespace: str, name: str) -> dict | None: ...
    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...


def _mode(value: Any, where: str) -> int:
    if value is None:
        return DEFAULT_MODE
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise VolumeError(f"{where}: mode must be a number between 0 and 0777 (511), got {value!r}")
    return value


def _key_payload(entries: Mapping[str, bytes], items: list[dict] | None, default_mode: int, optional: bool,
                 missing_key: str) -> Payload:
    """All entries, or only the `items` (key -> path, mode); the kubelet's MakePayload."""
    if not items:
        return {key: FileProjection(value, default_mode) for key, value in entries.items()}
    payload: Payload = {}
    for item in items:
        key = item.get("key", "")
        if key not in entries:
            if optional:
                continue
            raise VolumeError(f"{missing_key}: {key}")
        mode = default_mode if item.get("mode") is None else _mode(item["mode"], f"items[{key}].mode")
        payload[item.get("path") or key] = FileProjection(entries[key], mode)
    return payload


def configmap_payload(pod: Pod, source: dict[str, Any], store: Store | None, default_mode: int) -> Payload:
    """The files of a configMap volume or projected configMap source; a missing optional one is empty."""
    name = source.get("name", "")
    optional = bool(source.get("optional"))
    found = store.get_configmap(podutil.namespace(pod), name) if store is not None else None
    if found is None:
        if not optional:
            raise VolumeError(f'configmap "{name}" not found')
        return {}
    try:
        entries: dict[str, bytes] = {key: value.encode() for key, value in configmap_data(found).items()}
        entries.update(configmap_binary_data(found))
    except InvalidObjectError as exc:
        raise VolumeError(str(exc)) from None
    return _key_payload(entries, source.get("items"), default_mode, optional,
                        "configmap references non-existent config key")


def secret_payload(pod: Pod, name: str, source: dict[str, Any], store: Store | None, default_mode: int) -> Payload:
    """The files of a secret volume (`secretName`) or projected secret source (`name`)."""
    optional = bool(source.get("optional"))
    found = store.get_secret(podutil.namespace(pod), name) if store is not None else None
    if found is None:
        if not optional:
            raise VolumeError(f'secret "{name}" not found')
        return {}
    try:
        entries = secret_data(found)
    except InvalidObjectError as exc:
        raise VolumeError(str(exc)) from None
    return _key_payload(entries, source.get("items"), default_mode, optional,
                        "references non-existent secret key")


def downward_api_payload(pod: Pod, items: list[dict] | None, default_mode: int,
                         node_allocatable: Mapping[str, Any] | None) -> Payload:
    """Pod metadata and container resources as files (the kubelet's downwardapi CollectData)."""
    payload: Payload = {}
    for item in items or []:
        path = item.get("path", "")
        mode = default_mode if item.get("mode") is None else _mode(item["mode"], f"items[{path}].mode")
        try:
            if item.get("fieldRef") is not None:
                value = metadata_field_value(pod, item["fieldRef"].get("fieldPath", ""))
            elif item.get("resourceFieldRef") is not None:
                selector = item["resourceFieldRef"]
                value = resource_field_value(pod, selector.get("containerName", ""), selector, node_allocatable)
            else:
                value = ""
        except (ValueError, ResourceError) as exc:
            raise VolumeError(f"downward API item {path!r}: {exc}") from None
        payload[path] = FileProjection(value.encode(), mode)
    return payload


def token_sources(source: dict[str, Any]) -> list[dict[str, Any]]:
    """The serviceAccountToken sources of a projected volume."""
    return [part["serviceAccountToken"] for part in source.get("sources") or []
            if isinstance(part, dict) and isinstance(part.get("serviceAccountToken"), dict)]


def projected_payload(pod: Pod, source: dict[str, Any], store: Store | None,
                      node_allocatable: Mapping[str, Any] | None, warnings: list[str],
                      tokens: Mapping[str, bytes] | None = None, fs_group: int | None = None) -> Payload:
    """The merged files of a projected volume's sources.

    `tokens` holds the service-account token of each serviceAccountToken source by its path (fetched
    beforehand: that takes the API). clusterTrustBundle and podCertificate sources need API services
    this node agent does not use: they are skipped and reported in `warnings`.
    """
    default_mode = _mode(source.get("defaultMode"), "projected.defaultMode")
    payload: Payload = {}
    for part in source.get("sources") or []:
        if part.get("serviceAccountToken") is not None:
            path = part["serviceAccountToken"].get("path", "")
            if tokens is None or path not in tokens:
                raise VolumeError(f"no service-account token for path {path!r}")
            owner = fs_user(pod)
            payload[path] = FileProjection(tokens[path], token_file_mode(default_mode, owner, fs_group), owner)
            continue
        if part.get("configMap") is not None:
            payload.update(configmap_payload(pod, part["configMap"], store, default_mode))
        elif part.get("secret") is not None:
            secret = part["secret"]
            payload.update(secret_payload(pod, secret.get("name", ""), secret, store, default_mode))
        elif part.get("downwardAPI") is not None:
            payload.update(downward_api_payload(pod, part["downwardAPI"].get("items"), default_mode,
                                                node_allocatable))
        else:
            kind = next(iter(part), "empty source")
            warnings.append(f"projected source {kind} is not supported by this node agent and was skipped")
    return payload


def volume_payload(pod: Pod, kind: str, source: dict[str, Any], store: Store | None,
                   node_allocatable: Mapping[str, Any] | None, warnings: list[str],
                   tokens: Mapping[str, bytes] | None = None, fs_group: int | None = None) -> Payload:
    """The payload of one configMap, secret, downwardAPI or projected volume."""
    if kind == "projected":
        return projected_payload(pod, source, store, node_allocatable, warnings, tokens, fs_group)
    default_mode = _mode(source.get("defaultMode"), f"{kind}.defaultMode")
    if kind == "configMap":
        return configmap_payload(pod, source, store, default_mode)
    if kind == "secret":
        return secret_payload(pod, source.get("secretName", ""), source, store, default_mode)
    if kind == "downwardAPI":
        return downward_api_payload(pod, source.get("items"), default_mode, node_allocatable)
    raise VolumeError(f"{kind} volumes are not written by files")
