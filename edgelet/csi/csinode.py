"""The CSINode object of this node (storage.k8s.io/v1): one entry per registered driver with its node ID, topology
keys and volume limit, kept by the agent as the kubelet's nodeinfomanager keeps it; written again until the API
server takes it (offline, it waits)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from edgelet.kubeapi.errors import ApiError, NotFound
from edgelet.util.retry import Retrier

from .drivers import Driver

log = logging.getLogger(__name__)

PATH = "/apis/storage.k8s.io/v1/csinodes"


def driver_entry(driver: Driver) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": driver.name, "nodeID": driver.node_id}
    if driver.topology:
        entry["topologyKeys"] = sorted(driver.topology)
    if driver.max_volumes > 0:
        entry["allocatable"] = {"count": driver.max_volumes}
    return entry


def csinode_object(node_name: str, node_uid: str, drivers: dict[str, Driver],
                   existing: dict[str, Any] | None) -> dict[str, Any]:
    """The CSINode to write: the existing object (its resourceVersion) with exactly our drivers, owned by the Node."""
    obj = dict(existing or {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": node_name}})
    meta = dict(obj.get("metadata") or {})
    if node_uid and not meta.get("ownerReferences"):
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}]
    obj["metadata"] = meta
    obj["spec"] = {"drivers": [driver_entry(drivers[name]) for name in sorted(drivers)]}
    return obj


class CsiNodeUpdater:
    def __init__(self, client: Any, node_name: str, node_uid: Callable[[], str]):
        self.client = client
        self.node_name = node_name
        self.node_uid = node_uid
        self._drivers: dict[str, Driver] = {}
        self._dirty = asyncio.Event()

    def set_driver(self, driver: Driver) -> None:
        self._drivers[driver.name] = driver
        self._dirty.set()

    def remove_driver(self, name: str) -> None:
        if self._drivers.pop(name, None) is not None:
            self._dirty.set()

    async def run(self) -> None:
        retry = Retrier("CSINode update", initial=0.5, maximum=30.0, logger=log)
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.write()
            except ApiError as e:
                self._dirty.set()
                await asyncio.sleep(retry.failed(e))
                continue
            retry.succeeded()

    async def write(self) -> None:
        path = f"{PATH}/{self.node_name}"
        try:
            existing = await self.client.get(path)
        except NotFound:
            existing = None
        obj = csinode_object(self.node_name, self.node_uid(), self._drivers, existing)
        if existing is None:
            await self.client.create(PATH, obj)
        else:
            await self.client.replace(path, obj)
