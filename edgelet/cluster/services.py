"""The cluster's Services as the kubelet's service informer keeps them, for the variables pods get from them.

One list + watch of every namespace's Services that have a cluster IP (the kubelet's `spec.clusterIP!=None`
selector), through the API pod source's reflector. Only what the variables need is kept of each Service.

As the kubelet, API pods wait for the first list: new ones before they are handed on (`wait_synced`, bounded),
and a container made before it arrived is refused with the kubelet's error and retried. Only while the API server
answers, though: an agent restarted offline starts its cached pods with what it knows (the `kubernetes` Service's
variables, which point at the configured API address), as static pods always do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edgelet.api import podutil
from edgelet.api.env import MASTER_NAMESPACE, MASTER_SERVICES, EnvError, pod_service_env
from edgelet.api.podutil import Pod
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import ApiError
from edgelet.podconfig.apiserver import ApiServerSource

SERVICES_PATH = "/api/v1/services"
NOT_SYNCED = "services have not yet been read at least once, cannot construct envvars"


def service_problem(obj: Any) -> str | None:
    """Why an object from the API cannot be used as a Service (None: it can)."""
    if not isinstance(obj, dict):
        return "is not a JSON object"
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return "has no metadata.name"
    if not isinstance(meta.get("namespace"), str) or not meta["namespace"]:
        return "has no metadata.namespace"
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return "has no spec object"
    if not isinstance(spec.get("clusterIP", ""), str):
        return "has a spec.clusterIP that is not a string"
    ports = spec.get("ports") or []
    if not isinstance(ports, list) or not all(
            isinstance(port, dict) and isinstance(port.get("port"), int) and not isinstance(port.get("port"), bool)
            and isinstance(port.get("name", ""), str) and isinstance(port.get("protocol", ""), str)
            for port in ports):
        return "has spec.ports that are not a list of ports with a numeric port"
    return None


def slim(service: Mapping[str, Any]) -> dict[str, Any]:
    """What the variables read of a Service (a cluster's Services can be many; an edge node keeps little)."""
    meta, spec = service["metadata"], service["spec"]
    return {"metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "spec": {"clusterIP": spec.get("clusterIP", ""),
                     "ports": [{key: port[key] for key in ("name", "port", "protocol") if key in port}
                               for port in spec.get("ports") or []]}}


class _Services:
    """The reflector's handle: the whole set at each change, and whether a list ever arrived."""

    def __init__(self) -> None:
        self.services: list[dict[str, Any]] = []
        self.synced = False
        self.settled = asyncio.Event()  # the first list arrived, or failed

    def set(self, services: list[dict[str, Any]]) -> None:
        self.services = services

    def mark_ready(self) -> None:
        self.synced = True
        self.settled.set()


class ServiceInformer(ApiServerSource):
    """Services of all namespaces; `env_for(pod)` gives a container's Service variables.

    `master`, when given, stands in for the default namespace's `kubernetes` Service: the address of the API
    server this agent uses, which its pods can reach where the Service's cluster IP may not be routed.
    `api_answers` says whether the API server is reachable now (the pod source's connection).
    """

    KIND = "service"
    PATH = SERVICES_PATH

    def __init__(self, client: ApiClient, *, master: Mapping[str, Any] | None = None,
                 api_answers: Callable[[], bool] = lambda: True, **options: Any):
        self._known = _Services()
        self._master = master
        self._api_answers = api_answers
        super().__init__(client, "", self._known, **options)

    async def wait_synced(self, timeout: float) -> None:
        """Waits (at most `timeout`) for the first list, or for it to fail."""
        try:
            async with asyncio.timeout(timeout):
                await self._known.settled.wait()
        except TimeoutError:
            pass

    def _failed(self, error: ApiError) -> float:
        self._known.settled.set()  # nothing to wait for while the API server does not answer
        return super()._failed(error)

    @property
    def selector(self) -> dict[str, str]:
        return {"fieldSelector": "spec.clusterIP!=None"}

    def problem(self, obj: Any) -> str | None:
        return service_problem(obj)

    def keep(self, obj: dict[str, Any]) -> dict[str, Any]:
        return slim(obj)

    @property
    def synced(self) -> bool:
        return self._known.synced

    def env_for(self, pod: Pod) -> dict[str, str]:
        """The pod's Service variables; EnvError for an API pod before the Services were first listed from an API
        server that answers."""
        if not self._known.synced and not podutil.is_static(pod) and self._api_answers():
            raise EnvError(NOT_SYNCED)
        services: Sequence[Mapping[str, Any]] = self._known.services
        if self._master is not None:
            services = [s for s in services if not _is_master(s)] + [self._master]
        return pod_service_env(pod, services)


def _is_master(service: Mapping[str, Any]) -> bool:
    meta = service["metadata"]
    return meta["namespace"] == MASTER_NAMESPACE and meta["name"] in MASTER_SERVICES

