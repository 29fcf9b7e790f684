"""Pure comparison of pod statuses with the API server's copy: the normal form both are compared in, the
strategic merge patch between them, and the status fields a server turns out not to store.

The real API server answers with `null` for unset times (`lastProbeTime`), leaves out empty strings and
lists, keeps other writers' conditions, and silently drops fields its version does not know (`hostIPs`
before 1.28). Comparing raw dicts would find a difference on every resync; comparing normal forms finds
only what a PATCH would really change, as the kubelet's status manager does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from edgelet.status.generate import DISRUPTION_TARGET, KUBELET_CONDITIONS

# The patchMergeKey of the keyed lists in a PodStatus. containerStatuses, initContainerStatuses and
# ephemeralContainerStatuses have none: they are replaced whole (a `$setElementOrder` directive or a
# partial item for them makes kube-apiserver panic in strategicpatch).
STATUS_MERGE_KEYS = {
    "conditions": "type",
    "podIPs": "ip",
    "hostIPs": "ip",
}
# Status fields the agent owns: when it stops reporting one, the patch removes it from the API. Others
# (nominatedNodeName, conditions written by controllers) are left alone.
OWNED_STATUS_FIELDS = frozenset({
    "phase", "message", "reason", "startTime", "qosClass", "hostIP", "hostIPs", "podIP", "podIPs",
    "containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses", "observedGeneration",
})
# Conditions the agent writes; the others belong to controllers and readiness-gate owners.
OWNED_CONDITIONS = KUBELET_CONDITIONS | {DISRUPTION_TARGET}
# How list items are paired when looking for dropped fields: by the first of these keys they carry.
_ITEM_KEYS = ("name", "type", "ip")

FieldPath = tuple[str, ...]  # map keys from the status down; list levels are not named


def normal_form(status: dict[str, Any] | None, unknown: Iterable[FieldPath] = ()) -> dict[str, Any]:
    """`status` as the API server would hand it back: nulls, empty strings and empty lists left out,
    only the agent's own conditions, without the fields the server is known not to store."""
    view = dict(status or {})
    conditions = view.get("conditions")
    if isinstance(conditions, list):
        view["conditions"] = [c for c in conditions if not isinstance(c, dict) or c.get("type") in OWNED_CONDITIONS]
    for path in unknown:
        view = _without(view, path)
    return _compact(view)


def _compact(value: Any) -> Any:
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            item = _compact(item)
            if item is not None and item != "" and item != []:
                result[key] = item
        return result
    if isinstance(value, list):
        return [_compact(item) for item in value]
    return value


def _without(value: Any, path: FieldPath) -> Any:
    """A copy of `value` without the field at `path` (applied to every item of the lists on the way)."""
    if isinstance(value, list):
        return [_without(item, path) for item in value]
    if not isinstance(value, dict) or path[0] not in value:
        return value
    result = dict(value)
    if len(path) == 1:
        del result[path[0]]
    else:
        result[path[0]] = _without(result[path[0]], path[1:])
    return result


def api_view(api_status: dict[str, Any] | None, status: dict[str, Any], could_run: bool) -> dict[str, Any]:
    """`status` as it may reach the API (the kubelet's mergePodStatus): while the pod's containers could still
    run (`could_run`: its worker has not seen them all stopped), a terminal phase waits, with its reason,
    message and DisruptionTarget, and the API keeps its phase; a terminal phase that is sent never goes with
    a Ready or ContainersReady condition that is True."""
    api_status = api_status or {}
    result = status
    if could_run and status.get("phase") in TERMINAL_PHASES and api_status.get("phase") not in TERMINAL_PHASES:
        result = {key: value for key, value in status.items() if key not in _PHASE_FIELDS}
        result.update({key: api_status[key] for key in _PHASE_FIELDS if api_status.get(key)})
        conditions = status.get("conditions") or []
        api_types = {c.get("type") for c in api_status.get("conditions") or []}
        if DISRUPTION_TARGET not in api_types and any(c.get("type") == DISRUPTION_TARGET for c in conditions):
            result["conditions"] = [c for c in conditions if c.get("type") != DISRUPTION_TARGET]
    elif status.get("phase") in TERMINAL_PHASES and any(
            c.get("type") in _READY_CONDITIONS and c.get("status") == "True" for c in status.get("conditions") or []):
        reason = "PodCompleted" if status["phase"] == "Succeeded" else "PodFailed"
        result = {**status, "conditions": [
            {**{k: v for k, v in c.items() if k != "message"}, "status": "False", "reason": reason}
            if c.get("type") in _READY_CONDITIONS else c
            for c in status.get("conditions") or []]}
    return result


TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_PHASE_FIELDS = ("phase", "reason", "message")
_READY_CONDITIONS = frozenset({"Ready", "ContainersReady"})


def status_differs(api_status: dict[str, Any] | None, status: dict[str, Any],
                   unknown: Iterable[FieldPath] = ()) -> bool:
    """Whether writing `status` would change the API's `api_status` (both compared in normal form)."""
    unknown = tuple(unknown)
    return bool(status_patch(normal_form(api_status, unknown), normal_form(status, unknown)))


def status_patch(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The strategic merge patch turning status `old` (as the API holds it) into `new`; {} when equal.

    Maps are diffed recursively with `null` for removed keys (only agent-owned ones at the top level),
    keyed lists item by item, every other list (container statuses included) replaced whole. An
    order-only difference of a keyed list is no change; when a keyed list does change,
    `$setElementOrder` carries the new order, as the kubelet's two-way merge patch does.
    """
    return _map_patch(old or {}, new, top_level=True)


def _map_patch(old: dict[str, Any], new: dict[str, Any], *, top_level: bool = False) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if key in old and before == value:
            continue
        if isinstance(value, dict) and isinstance(before, dict):
            sub = _map_patch(before, value)
            if sub:
                patch[key] = sub
        elif top_level and key in STATUS_MERGE_KEYS and isinstance(value, list) and isinstance(before, list):
            merge_key = STATUS_MERGE_KEYS[key]
            sub_list = _keyed_list_patch(before, value, merge_key, delete_missing=key != "conditions")
            if sub_list is not None:
                patch[key] = sub_list
                if all(isinstance(item, dict) for item in value):
                    patch[f"$setElementOrder/{key}"] = [{merge_key: item.get(merge_key)} for item in value]
        else:
            patch[key] = value
    for key in old.keys() - new.keys():
        if not top_level or key in OWNED_STATUS_FIELDS:
            patch[key] = None
    return patch


def _keyed_list_patch(old: list[Any], new: list[Any], merge_key: str, *, delete_missing: bool) -> list[Any] | None:
    """Item patches by merge key; None when the lists hold the same items. Lists whose items lack the
    key cannot be merged: they are replaced whole."""
    if not all(isinstance(item, dict) and merge_key in item for item in [*old, *new]):
        return None if old == new else [*new, {"$patch": "replace"}]
    old_by_key = {item[merge_key]: item for item in old}
    new_keys = {item[merge_key] for item in new}
    items: list[Any] = []
    for item in new:
        before = old_by_key.get(item[merge_key])
        if before is None:
            items.append(item)
        elif before != item:
            items.append({merge_key: item[merge_key], **_map_patch(before, item)})
    if delete_missing:
        items += [{"$patch": "delete", merge_key: key} for key in old_by_key if key not in new_keys]
    return items or None


def dropped_fields(sent: dict[str, Any], returned: dict[str, Any] | None) -> set[FieldPath]:
    """Fields of the patch `sent` with a value that the server's answer `returned` does not hold: the
    server does not know them (both in normal form; directives and deletions are not looked at)."""
    return _dropped(_compact(sent), _compact(returned or {}), ())


def _dropped(sent: Any, returned: Any, prefix: FieldPath) -> set[FieldPath]:
    found: set[FieldPath] = set()
    if not isinstance(sent, dict) or not isinstance(returned, dict):
        return found
    for key, value in sent.items():
        if key.startswith("$") or (isinstance(value, dict) and "$patch" in value):
            continue
        if key not in returned:
            found.add((*prefix, key))
            continue
        answer = returned[key]
        if isinstance(value, dict):
            found |= _dropped(value, answer, (*prefix, key))
        elif isinstance(value, list) and isinstance(answer, list):
            for mine, theirs in _paired(value, answer):
                found |= _dropped(mine, theirs, (*prefix, key))
    return found


def _paired(sent: list[Any], returned: list[Any]) -> list[tuple[Any, Any]]:
    """List items matched by their name/type/ip, or by position when they carry none."""
    pairs = []
    for index, item in enumerate(sent):
        key = next((k for k in _ITEM_KEYS if isinstance(item, dict) and k in item), None)
        if key is None:
            if index < len(returned):
                pairs.append((item, returned[index]))
            continue
        match = next((r for r in returned if isinstance(r, dict) and r.get(key) == item[key]), None)
        if match is not None:
            pairs.append((item, match))
    return pairs
