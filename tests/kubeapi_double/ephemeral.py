"""The pods/ephemeralcontainers subresource of the API server double (pure): it reads and writes a `Pod` (as
servers do since 1.22); existing ephemeral containers may neither be removed nor changed, new ones are defaulted."""

from __future__ import annotations

import copy
from typing import Any

from tests.kubeapi_double.store import StatusError

# Fields an ephemeral container may not have (the server's ValidateEphemeralContainers).
FORBIDDEN_FIELDS = ("ports", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "resources")


def view(pod: dict[str, Any]) -> dict[str, Any]:
    """What GET answers: the pod itself."""
    return copy.deepcopy(pod)


def updated_pod(old: dict[str, Any], written: Any) -> dict[str, Any]:
    """The pod after a write of `written` (the subresource's object) to it; StatusError for a refused one."""
    if not isinstance(written, dict):
        raise StatusError(400, "BadRequest", "the body must be a JSON object")
    kind = written.get("kind")
    if kind is not None and kind != "Pod":
        raise StatusError(400, "BadRequest", f"the body is a {kind}, pods/ephemeralcontainers takes a Pod")
    containers = (written.get("spec") or {}).get("ephemeralContainers") or []
    name = old["metadata"]["name"]
    problems = _problems(old, [_defaulted(c) for c in containers])
    if problems:
        raise StatusError(422, "Invalid", f'Pod "{name}" is invalid: ' + ", ".join(problems))
    new = copy.deepcopy(old)
    new.setdefault("spec", {})["ephemeralContainers"] = [_defaulted(c) for c in containers]
    written_rv = (written.get("metadata") or {}).get("resourceVersion")
    if written_rv:
        new["metadata"]["resourceVersion"] = written_rv  # a stale one is a conflict, as for any update
    return new


def _defaulted(container: Any) -> Any:
    if not isinstance(container, dict):
        return container
    result = copy.deepcopy(container)
    image = str(result.get("image") or "")
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    result.setdefault("imagePullPolicy", "IfNotPresent" if "@" in image or (tag and tag != "latest") else "Always")
    result.setdefault("terminationMessagePath", "/dev/termination-log")
    result.setdefault("terminationMessagePolicy", "File")
    result.setdefault("resources", {})  # a Go struct the server writes even when empty
    return result


def _problems(old: dict[str, Any], containers: list[Any]) -> list[str]:
    spec = old.get("spec") or {}
    regular = [c.get("name") for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]]
    previous = {c.get("name"): c for c in spec.get("ephemeralContainers") or []}
    new_by_name = {c.get("name"): (i, c) for i, c in enumerate(containers) if isinstance(c, dict)}
    problems = []
    for name, container in previous.items():
        if name not in new_by_name:
            problems.append(f'spec.ephemeralContainers: Forbidden: existing ephemeral containers "{name}" '
                            "may not be removed")
        elif new_by_name[name][1] != container:
            problems.append(f"spec.ephemeralContainers[{new_by_name[name][0]}]: Forbidden: existing ephemeral "
                            f'containers "{name}" may not be changed')
    seen: set[str] = set()
    for index, container in enumerate(containers):
        path = f"spec.ephemeralContainers[{index}]"
        if not isinstance(container, dict):
            problems.append(f"{path}: Invalid value: must be an object")
            continue
        name = container.get("name")
        if not name:
            problems.append(f"{path}.name: Required value")
        elif name in regular or name in seen:
            problems.append(f'{path}.name: Duplicate value: "{name}"')
        seen.add(name)
        if not container.get("image"):
            problems.append(f"{path}.image: Required value")
        for field in FORBIDDEN_FIELDS:
            if container.get(field):
                problems.append(f"{path}.{field}: Forbidden: cannot be set for an Ephemeral Container")
    return problems
