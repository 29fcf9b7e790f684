"""Relist benchmark: the compiled `_core` and the pure twin side by side on the same realistic
ListPodSandbox/ListContainers replies. Run `python bench/bench_core.py`; `bench_relist(n)` for one size."""

from __future__ import annotations

import argparse
import gc
import hashlib
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgelet import _core, _core_py  # both twins on purpose: the selector picks one
from edgelet.container import labels
from edgelet.cri import runtime_v1_pb2 as pb

CONTAINERS_PER_POD = 2
SIZES = (220, 1_000, 10_000)
CHANGED_FRACTION = 0.01
_BASE_TIME_NS = 1_700_000_000_000_000_000


def _hex_id(kind: str, i: int) -> str:
    return hashlib.sha256(f"{kind}/{i}".encode()).hexdigest()


def build_wire(n_containers: int, changed_every: int = 0, order_seed: int = 0) -> tuple[bytes, bytes]:
    """Wire bytes for n containers in pods of two (kubelet labels and annotations, 64-hex ids).

    With `changed_every`, every that-many-th container has exited instead of running. Items come
    in an order drawn from `order_seed`: containerd lists from a Go map, in a new order each time.
    """
    n_pods = (n_containers + CONTAINERS_PER_POD - 1) // CONTAINERS_PER_POD
    sandboxes, containers = [], []
    for p in range(n_pods):
        uid = f"5f2b3c1e-{p:04x}-4a7d-9e21-{p:012x}"
        pod_labels = {labels.POD_NAME: f"app-{p}", labels.POD_NAMESPACE: "default", labels.POD_UID: uid}
        sandbox_id = _hex_id("sandbox", p)
        sandboxes.append(
            pb.PodSandbox(
                id=sandbox_id,
                metadata=pb.PodSandboxMetadata(name=f"app-{p}", uid=uid, namespace="default", attempt=0),
                state=pb.SANDBOX_READY,
                created_at=_BASE_TIME_NS + p * 1_000_000,
                labels={**pod_labels, "app": f"app-{p}"},
                annotations={"kubernetes.io/config.source": "file", "kubernetes.io/config.seen": "2024-01-01"},
            )
        )
        for c in range(CONTAINERS_PER_POD):
            i = p * CONTAINERS_PER_POD + c
            if i >= n_containers:
                break
            exited = changed_every and i % changed_every == 0
            containers.append(
                pb.Container(
                    id=_hex_id("container", i),
                    pod_sandbox_id=sandbox_id,
                    metadata=pb.ContainerMetadata(name=f"main-{c}", attempt=0),
                    image=pb.ImageSpec(image="docker.io/library/busybox:1.36"),
                    image_ref="sha256:" + _hex_id("image", 0),
                    state=pb.CONTAINER_EXITED if exited else pb.CONTAINER_RUNNING,
                    created_at=_BASE_TIME_NS + i * 1_000_000 + 500,
                    labels={**pod_labels, labels.CONTAINER_NAME: f"main-{c}"},
                    annotations={
                        labels.CONTAINER_HASH: f"{i:016x}",
                        labels.CONTAINER_RESTART_COUNT: "0",
                        labels.TERMINATION_GRACE_PERIOD: "30",
                    },
                )
            )
    order = random.Random(order_seed)
    order.shuffle(sandboxes)
    order.shuffle(containers)
    return (
        pb.ListPodSandboxResponse(items=sandboxes).SerializeToString(),
        pb.ListContainersResponse(containers=containers).SerializeToString(),
    )


def _time_ms(call: Callable[[], object], budget_s: float = 0.4, repeats: int = 7) -> tuple[float, float]:
    """(best, median) milliseconds per call over `repeats` rounds, each running for ~budget/repeats."""
    call()  # warm up
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(budget_s / repeats / once))
    rounds = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(number):
                call()
            rounds.append((time.perf_counter() - start) / number * 1e3)
    finally:
        if gc_was_enabled:
            gc.enable()
    return min(rounds), statistics.median(rounds)


def bench_relist(n_containers: int) -> dict[str, float]:
    """Relist n containers with both twins: steady state (nothing changed since `old`) and ~1% changed.

    Returns best-of-repeats milliseconds per relist and the compiled speedup for each case.
    """
    first_sandboxes, first_containers = build_wire(n_containers, order_seed=1)
    sandboxes_wire, containers_wire = build_wire(n_containers, order_seed=2)
    changed_sandboxes, changed_containers = build_wire(
        n_containers, changed_every=int(1 / CHANGED_FRACTION), order_seed=3
    )
    result: dict[str, float] = {"n_containers": n_containers, "wire_bytes": len(sandboxes_wire) + len(containers_wire)}
    for name, impl in (("compiled", _core), ("pure", _core_py)):
        old, _ = impl.relist(None, first_sandboxes, first_containers)
        steady, steady_median = _time_ms(lambda impl=impl, old=old: impl.relist(old, sandboxes_wire, containers_wire))
        changed, _ = _time_ms(lambda impl=impl, old=old: impl.relist(old, changed_sandboxes, changed_containers))
        cold, _ = _time_ms(lambda impl=impl: impl.relist(None, sandboxes_wire, containers_wire))
        result[f"{name}_ms"] = steady
        result[f"{name}_median_ms"] = steady_median
        result[f"{name}_changed_ms"] = changed
        result[f"{name}_cold_ms"] = cold
    result["speedup"] = result["pure_ms"] / result["compiled_ms"]
    result["speedup_changed"] = result["pure_changed_ms"] / result["compiled_changed_ms"]
    result["speedup_cold"] = result["pure_cold_ms"] / result["compiled_cold_ms"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sizes", nargs="*", type=int, default=list(SIZES), help="container counts")
    args = parser.parse_args(argv)
    print("relist (ms per call, best of 7; steady = unchanged since old, 1% = 1% exited, cold = no old)")
    header = f"{'containers':>10} {'wire KiB':>9} | {'compiled':>8} {'pure':>8} {'x':>5} | "
    header += f"{'1% comp':>8} {'1% pure':>8} {'x':>5} | {'cold comp':>9} {'cold pure':>9} {'x':>5}"
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        r = bench_relist(n)
        print(
            f"{n:>10,} {r['wire_bytes'] / 1024:>9.0f} | {r['compiled_ms']:>8.3f} {r['pure_ms']:>8.2f} "
            f"{r['speedup']:>5.0f} | {r['compiled_changed_ms']:>8.3f} {r['pure_changed_ms']:>8.2f} "
            f"{r['speedup_changed']:>5.0f} | {r['compiled_cold_ms']:>9.3f} {r['pure_cold_ms']:>9.2f} "
            f"{r['speedup_cold']:>5.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
