"""Registers this machine's Node and keeps its status current, as the kubelet's node status loop does.

Status is computed every `update_frequency` and written (strategic-merge PATCH of `nodes/<name>/status`)
only when it changed materially (heartbeat times ignored) or `report_frequency` has passed; the Lease
is the liveness heartbeat. API outages are retried with jittered backoff; nothing here ends the agent.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgelet.events import NO_EVENTS, Recorder, node_ref
from edgelet.events.node import condition_events, condition_statuses
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import AlreadyExists, ApiError, NotFound
from edgelet.nodestatus.health import NodeHealth
from edgelet.nodestatus.setters import (
    NodeInfo,
    PressureThresholds,
    Reserved,
    RuntimeFeatures,
    StatusInputs,
    compute_status,
    initial_node,
    material_view,
    missing_labels,
    pod_cidrs,
)
from edgelet.util.errors import EdgeletError
from edgelet.util.retry import Retrier

log = logging.getLogger(__name__)

NODES_PATH = "/api/v1/nodes"
# How often the first status after a start looks whether the runtime's health is known yet.
SETTLE_POLL = 0.1


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What the node says of itself in its status, from whatever runs its pods (the agent, a hollow node)."""

    facts: Callable[[], NodeInfo | Awaitable[NodeInfo]]
    node_health: NodeHealth
    runtime_version: Callable[[], str | Awaitable[str]]
    pressure: Callable[[], Mapping[str, bool]] | None = None
    thresholds: PressureThresholds = PressureThresholds()
    reserved: Reserved = Reserved()
    max_pods: int = 110
    daemon_port: int = 0  # the kubelet API's port (0: none)
    runtime_features: Callable[[], RuntimeFeatures | None] = lambda: None  # runtimeHandlers, features
    # Device plugins' resources: name -> (capacity, allocatable).
    extended_resources: Callable[[], Mapping[str, tuple[int, int]]] = dict
    # Hands the Node's spec.podCIDR to the runtime (CRI UpdateRuntimeConfig); None: nobody takes it.
    pod_cidr_handler: Callable[[str], Awaitable[None]] | None = None


class NodeStatusManager:
    def __init__(
        self,
        client: ApiClient,
        node_name: str,
        report: NodeReport,
        *,
        node_labels: Mapping[str, str] | None = None,
        register_taints: tuple[Mapping[str, str], ...] = (),
        on_pod_cidr: Callable[[str], Awaitable[None]] | None = None,
        update_frequency: float = 10.0,
        report_frequency: float = 300.0,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff_initial: float = 0.8,
        register_backoff_max: float = 7.0,
        recorder: Recorder = NO_EVENTS,
    ):
        self.client = client
        self.node_name = node_name
        self.update_frequency = update_frequency
        self.report_frequency = report_frequency
        self.registered = asyncio.Event()
        self.node_uid = ""
        self.status_writes = 0
        self.last_write = 0.0  # clock() of the last successful status write
        self._report = report
        self._node_labels = dict(node_labels or {})
        self._register_taints = register_taints
        # The kubelet hands spec.podCIDR to the runtime (CRI UpdateRuntimeConfig) once the node IPAM controller
        # assigned it: the Node is read at each sync until then (it never changes once set).
        self._on_pod_cidr = on_pod_cidr
        self.pod_cidr = ""
        self._clock = clock
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._backoff_initial = backoff_initial
        self._register_backoff_max = register_backoff_max
        self._runtime_version = ""
        self._last_status: dict[str, Any] | None = None  # what we computed and wrote last
        self._last_write_at: float | None = None  # None: write at the next sync whatever it holds
        self._recorder = recorder
        self._evented_conditions: dict[str, str] = {}  # condition statuses the events have told
        self._read_server_status = False  # compare with the Node as the server has it at the next sync

    @property
    def path(self) -> str:
        return f"{NODES_PATH}/{self.node_name}"

    async def run(self) -> None:
        await self.register()
        await self._until_health_settled()
        retry = Retrier("node status update", initial=self._backoff_initial, maximum=self.update_frequency,
                        rng=self._rng, logger=log)
        while True:
            try:
                await self.sync_once()
            except NotFound:
                log.warning("node %s is gone from the API server; registering it again", self.node_name)
                self.registered.clear()
                await self.register()
                continue
            except (ApiError, _InputsUnavailable) as e:
                await self._sleep(retry.failed(e))
                continue
            retry.succeeded()
            await self._sleep(self.update_frequency)

    async def _until_health_settled(self) -> None:
        """The first status write waits, at most one update period, until the runtime's health is known: a
        restarted agent would otherwise write its node NotReady ("waiting for the container runtime") for the
        moment before its first Status call, and the node lifecycle controller taints a NotReady node. The
        Lease keeps the node alive meanwhile; a runtime still silent after the wait is reported as it is."""
        deadline = self._clock() + self.update_frequency
        while not self._report.node_health.settled() and self._clock() < deadline:
            await self._sleep(SETTLE_POLL)

    async def register(self) -> None:
        """Create the Node, or adopt the existing one (adding the labels it lacks); retries forever."""
        retry = Retrier(f"registering node {self.node_name}", initial=self._backoff_initial,
                        maximum=self._register_backoff_max, rng=self._rng, logger=log)
        while True:
            try:
                inputs = await self._inputs()
                try:
                    node = await self.client.create(NODES_PATH, initial_node(self.node_name, inputs))
                    self._last_status = compute_status(None, inputs)
                    self._last_write_at = self._clock()
                    self._evented_conditions = {}
                    if (node.get("status") or {}).get("conditions") is None:
                        self._last_write_at = None  # the server dropped the status: write it
                    log.info("registered node %s with the API server", self.node_name)
                except AlreadyExists:
                    node = await self.client.get(self.path)
                    labels = missing_labels(node, inputs)
                    if labels:
                        node = await self.client.patch(self.path, {"metadata": {"labels": labels}})
                        log.info("node %s was already registered; set labels %s", self.node_name, sorted(labels))
                    else:
                        log.info("node %s was already registered", self.node_name)
                    self._last_status = node.get("status") if isinstance(node.get("status"), dict) else None
                    self._last_write_at = None
                    self._evented_conditions = condition_statuses(self._last_status)
                self.node_uid = (node.get("metadata") or {}).get("uid", "")
                self.registered.set()
                return  # no recovery line from `retry`: "registered node" above says it
            except (ApiError, _InputsUnavailable) as e:
                await self._sleep(retry.failed(e))

    def reconcile_with_server(self) -> None:
        """Compares the next status with the Node the server holds rather than with what was last written.

        Called when the Lease lapsed: the node lifecycle controller may have set the conditions Unknown,
        which a comparison with our own last write would never notice until the next report (5 min)."""
        self._read_server_status = True

    async def sync_once(self) -> bool:
        """Compute the status and write it if needed; True when it was written."""
        if self._read_server_status:
            node = await self.client.get(self.path)
            server_status = node.get("status")
            self._last_status = server_status if isinstance(server_status, dict) else None
            self._read_server_status = False
            await self._hand_pod_cidr(node)
        elif self._on_pod_cidr is not None and not self.pod_cidr:
            try:  # best effort, like the kubelet's read of its Node: offline, the status below says how it goes
                node = await self.client.get(self.path)
            except ApiError as err:
                log.debug("cannot read the node for its pod CIDR: %s", err)
            else:
                await self._hand_pod_cidr(node)
        inputs = await self._inputs()
        status = compute_status(self._last_status, inputs)
        self._record_transitions(status)
        now = self._clock()
        changed = material_view(status) != material_view(self._last_status)
        due = self._last_write_at is None or now - self._last_write_at >= self.report_frequency
        if not changed and not due:
            return False
        body = dict(status)
        # Addresses merge by type in a strategic patch; a vanished address must go, so replace the list.
        body["addresses"] = [*status.get("addresses", []), {"$patch": "replace"}]
        await self.client.patch(f"{self.path}/status", {"status": body})
        self._last_status = status
        self._last_write_at = now
        self.last_write = now
        self.status_writes += 1
        if changed:
            log.debug("node status written (changed)")
        return True

    async def _hand_pod_cidr(self, node: Mapping[str, Any]) -> None:
        """The node's pod CIDR to the runtime, once assigned; a runtime that fails is asked again next sync."""
        cidrs = pod_cidrs(node)
        if not cidrs or cidrs == self.pod_cidr or self._on_pod_cidr is None:
            return
        try:
            await self._on_pod_cidr(cidrs)
        except EdgeletError as err:
            log.warning("cannot hand the pod CIDR %s to the runtime: %s", cidrs, err)
            return
        log.info("pod CIDR %s handed to the runtime", cidrs)
        self.pod_cidr = cidrs

    def _record_transitions(self, status: Mapping[str, Any]) -> None:
        """NodeReady, NodeHasSufficientMemory, ... once per condition change, written or not (offline too)."""
        current = condition_statuses(status)
        for event in condition_events(self.node_name, self._evented_conditions, current):
            self._recorder.event(node_ref(self.node_name), *event)
        self._evented_conditions = current

    async def _inputs(self) -> StatusInputs:
        report = self._report
        try:
            facts = await _resolve(report.facts())
            health = report.node_health.report()
            pressure = dict(report.pressure()) if report.pressure else None
            extended_resources = dict(report.extended_resources())
        except Exception as e:  # a provider's failure must cost one update, never the loop
            raise _InputsUnavailable(f"cannot gather node facts: {e}") from e
        try:
            self._runtime_version = await _resolve(report.runtime_version()) or self._runtime_version
        except Exception as e:  # noqa: BLE001 - runtime down: keep reporting the last version it told us
            log.debug("runtime version unavailable: %s", e)
        return StatusInputs(
            facts=facts,
            now=self._clock(),
            health=health,
            runtime_version=self._runtime_version,
            node_labels=self._node_labels,
            max_pods=report.max_pods,
            thresholds=report.thresholds,
            reserved=report.reserved,
            pressure=pressure,
            daemon_port=report.daemon_port,
            runtime_features=report.runtime_features(),
            register_taints=self._register_taints,
            extended_resources=extended_resources,
        )


class _InputsUnavailable(Exception):
    """A facts/health provider failed; the update is skipped and retried."""
