"""The node Lease heartbeat: `kube-node-lease/<node>` renewed every `renew_interval`, as the kubelet does,
on a schedule of its own (a random phase, which a late renewal does not move).

A conflicting update re-reads the Lease and retries; an unreachable API server is retried with
jittered backoff (capped at the renew interval) so the heartbeat resumes as soon as it returns. The
Lease is owned by the Node; when the Node is deleted and registered again, the owner follows its new uid.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from edgelet.api.kubetime import format_micro_time
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import AlreadyExists, ApiError, Conflict, NotFound
from edgelet.util.retry import Retrier

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
_MAX_UPDATE_RETRIES = 5
# The kubelet's renew loop jitters each period by up to 4 %.
_RENEW_JITTER = 0.04


def next_renewal(previous_due: float | None, now: float, interval: float, phase: float) -> float:
    """When the next renewal is due (monotonic seconds): after the first, `phase` (0..1) of an interval
    later; then `interval` after the previous one was due, not after it finished, skipping the slots a
    stall or an outage let pass. The kubelet counts from when a renewal finished, so every apiserver stall
    leaves the renewals it held up finishing together and renewing together from then on, and nodes
    started together renew together. Here each node keeps a phase of its own, drawn at random, so a
    fleet's heartbeats stay spread (after an outage too, from the second renewal on)."""
    if previous_due is None:
        return now + phase * interval
    due = previous_due + interval
    if due <= now:
        due += (int((now - due) // interval) + 1) * interval
    return due


def renewed_lease(base: dict[str, Any] | None, node_name: str, duration: int, now: float, node_uid: str) -> dict[str,
                                                                                                                 Any]:
    """`base` (or a new Lease) held by this node with renewTime `now` and, once the Node's uid is
    known, owned by that Node (and no older one) so that deleting the Node deletes its Lease."""
    lease: dict[str, Any] = copy.deepcopy(base) if base else {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node_name, "namespace": LEASE_NAMESPACE},
    }
    spec = lease.setdefault("spec", {})
    spec["holderIdentity"] = node_name
    spec["leaseDurationSeconds"] = duration
    spec["renewTime"] = format_micro_time(now)
    meta = lease.setdefault("metadata", {})
    if node_uid:
        others = [ref for ref in meta.get("ownerReferences") or [] if not _is_node_ref(ref, node_name)]
        meta["ownerReferences"] = [*others, {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}]
    return lease


def _is_node_ref(ref: Any, node_name: str) -> bool:
    return isinstance(ref, dict) and ref.get("kind") == "Node" and ref.get("name") == node_name


class LeaseController:
    def __init__(
        self,
        client: ApiClient,
        node_name: str,
        *,
        duration: float = 40,
        renew_interval: float = 10,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff_initial: float = 0.2,
        backoff_max: float = 7.0,
        node_uid: Callable[[], str] | None = None,
        on_lapse_ended: Callable[[], None] | None = None,
    ):
        """`node_uid()` is the registered Node's uid ("" until registered); without it the Lease reads the
        Node once to learn it. `on_lapse_ended()` is called after a renewal that follows failed ones or
        comes later than the Lease's duration: the node lifecycle controller may have marked the Node
        Unknown meanwhile."""
        self.client = client
        self.node_name = node_name
        self.duration = int(duration)
        self.renew_interval = renew_interval
        self.renewals = 0
        self.last_renew = 0.0  # clock() of the last successful renewal
        self.last_renew_took = 0.0  # seconds the last successful renewal took (the API server's load shows there)
        self._clock = clock
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._lease: dict[str, Any] | None = None
        self._node_uid = ""
        self._node_uid_provider = node_uid
        self._on_lapse_ended = on_lapse_ended

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{self.node_name}"

    async def run(self) -> None:
        retry = Retrier("renewing the node lease", initial=self._backoff_initial,
                        maximum=min(self._backoff_max, self.renew_interval), rng=self._rng, logger=log)
        due: float | None = None
        while True:
            previous = self.last_renew
            started = time.monotonic()
            try:
                await self.renew()
            except ApiError as e:
                await self._sleep(retry.failed(e))
                continue
            self.last_renew_took = time.monotonic() - started
            lapsed = previous and self.last_renew - previous > self.duration
            if (retry.succeeded() or lapsed) and self._on_lapse_ended is not None:
                self._on_lapse_ended()
            period = self.renew_interval * (1 + self._rng.uniform(0, _RENEW_JITTER))
            due = next_renewal(due, time.monotonic(), period, self._rng.random())
            await self._sleep(min(due - time.monotonic(), period))

    async def renew(self) -> None:
        """One renewal: create the Lease if missing, else PUT it with its resourceVersion; a
        409 re-reads it and tries again (a few times, then the caller backs off)."""
        if self._node_uid_provider is not None:
            self._node_uid = self._node_uid_provider()
        elif not self._node_uid:
            await self._learn_node_uid()
        for _ in range(_MAX_UPDATE_RETRIES):
            if self._lease is None:
                self._lease = await self._get()
            if self._lease is None:
                fresh = renewed_lease(None, self.node_name, self.duration, self._clock(), self._node_uid)
                try:
                    self._lease = await self.client.create(self.path.rsplit("/", 1)[0], fresh)
                except AlreadyExists:
                    continue  # created by someone else meanwhile: read it next round
                self._record()
                return
            lease = renewed_lease(self._lease, self.node_name, self.duration, self._clock(), self._node_uid)
            try:
                self._lease = await self.client.replace(self.path, lease)
            except (Conflict, NotFound):
                self._lease = None  # changed or deleted by someone else: re-read and retry
                continue
            self._record()
            return
        raise Conflict(409, "Conflict", f"the lease kept changing during {_MAX_UPDATE_RETRIES} attempts", method="PUT",
                       path=self.path)

    async def _get(self) -> dict[str, Any] | None:
        try:
            return await self.client.get(self.path)
        except NotFound:
            return None

    def _record(self) -> None:
        self.renewals += 1
        self.last_renew = self._clock()

    async def _learn_node_uid(self) -> None:
        try:
            node = await self.client.get(f"/api/v1/nodes/{self.node_name}")
        except ApiError as e:
            # Not registered yet (or not readable): the Lease gets its owner on a later renewal.
            log.debug("node %s not readable for the lease owner reference: %s", self.node_name, e)
            return
        self._node_uid = (node.get("metadata") or {}).get("uid", "")
