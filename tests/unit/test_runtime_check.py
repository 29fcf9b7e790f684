"""How often housekeeping asks the runtime's Status: every 5 s as the kubelet does, every 30 s while the runtime's
container events flow and it said it was ready (a runtime that goes away breaks their stream, which brings the 5 s
check back at once)."""

from __future__ import annotations

from edgelet.config import SyncConfig
from edgelet.kubelet.syncloop import EVENTED_RUNTIME_CHECK_INTERVAL, RUNTIME_CHECK_INTERVAL, SyncLoop


class Pleg:
    mode = "generic"


class RuntimeState:
    def __init__(self, clock, ready: list[bool]):
        self.clock = clock
        self.answers = iter(ready)  # what each Status call says
        self.ready = False
        self.checked_at: list[float] = []

    async def check(self) -> None:
        self.checked_at.append(self.clock())
        self.ready = next(self.answers, True)

    def health(self) -> tuple[bool, str]:
        return self.ready, "ok" if self.ready else "container runtime not ready: NetworkReady=false"


class Sources:
    @staticmethod
    def all_sources_ready() -> bool:
        return False  # housekeeping stops after the check and the heap trim


class Trimmer:
    @staticmethod
    def maybe_trim(now: float) -> None:
        pass


async def housekeep(steps: list[tuple[float, str]], ready: tuple[bool, ...] = ()) -> list[float]:
    """Housekeeping at each (time, PLEG mode), the runtime answering `ready` (then ready); the times it was asked."""
    now = [0.0]
    pleg, state = Pleg(), RuntimeState(lambda: now[0], list(ready))
    loop = SyncLoop(SyncConfig(), max_pods=110, pod_manager=None, pod_config=Sources(), pleg=pleg, workers=None,
                    syncer=None, prober=None, probe_results=None, status=None, runtime_state=state, volumes=None,
                    log_rotator=None, recorder=None, on_runtime_ready=None, heap_trimmer=Trimmer(),
                    clock=lambda: now[0])
    for at, mode in steps:
        now[0], pleg.mode = at, mode
        await loop._housekeeping()
    return state.checked_at


def every_2s(until: float, mode: str, start: float = 0.0) -> list[tuple[float, str]]:
    return [(start + 2.0 * i, mode) for i in range(int((until - start) / 2.0) + 1)]


async def test_the_generic_pleg_checks_the_runtime_every_5s_as_the_kubelet():
    assert RUNTIME_CHECK_INTERVAL == 5.0
    assert await housekeep(every_2s(20, "generic")) == [0.0, 6.0, 12.0, 18.0]


async def test_while_events_flow_the_check_slows_and_a_lost_stream_brings_it_back_at_once():
    assert EVENTED_RUNTIME_CHECK_INTERVAL == 30.0
    steps = every_2s(64, "evented") + every_2s(76, "generic", start=66)
    # 0 and 30 and 60 while events flow; the stream lost at 66, six seconds after the last check: asked at once.
    assert await housekeep(steps) == [0.0, 30.0, 60.0, 66.0, 72.0]


async def test_a_runtime_not_ready_is_asked_every_5s_while_events_flow():
    """Its CNI configuration still loading at start, say: the node must not wait 30 s to see it ready."""
    assert await housekeep(every_2s(50, "evented"), ready=(False, False)) == [0.0, 6.0, 12.0, 42.0]
