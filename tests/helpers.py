"""What the suites' tests share: waiting for a condition (blocking, or on the event loop) and the busybox pods they
run, as the decoded pod a manager is handed and as the manifest file a user writes."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

BUSYBOX = "docker.io/library/busybox:local"  # in every private containerd the tests start (tests/conftest.py)


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition"):
    """Calls `predicate` until it returns something true, and returns that; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def eventually(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.01, what: str = "") -> Any:
    """`wait_for` on the event loop, which it never blocks: `predicate` may also be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            what = what or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)


def busybox_pod(command: str | None = None, *, name: str = "pod", host_network: bool = True, grace: int = 0,
                annotations: dict[str, str] | None = None, **container_fields: Any) -> dict[str, Any]:
    """A pod of one busybox container "app", as a source hands it to the managers: a name unique to the call
    (`name` and a random suffix), a uid. `command` runs under `sh -c`; without one the container sleeps an hour.
    `container_fields` go into the container (resources, lifecycle, env, probes...)."""
    metadata: dict[str, Any] = {"name": f"{name}-{uuid.uuid4().hex[:8]}", "namespace": "default",
                                "uid": str(uuid.uuid4())}
    if annotations:
        metadata["annotations"] = dict(annotations)
    container = {"name": "app", "image": BUSYBOX,
                 "command": ["sh", "-c", command] if command is not None else ["sleep", "3600"], **container_fields}
    return {"metadata": metadata,
            "spec": {"hostNetwork": host_network, "terminationGracePeriodSeconds": grace, "containers": [container]}}


def busybox_manifest(name: str, command: str, *, restart_policy: str = "Always", grace: int = 1,
                     host_network: bool = True, container_field: str = "") -> str:
    """A static pod's manifest as a user writes it (`AgentProcess.write_manifest` dedents it): one container "main"
    running `command` under `sh -c`; `container_field` is one more field of that container in YAML's flow style
    (`readinessProbe: {...}`)."""
    field_line = f"\n              {container_field}" if container_field else ""
    return f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: {name}
        spec:
          hostNetwork: {str(host_network).lower()}
          restartPolicy: {restart_policy}
          terminationGracePeriodSeconds: {grace}
          containers:
            - name: main
              image: {BUSYBOX}
              imagePullPolicy: Never
              command: ["sh", "-c", {json.dumps(command)}]{field_line}
"""


def make_pod(containers=("app",), init=(), policy=None, host_network=False, deleted=False, static=False, *,
             sidecars=(), startup_probe=(), liveness_probe=(), probes=None, ephemeral=(), gates=(), status=None,
             name="web", namespace="default", uid="uid-1", image=None, source=None, resources=None, fields=None,
             **spec_fields) -> dict[str, Any]:
    """A pod as the pure units see it, nothing but what a test names: `containers`, `init` and `ephemeral` by name
    (image `img-<name>` unless `image`), init containers in `sidecars` with restartPolicy Always, exec probes on
    the containers in `startup_probe` / `liveness_probe` or by kind in `probes` ({name: ("readiness", ...)}),
    `resources` on every container and `fields` ({name: {...}}) on the named ones; `deleted` sets a
    deletionTimestamp, `static` (or `source`) the config source annotation; other keywords go into the spec."""
    probes = {name_: list(kinds) for name_, kinds in (probes or {}).items()}
    for kind, names in (("startup", startup_probe), ("liveness", liveness_probe)):
        for container in names:
            probes.setdefault(container, []).append(kind)

    def container(container_name: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": container_name, "image": image or f"img-{container_name}"}
        for kind in probes.get(container_name, ()):
            spec[f"{kind}Probe"] = {"exec": {"command": ["true"]}}
        if resources is not None:
            spec["resources"] = resources
        if container_name in sidecars:
            spec["restartPolicy"] = "Always"
        spec.update((fields or {}).get(container_name, {}))
        return spec

    spec: dict[str, Any] = {"containers": [container(n) for n in containers]}
    if init:
        spec["initContainers"] = [container(n) for n in init]
    if ephemeral:
        spec["ephemeralContainers"] = [{"name": n, "image": f"img-{n}"} for n in ephemeral]
    if policy:
        spec["restartPolicy"] = policy
    if host_network:
        spec["hostNetwork"] = True
    if gates:
        spec["readinessGates"] = [{"conditionType": g} for g in gates]
    spec.update(spec_fields)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if deleted:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if static or source:
        metadata["annotations"] = {"kubernetes.io/config.source": source or "file"}
    pod: dict[str, Any] = {"metadata": metadata, "spec": spec}
    if status is not None:
        pod["status"] = status
    return pod


def resource_pod(name: str, *, memory_request=None, memory_limit=None, storage_request=None, cpu=None,
                 priority=None, tolerations=None, source=None) -> dict[str, Any]:
    """A pod of one container "app" with the requests and limits named (cpu both requested and limited), as the
    eviction and admission units weigh pods; its uid is its name."""
    resources: dict[str, Any] = {}
    requests = {k: v for k, v in (("memory", memory_request), ("ephemeral-storage", storage_request), ("cpu", cpu))
                if v}
    if requests:
        resources["requests"] = requests
    if memory_limit:
        resources["limits"] = {"memory": memory_limit, **({"cpu": cpu} if cpu else {})}
    extra: dict[str, Any] = {}
    if priority is not None:
        extra["priority"] = priority
    if tolerations:
        extra["tolerations"] = tolerations
    return make_pod(name=name, uid=name, image="busybox", resources=resources, source=source, **extra)


def static_pod(name: str = "web", config_hash: str = "hash-1", node: str = "edge-1", **spec_fields: Any) -> dict[str,
                                                                                                                 Any]:
    """A running static pod as the file source hands it over (named `<name>-<node>`, its uid the config hash), for
    the mirror pod tests."""
    return {
        "metadata": {
            "name": f"{name}-{node}", "namespace": "default", "uid": config_hash,
            "labels": {"app": name}, "resourceVersion": "7", "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"kubernetes.io/config.source": "file", "kubernetes.io/config.hash": config_hash},
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}], **spec_fields},
        "status": {"phase": "Running"},
    }
