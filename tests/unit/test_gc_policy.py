"""Garbage-collection policies as pure functions: image GC thresholds and order, container and sandbox
eviction with the kubelet's defaults, pod log directories."""

from __future__ import annotations

import pytest

from edgelet.container.runtime import ContainerState, SandboxState
from edgelet.images.gc import ImageInfo, bytes_to_free, select_images_to_remove, validate_thresholds
from edgelet.kuberuntime.gc import (
    GCContainer,
    GCPolicy,
    GCSandbox,
    pod_uid_of_log_dir,
    select_containers_to_remove,
    select_log_dirs_to_remove,
    select_sandboxes_to_remove,
)

GIB = 1 << 30
CAPACITY = 100 * GIB


@pytest.mark.parametrize(
    ("used", "high", "low", "to_free"),
    [
        (84 * GIB, 85, 80, 0),  # under the high threshold
        (85 * GIB, 85, 80, 5 * GIB),  # at it: down to 80 %
        (95 * GIB, 85, 80, 15 * GIB),
        # The kubelet's integer percent, 100 - floor(available %): 84.01 % used counts as 85 %.
        (int(84.01 * GIB), 85, 80, 20 * GIB - (CAPACITY - int(84.01 * GIB))),
        (int(83.99 * GIB), 85, 80, 0),
        (40 * GIB, 0, 0, 40 * GIB),  # thresholds at 0: free everything
        (100 * GIB, 100, 90, 10 * GIB),
        (99 * GIB, 100, 90, 0),
    ],
)
def test_bytes_to_free(used, high, low, to_free):
    assert bytes_to_free(used, CAPACITY, high, low) == to_free


def test_bytes_to_free_without_capacity():
    assert bytes_to_free(0, 0, 85, 80) == 0


@pytest.mark.parametrize(("high", "low"), [(101, 80), (85, -1), (80, 85)])
def test_invalid_thresholds(high, low):
    with pytest.raises(ValueError, match="threshold"):
        validate_thresholds(high, low)


IMAGES = [
    ImageInfo("sha256:old", 3 * GIB, first_seen=0),
    ImageInfo("sha256:mid", 3 * GIB, first_seen=10),
    ImageInfo("sha256:new", 3 * GIB, first_seen=20),
    ImageInfo("sha256:pinned", 3 * GIB, pinned=True, first_seen=0),
    ImageInfo("sha256:busy", 3 * GIB, first_seen=0),
    ImageInfo("sha256:young", 3 * GIB, first_seen=990),
]


ALL_UNUSED = ["sha256:old", "sha256:mid", "sha256:new", "sha256:young"]


def chosen(**overrides) -> list[str]:
    arguments = dict(
        images=IMAGES,
        in_use={"sha256:busy"},
        last_used={},
        usage=90 * GIB,
        capacity=CAPACITY,
        high=85,
        low=80,
        now=1000,
        min_age=120,
    )
    arguments.update(overrides)
    return [image.id for image in select_images_to_remove(**arguments)]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # 10 GiB to free from 90 % down to 80 %; "young" is within min_age, "busy" and "pinned" never go.
        ({}, ["sha256:old", "sha256:mid", "sha256:new"]),
        ({"usage": 84 * GIB}, []),
        ({"usage": 86 * GIB}, ["sha256:old", "sha256:mid"]),  # 6 GiB to free: two images
        ({"usage": 85 * GIB}, ["sha256:old", "sha256:mid"]),  # 5 GiB: the second completes it
        # Least recently used goes first; never used counts as oldest.
        (
            {"usage": 86 * GIB, "last_used": {"sha256:old": 500, "sha256:mid": 400}},
            ["sha256:new", "sha256:mid"],
        ),
        # min_age protects images seen recently; 0 lets even those go.
        ({"usage": 100 * GIB, "min_age": 0}, ALL_UNUSED),
        # Thresholds at 0 % free all they can, but never an image in use or pinned.
        ({"usage": 20 * GIB, "min_age": 0, "high": 0, "low": 0}, ALL_UNUSED),
        ({"in_use": {"sha256:old", "sha256:mid", "sha256:new", "sha256:busy"}}, []),
    ],
)
def test_select_images_to_remove(overrides, expected):
    assert chosen(**overrides) == expected


NS = 1_000_000_000


def dead(cid: str, uid: str, name: str, created_s: int, state=ContainerState.EXITED, sandbox="s1") -> GCContainer:
    return GCContainer(cid, uid, name, sandbox, state, created_s * NS)


CONTAINERS = [
    dead("a0", "pod-a", "app", 10),
    dead("a1", "pod-a", "app", 20),
    dead("a2", "pod-a", "app", 30),
    dead("a3", "pod-a", "app", 40, ContainerState.RUNNING),
    dead("s0", "pod-a", "sidecar", 15),
    dead("s1", "pod-a", "sidecar", 25, ContainerState.CREATED),
    dead("u0", "pod-a", "unknown", 5, ContainerState.UNKNOWN),
    dead("g0", "pod-gone", "app", 10, sandbox="s9"),
    dead("g1", "pod-gone", "app", 20, sandbox="s9"),
]


def removed_ids(containers=CONTAINERS, active=frozenset({"pod-a"}), policy=GCPolicy(), now_s=1000, ready=True):
    return sorted(c.id for c in select_containers_to_remove(containers, set(active), policy, now_s * NS, ready))


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # Defaults: every container of a gone pod; otherwise the newest dead one per name stays.
        ({}, ["a0", "a1", "g0", "g1", "s0"]),
        # Until every source has been read, unknown pods keep their newest too.
        ({"ready": False}, ["a0", "a1", "g0", "s0"]),
        ({"policy": GCPolicy(max_per_pod_container=2)}, ["a0", "g0", "g1"]),
        ({"policy": GCPolicy(max_per_pod_container=0)}, ["a0", "a1", "a2", "g0", "g1", "s0", "s1", "u0"]),
        ({"policy": GCPolicy(max_per_pod_container=-1)}, ["g0", "g1"]),
        # min_age: containers created in the last 975 s are too young to go.
        ({"policy": GCPolicy(min_age=975)}, ["a0", "g0", "g1", "s0"]),
        # A global cap: one per (pod, name) first, then the oldest overall.
        ({"policy": GCPolicy(max_per_pod_container=-1, max_containers=2)}, ["a0", "a1", "g0", "g1", "s0", "u0"]),
        ({"active": frozenset()}, ["a0", "a1", "a2", "g0", "g1", "s0", "s1", "u0"]),
    ],
)
def test_select_containers_to_remove(kwargs, expected):
    assert removed_ids(**kwargs) == expected


def test_running_containers_are_never_removed():
    assert "a3" not in removed_ids(active=frozenset(), policy=GCPolicy(max_per_pod_container=0, max_containers=0))


def sandbox(sid: str, uid: str, created_s: int, ready: bool = False) -> GCSandbox:
    return GCSandbox(sid, uid, SandboxState.READY if ready else SandboxState.NOTREADY, created_s * NS)


SANDBOXES = [
    sandbox("a-old", "pod-a", 10),
    sandbox("a-mid", "pod-a", 20),
    sandbox("a-new", "pod-a", 30),
    sandbox("b-old", "pod-b", 10),
    sandbox("b-new", "pod-b", 20, ready=True),
    sandbox("g-old", "pod-gone", 10),
    sandbox("g-new", "pod-gone", 20),
    sandbox("h-ready", "pod-gone-ready", 10, ready=True),
]


@pytest.mark.parametrize(
    ("with_containers", "active", "expected"),
    [
        # Existing pods keep their newest sandbox; gone pods keep none; ready ones always stay.
        (set(), {"pod-a", "pod-b"}, ["a-mid", "a-old", "b-old", "g-new", "g-old"]),
        # A sandbox that still holds containers stays.
        ({"a-old", "g-new"}, {"pod-a", "pod-b"}, ["a-mid", "b-old", "g-old"]),
        (set(), set(), ["a-mid", "a-new", "a-old", "b-old", "g-new", "g-old"]),
    ],
)
def test_select_sandboxes_to_remove(with_containers, active, expected):
    assert sorted(s.id for s in select_sandboxes_to_remove(SANDBOXES, with_containers, active)) == expected


@pytest.mark.parametrize(
    ("name", "uid"),
    [
        ("default_web_0d3c6a4e-1111-2222-3333-444455556666", "0d3c6a4e-1111-2222-3333-444455556666"),
        ("kube-system_dns-1_abc", "abc"),
        ("no-underscores", ""),
        ("one_underscore", ""),
    ],
)
def test_pod_uid_of_log_dir(name, uid):
    assert pod_uid_of_log_dir(name) == uid


def test_select_log_dirs_to_remove():
    names = ["default_web_uid-live", "default_old_uid-gone", "default_dying_uid-dying", "stray"]
    chosen_dirs = select_log_dirs_to_remove(names, active_pod_uids={"uid-live"}, pods_in_runtime={"uid-dying"})
    assert chosen_dirs == ["default_old_uid-gone"]


def test_take_until_stops_once_enough_is_freed():
    from edgelet.images.gc import ImageInfo, take_until

    images = [ImageInfo("a", 10), ImageInfo("b", 20), ImageInfo("c", 30)]
    assert [i.id for i in take_until(images, 0)] == []
    assert [i.id for i in take_until(images, 10)] == ["a"]
    assert [i.id for i in take_until(images, 11)] == ["a", "b"]
    assert [i.id for i in take_until(images, 1000)] == ["a", "b", "c"]


def test_removal_candidates_skip_busy_pinned_and_young_images():
    from edgelet.images.gc import ImageInfo, removal_candidates

    images = [ImageInfo("busy", 1, first_seen=0), ImageInfo("pinned", 1, pinned=True, first_seen=0),
              ImageInfo("young", 1, first_seen=95), ImageInfo("old-used", 1, first_seen=0),
              ImageInfo("never-used", 1, first_seen=0)]
    chosen = removal_candidates(images, {"busy"}, {"old-used": 50.0}, now=100, min_age=10)
    assert [i.id for i in chosen] == ["never-used", "old-used"]
