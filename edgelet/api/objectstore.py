"""The API objects pods may reference, held in memory by (kind, namespace, name): ConfigMaps and Secrets, and
the PersistentVolumeClaims of their volumes with the PersistentVolumes bound to them (cluster-scoped: namespace "").

They come from the API server (cluster mode) or from manifests beside the static pods (standalone);
each source replaces its own objects. `on_change` lets the offline cache persist what changed.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Iterable
from typing import Any

from edgelet.api import podutil
from edgelet.api.limits import document_problem
from edgelet.util.errors import PermanentError, cut_long_values

log = logging.getLogger(__name__)

CONFIGMAP = "ConfigMap"
SECRET = "Secret"
CLAIM = "PersistentVolumeClaim"
VOLUME = "PersistentVolume"
KINDS = (CONFIGMAP, SECRET, CLAIM, VOLUME)
CLUSTER_SCOPED = frozenset({VOLUME})
_KIND_NAMES = ", ".join(KINDS[:-1]) + " or " + KINDS[-1]

Key = tuple[str, str, str]  # (kind, namespace, name)
OnChange = Callable[[str, str, str, "dict[str, Any] | None"], None]


class InvalidObjectError(PermanentError):
    """An object that cannot be used; the message names the object and the field."""

    def __init__(self, message: str):
        super().__init__(cut_long_values(message))


def scoped_namespace(kind: str, namespace: str | None) -> str:
    """The namespace part of a key: "" for cluster-scoped kinds, else the namespace ("default" when unset)."""
    return "" if kind in CLUSTER_SCOPED else namespace or "default"


def claim_name(pod: podutil.Pod, volume: dict[str, Any]) -> str | None:
    """The PersistentVolumeClaim a volume uses: its `persistentVolumeClaim.claimName`, or `<pod>-<volume>` for a
    generic `ephemeral` volume (the claim the ephemeral volume controller creates for the pod)."""
    name = _get(volume, "persistentVolumeClaim", "claimName")
    if isinstance(name, str) and name:
        return name
    if isinstance(volume.get("ephemeral"), dict) and isinstance(volume.get("name"), str):
        return f"{podutil.name(pod)}-{volume['name']}"
    return None


def bound_volume(claim: dict[str, Any] | None) -> str | None:
    """The PersistentVolume a claim is bound to, or None while it is not (phase Bound and spec.volumeName)."""
    if not isinstance(claim, dict) or (claim.get("status") or {}).get("phase") != "Bound":
        return None
    name = (claim.get("spec") or {}).get("volumeName")
    return name if isinstance(name, str) and name else None


def with_bound_volumes(keys: Iterable[Key], lookup: Callable[[Key], dict[str, Any] | None]) -> set[Key]:
    """`keys` plus the PersistentVolume of each bound claim among them (as `lookup` holds the claim)."""
    closed = set(keys)
    for key in [key for key in closed if key[0] == CLAIM]:
        if (volume := bound_volume(lookup(key))) is not None:
            closed.add((VOLUME, "", volume))
    return closed


def referenced_objects(pod: podutil.Pod) -> set[Key]:
    """Every (kind, namespace, name) a pod reads: volumes (also projected, and their claims), env, envFrom,
    imagePullSecrets. The PersistentVolumes of the claims depend on the claims: see `with_bound_volumes`."""
    namespace = podutil.namespace(pod) or "default"
    spec = podutil.spec(pod)
    refs: set[Key] = set()

    def add(kind: str, name: Any) -> None:
        if isinstance(name, str) and name:
            refs.add((kind, namespace, name))

    for volume in _dicts(spec.get("volumes")):
        add(CLAIM, claim_name(pod, volume))
        add(CONFIGMAP, _get(volume, "configMap", "name"))
        add(SECRET, _get(volume, "secret", "secretName"))
        for source in _dicts(_get(volume, "projected", "sources")):
            add(CONFIGMAP, _get(source, "configMap", "name"))
            add(SECRET, _get(source, "secret", "name"))
    for container in [*_dicts(spec.get("initContainers")), *_dicts(spec.get("containers")),
                      *_dicts(spec.get("ephemeralContainers"))]:
        for env in _dicts(container.get("env")):
            add(CONFIGMAP, _get(env, "valueFrom", "configMapKeyRef", "name"))
            add(SECRET, _get(env, "valueFrom", "secretKeyRef", "name"))
        for env_from in _dicts(container.get("envFrom")):
            add(CONFIGMAP, _get(env_from, "configMapRef", "name"))
            add(SECRET, _get(env_from, "secretRef", "name"))
    for pull_secret in _dicts(spec.get("imagePullSecrets")):
        add(SECRET, pull_secret.get("name"))
    return refs


def references(pods: Iterable[podutil.Pod]) -> set[Key]:
    return set().union(*(referenced_objects(pod) for pod in pods))


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def object_key(obj: Any) -> Key:
    """The store key of an object; raises InvalidObjectError when it has no usable identity."""
    if not isinstance(obj, dict):
        raise InvalidObjectError(f"expected a {_KIND_NAMES} object, got {type(obj).__name__}")
    kind = obj.get("kind")
    if kind not in KINDS:
        raise InvalidObjectError(f"kind: expected {_KIND_NAMES}, got {kind!r}")
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(name := metadata.get("name"), str) or not name:
        raise InvalidObjectError(f"{kind}: metadata.name is required")
    namespace = metadata.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise InvalidObjectError(f"{kind} {name}: metadata.namespace must be a string")
    return kind, scoped_namespace(kind, namespace), name


def _string_map(obj: dict[str, Any], field: str, where: str) -> dict[str, str]:
    value = obj.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidObjectError(f"{where}: {field} must be an object of keys to strings")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidObjectError(f"{where}: {field}[{key!r}] must be a string")
    return value


def _decoded(obj: dict[str, Any], field: str, where: str) -> dict[str, bytes]:
    decoded = {}
    for key, item in _string_map(obj, field, where).items():
        try:
            decoded[key] = base64.b64decode(item, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidObjectError(f"{where}: {field}[{key!r}] is not valid base64") from None
    return decoded


def configmap_data(configmap: dict[str, Any]) -> dict[str, str]:
    """A ConfigMap's text entries (`data`)."""
    return _string_map(configmap, "data", _describe(configmap))


def configmap_binary_data(configmap: dict[str, Any]) -> dict[str, bytes]:
    """A ConfigMap's `binaryData`, base64-decoded."""
    return _decoded(configmap, "binaryData", _describe(configmap))


def secret_data(secret: dict[str, Any]) -> dict[str, bytes]:
    """A Secret's entries, base64-decoded; `stringData` wins over `data` as on an API server write."""
    where = _describe(secret)
    data = _decoded(secret, "data", where)
    for key, item in _string_map(secret, "stringData", where).items():
        data[key] = item.encode()
    return data


def validate_object(obj: Any) -> Key:
    """Checks that the object can be served (identity, string maps, base64, sane depth); returns its key."""
    key = object_key(obj)
    if problem := document_problem(obj):
        raise InvalidObjectError(f"{_describe(obj)}: {problem[0]}: {problem[1]}")
    if key[0] == CONFIGMAP:
        configmap_data(obj)
        configmap_binary_data(obj)
    elif key[0] == SECRET:
        secret_data(obj)
    else:  # a claim or a volume: what the volume manager reads of it is checked where it is read
        for field in ("spec", "status"):
            if not isinstance(obj.get(field, {}), dict):
                raise InvalidObjectError(f"{_describe(obj)}: {field} must be an object")
    return key


def _describe(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    if obj.get("kind") in CLUSTER_SCOPED:
        return f"{obj.get('kind')} {metadata.get('name')}"
    return f"{obj.get('kind')} {metadata.get('namespace') or 'default'}/{metadata.get('name')}"


class ObjectStore:
    """In-memory API objects pods read; every object is owned by the source that last provided it."""

    def __init__(self, on_change: OnChange | None = None):
        self.on_change = on_change
        self._objects: dict[Key, dict[str, Any]] = {}
        self._owner: dict[Key, str] = {}
        self._by_source: dict[str, set[Key]] = {}

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get((kind, scoped_namespace(kind, namespace), name))

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(CONFIGMAP, namespace, name)

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(SECRET, namespace, name)

    def objects(self, source: str | None = None) -> list[dict[str, Any]]:
        """Every object, or those of one source (what an offline cache saves)."""
        if source is None:
            return list(self._objects.values())
        return [self._objects[key] for key in self._by_source.get(source, ())]

    def put(self, obj: dict[str, Any], source: str = "api") -> bool:
        """Adds or replaces one object; True if anything changed. Raises InvalidObjectError on bad input."""
        key = validate_object(obj)
        return self._store(key, obj, source)

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Forgets one object whatever its source; True if it was there."""
        key = (kind, scoped_namespace(kind, namespace), name)
        if key not in self._objects:
            return False
        del self._objects[key]
        self._by_source[self._owner.pop(key)].discard(key)
        self._notify(key, None)
        return True

    def replace_all(self, source: str, objs: Iterable[dict[str, Any]]) -> list[str]:
        """Makes `objs` the complete set of this source's objects; returns the problems of invalid ones.

        An invalid object is skipped; if the source provided it before, its last good version stays, so
        a bad edit to a manifest never takes a working Secret away from running pods.
        """
        problems = []
        wanted: dict[Key, dict[str, Any]] = {}
        kept: set[Key] = set()
        for obj in objs:
            try:
                wanted[validate_object(obj)] = obj
            except InvalidObjectError as exc:
                problems.append(str(exc))
                try:
                    kept.add(object_key(obj))
                except InvalidObjectError:
                    pass
        for problem in problems:
            log.warning("object store (%s): skipped invalid object: %s", source, problem)
        for key in sorted(self._by_source.get(source, set()) - wanted.keys() - kept):
            self.delete(*key)
        for key, obj in wanted.items():
            self._store(key, obj, source)
        return problems

    def _store(self, key: Key, obj: dict[str, Any], source: str) -> bool:
        previous_owner = self._owner.get(key)
        if previous_owner is not None and previous_owner != source:
            self._by_source[previous_owner].discard(key)
        self._owner[key] = source
        self._by_source.setdefault(source, set()).add(key)
        if self._objects.get(key) == obj:
            return False
        self._objects[key] = obj
        self._notify(key, obj)
        return True

    def _notify(self, key: Key, obj: dict[str, Any] | None) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(*key, obj)
        except Exception:  # a failing cache must not break the store that pods depend on
            log.exception("object store: on_change failed for %s %s/%s", *key)
