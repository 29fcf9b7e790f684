"""The CSI drivers registered on this node (filled by the registration handler, read by the volume code): light, no
gRPC here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Driver:
    name: str
    endpoint: str  # the driver's CSI socket
    node_id: str
    topology: dict[str, str] = field(default_factory=dict)
    max_volumes: int = 0
    client: Any = field(default=None, compare=False, repr=False)  # its csi.client.NodeClient


class DriverRegistry:
    def __init__(self) -> None:
        self._drivers: dict[str, Driver] = {}

    def add(self, driver: Driver) -> None:
        self._drivers[driver.name] = driver

    def remove(self, name: str) -> Driver | None:
        return self._drivers.pop(name, None)

    def get(self, name: str) -> Driver | None:
        return self._drivers.get(name)

    def names(self) -> list[str]:
        return sorted(self._drivers)
