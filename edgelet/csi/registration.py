"""The CSI plugin handler of the plugin watcher (the kubelet's csi_plugin RegistrationHandler): a driver that offers
a CSI 1.x version is asked NodeGetInfo, kept in the driver registry and written into the CSINode object."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .drivers import Driver, DriverRegistry

if TYPE_CHECKING:
    from .csinode import CsiNodeUpdater

log = logging.getLogger(__name__)

CSI_PLUGIN = "CSIPlugin"
_VERSION = re.compile(r"^v?(\d+)(\.\d+)*$")


def supported_version(versions: list[str]) -> str | None:
    """The first offered version of CSI 1.x (the only major version the kubelet speaks), or None."""
    for version in versions:
        match = _VERSION.match(version.strip())
        if match and match.group(1) == "1":
            return version
    return None


class CsiPluginHandler:
    def __init__(self, drivers: DriverRegistry, on_registered: Callable[[str], Awaitable[None]] | None = None):
        self.drivers = drivers
        # What follows a registration: the volume manager's unstage pass for volumes no pod uses any more (left
        # staged by a crash between a pod's unpublish and the unstage).
        self.on_registered = on_registered
        self.csinode: CsiNodeUpdater | None = None  # cluster mode: `use_csinode`

    def use_csinode(self, csinode: CsiNodeUpdater) -> None:
        self.csinode = csinode
        for name in self.drivers.names():
            if (driver := self.drivers.get(name)) is not None:
                csinode.set_driver(driver)

    async def register(self, name: str, endpoint: str, versions: list[str], socket_path: str) -> None:
        if supported_version(versions) is None:
            raise ValueError(f"none of the CSI versions reported by this driver {versions} is supported")
        from .client import NodeClient  # gRPC: loaded with the first driver

        client = NodeClient(endpoint)
        try:
            info = await client.node_info()
            await client.capabilities()
        except Exception:
            await client.close()
            raise
        previous = self.drivers.get(name)
        driver = Driver(name, endpoint, info.node_id, dict(info.accessible_topology.segments),
                        info.max_volumes_per_node, client)
        self.drivers.add(driver)
        if previous is not None and previous.client is not None and previous.client is not client:
            await previous.client.close()
        if self.csinode is not None:
            self.csinode.set_driver(driver)
        log.info("CSI driver %s: node ID %s, topology %s", name, info.node_id, dict(driver.topology) or "none")
        if self.on_registered is not None:
            try:
                await self.on_registered(name)
            except Exception as e:  # noqa: BLE001 - the driver is registered all the same; a later teardown tries again
                log.warning("CSI driver %s: unstaging volumes no pod uses failed: %s", name, e)

    async def deregister(self, name: str) -> None:
        driver = self.drivers.remove(name)
        if self.csinode is not None:
            self.csinode.remove_driver(name)
        if driver is not None and driver.client is not None:
            await driver.client.close()
