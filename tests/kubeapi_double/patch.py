"""The three PATCH flavours of the Kubernetes API as pure functions over JSON values.

Strategic merge knows list merge keys by field name (see MERGE_KEYS), which is how the built-in
types declare them for the fields edgelet writes; it is not schema-aware beyond that table. Lists of
objects WITHOUT a merge key (container statuses, node taints) are replaced whole, and a `$setElementOrder`
directive or a partial item for them is the real server's strategicpatch panic (StrategicMergePanic).
"""

from __future__ import annotations

import copy
from typing import Any

# patchMergeKey of the built-in types' merged lists, by field name.
MERGE_KEYS = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "addresses": "type",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "podIPs": "ip",
    "hostIPs": "ip",
    "imagePullSecrets": "name",
}
# Lists of objects the built-in types declare with no patch merge key: a patch replaces them whole.
UNKEYED_OBJECT_LISTS = frozenset({"containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses", "taints"})
# Lists of scalars the API merges as sets instead of replacing.
MERGED_SCALAR_LISTS = frozenset({"finalizers"})


class PatchError(ValueError):
    """The patch cannot be applied (malformed operation, failed test, missing path)."""


class StrategicMergePanic(PatchError):
    """What makes kube-apiserver panic in strategicpatch ("comparing uncomparable type
    map[string]interface {}") and drop the connection: an element order or item directives for a list of
    objects that has no merge key."""


def strategic_merge(original: Any, patch: Any) -> Any:
    """Apply a strategic merge patch: maps merge, null deletes, lists with a merge key merge by
    it, `$patch: replace|delete` and `$deleteFromPrimitiveList/<field>` directives are honoured."""
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object")
    merged = _merge_map(original if isinstance(original, dict) else {}, patch)
    return {} if merged is None else merged


def json_merge(original: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge(result.get(key), value)
    return result


def json_patch(original: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch with the add, remove, replace, test, move and copy operations."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(original)
    for index, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"operation {index} needs op and path")
        kind = op["op"]
        path = _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            doc, _ = _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"operation {index}: test of {op['path']} failed")
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            if kind == "move":
                doc, value = _remove(doc, source)
            else:
                value = copy.deepcopy(_get(doc, source))
            doc = _add(doc, path, value)
        else:
            raise PatchError(f"operation {index}: unknown op {kind!r}")
    return doc


def _merge_map(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any] | None:
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip({k: v for k, v in patch.items() if k != "$patch"})
    if directive == "delete":
        return None
    _refuse_keyed_use_of_unkeyed_lists(patch)
    result = dict(original)
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if key.startswith("$"):
            continue  # $setElementOrder/..., $retainKeys: ordering hints the double does not need
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            merged = _merge_map(result[key], value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, dict) and value.get("$patch") == "delete":
            result.pop(key, None)
        else:
            result[key] = _strip(value)
    return result


def _refuse_keyed_use_of_unkeyed_lists(patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") and key.split("/", 1)[1] in UNKEYED_OBJECT_LISTS and value:
            raise StrategicMergePanic(f"{key}: comparing uncomparable type map[string]interface {{}}")
        if key in UNKEYED_OBJECT_LISTS and isinstance(value, list) and any(_partial(item) for item in value):
            raise StrategicMergePanic(f"{key}: a partial item for a list without merge key")


def _partial(item: Any) -> bool:
    """An item written as a patch (`$patch` and other directives) rather than as a whole object."""
    if isinstance(item, dict):
        return any(k.startswith("$") or _partial(v) for k, v in item.items())
    if isinstance(item, list):
        return any(_partial(v) for v in item)
    return False


def _merge_list(field: str, original: list[Any], patch: list[Any]) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [_strip(item) for item in patch if not (isinstance(item, dict) and item.get("$patch") == "replace")]
    merge_key = MERGE_KEYS.get(field)
    if merge_key is None:
        if field in MERGED_SCALAR_LISTS:
            return list(original) + [item for item in patch if item not in original]
        return _strip(patch)
    result = list(original)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            result.append(_strip(item))
            continue
        position = next(
            (i for i,
             existing in enumerate(result) if isinstance(existing,
                                                         dict) and existing.get(merge_key) == item[merge_key]),
            None,
        )
        if item.get("$patch") == "delete":
            if position is not None:
                del result[position]
        elif position is None:
            result.append(_strip(item))
        else:
            merged = _merge_map(result[position], item)
            if merged is None:
                del result[position]
            else:
                result[position] = merged
    return result


def _strip(value: Any) -> Any:
    """A copy without `$` directives, for values that are inserted rather than merged."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _pointer(text: Any) -> list[str]:
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise PatchError(f"invalid JSON pointer {text!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in text.split("/")[1:]]


def _get(doc: Any, path: list[str]) -> Any:
    for part in path:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise PatchError(f"path /{'/'.join(path)} does not exist")
    return doc


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"index {last} out of range")
    else:
        raise PatchError(f"cannot add below a scalar at /{'/'.join(path)}")
    return doc


def _remove(doc: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        raise PatchError("cannot remove the whole document")
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        return doc, parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return doc, parent.pop(int(last))
    raise PatchError(f"path /{'/'.join(path)} does not exist")
