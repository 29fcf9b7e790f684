"""The static CPU policy on synthetic machines: cpuset syntax, topology, best-fit allocation, reserved CPUs,
the kubelet's admission failure, init-container reuse and the checks on recorded state."""

import pytest

from edgelet.cm.cpumanager.policy import (
    CPUAllocationError,
    CPUState,
    CPUStateError,
    StaticPolicy,
    guaranteed_cpus,
    initial_state,
    take_by_topology,
    validate_state,
)
from edgelet.cm.topology import build_topology, topology_from_cpus
from edgelet.config import ConfigError, parse_config
from edgelet.util.cpuset import format_cpuset, parse_cpuset

# 2 sockets x 8 cores x 2 threads; core c of socket s is CPUs s*8+c and s*8+c+16.
DUAL_HT = build_topology(2, 8, 2)
# 1 socket x 4 cores x 2 threads: cores {0,4} {1,5} {2,6} {3,7}.
SINGLE_HT = build_topology(1, 4, 2)
# This machine's kind: 2 CPUs, no SMT.
TWO = build_topology(1, 2, 1)


def cpus(text: str) -> frozenset[int]:
    return parse_cpuset(text)


# -- cpuset syntax ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("", set()), ("0", {0}), ("0-3", {0, 1, 2, 3}), ("0-2,5,7-8", {0, 1, 2, 5, 7, 8}), (" 1 , 3 ", {1, 3}),
    ("4,1", {1, 4}),
])
def test_parse_cpuset(text, expected):
    assert parse_cpuset(text) == expected


@pytest.mark.parametrize("text, problem", [
    ("a", "is not a CPU list"), ("1-", "is not a CPU list"), ("3-1", "not an ascending range"),
    ("0-999999", "not an ascending range"), ("1,,2", "is not a CPU list"), ("-1", "is not a CPU list"),
])
def test_parse_cpuset_rejects(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_cpuset(text)


@pytest.mark.parametrize("values, text", [
    (set(), ""), ({0}, "0"), ({0, 1, 2, 5}, "0-2,5"), ({7, 3, 4, 5, 9}, "3-5,7,9"), ({1, 3}, "1,3"),
])
def test_format_cpuset_round_trips(values, text):
    assert format_cpuset(values) == text
    assert parse_cpuset(text) == values


# -- topology ----------------------------------------------------------------------------------------

def test_synthetic_topology_numbers_siblings_like_linux():
    assert len(DUAL_HT.cpus) == 32 and DUAL_HT.sockets == [0, 1]
    assert DUAL_HT.cpus_per_core == 2 and DUAL_HT.cpus_per_socket == 16
    assert DUAL_HT.cpus_in_core(0) == {0, 16}
    assert DUAL_HT.cpus_in_core(9) == {9, 25}
    assert DUAL_HT.cpus_in_socket(1) == cpus("8-15,24-31")


def test_topology_from_sysfs_entries_uses_lowest_sibling_as_core_id():
    # Two sockets whose sysfs core_id values both start at 0: the core is named by its first CPU.
    topology = topology_from_cpus({
        0: (0, cpus("0,2"), 0), 1: (1, cpus("1,3"), 1), 2: (0, cpus("0,2"), 0), 3: (1, cpus("1,3"), 1),
    })
    assert topology.cpus_in_core(0) == {0, 2} and topology.cpus_in_core(1) == {1, 3}
    assert topology.cpus_in_socket(1) == {1, 3}
    assert topology.cpus[3].numa_node == 1


def test_topology_ignores_offline_siblings_and_unknown_socket():
    topology = topology_from_cpus({0: (-1, cpus("0-1"), 0)})  # CPU 1 offline; package id -1 on some ARM boards
    assert topology.cpus_in_core(0) == {0} and topology.sockets == [0]


# -- best-fit allocation ----------------------------------------------------------------------------------

TAKE_CASES = [
    ("one CPU from an empty machine: the first", DUAL_HT, DUAL_HT.all_cpus, 1, "0"),
    ("two CPUs: a whole core, both threads", DUAL_HT, DUAL_HT.all_cpus, 2, "0,16"),
    ("one CPU fills a partly used core first", DUAL_HT, DUAL_HT.all_cpus - {0}, 1, "16"),
    ("three CPUs: a core, then a thread beside it", DUAL_HT, DUAL_HT.all_cpus, 3, "0-1,16"),
    ("eight CPUs: four whole cores on one socket", DUAL_HT, DUAL_HT.all_cpus, 8, "0-3,16-19"),
    ("sixteen CPUs: a whole socket", DUAL_HT, DUAL_HT.all_cpus, 16, "0-7,16-23"),
    ("a whole socket and one thread of the other", DUAL_HT, DUAL_HT.all_cpus, 17, "0-8,16-23"),
    ("cores pack onto the socket already in use", DUAL_HT, DUAL_HT.all_cpus - cpus("0-3,16-19"), 2, "4,20"),
    ("whole socket skipped when partly used", DUAL_HT, DUAL_HT.all_cpus - {0}, 16, "8-15,24-31"),
    ("split cores only when no whole core is left", SINGLE_HT, cpus("0,1,5,6"), 2, "1,5"),
    ("threads of the fullest socket first", SINGLE_HT, cpus("0,2,4,6"), 1, "0"),
    ("zero CPUs", DUAL_HT, DUAL_HT.all_cpus, 0, ""),
    ("no SMT: lowest ids", TWO, TWO.all_cpus, 1, "0"),
]


@pytest.mark.parametrize("topology, available, count, expected",
                         [case[1:] for case in TAKE_CASES], ids=[case[0] for case in TAKE_CASES])
def test_take_by_topology(topology, available, count, expected):
    assert take_by_topology(topology, frozenset(available), count) == cpus(expected)


def test_take_more_than_available_fails_with_the_kubelets_message():
    with pytest.raises(CPUAllocationError, match=r"^not enough cpus available to satisfy request: "
                                                  r"requested=5, available=4$"):
        take_by_topology(SINGLE_HT, cpus("0,2,4,6"), 5)


# -- pods ------------------------------------------------------------------------------------------------

def container(name, cpu=None, memory="64Mi", limits=True, **extra):
    resources = {}
    if cpu is not None:
        resources = {"requests": {"cpu": cpu, "memory": memory}}
        if limits:
            resources["limits"] = {"cpu": cpu, "memory": memory}
    return {"name": name, "image": "busybox", "resources": resources, **extra}


def pod(uid, *containers, init=()):
    spec = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"name": uid, "namespace": "default", "uid": uid}, "spec": spec}


@pytest.mark.parametrize("case, the_pod, expected", [
    ("Guaranteed, integer CPU", pod("u", container("a", "2")), 2),
    ("Guaranteed, 1000m is an integer", pod("u", container("a", "1000m")), 1),
    ("Guaranteed, fractional CPU", pod("u", container("a", "1500m")), 0),
    ("Burstable: requests without limits", pod("u", container("a", "2", limits=False)), 0),
    ("BestEffort", pod("u", container("a")), 0),
    ("Guaranteed, limits only (requests default to them)",
     pod("u", {"name": "a", "image": "b", "resources": {"limits": {"cpu": 3, "memory": "1Gi"}}}), 3),
])
def test_guaranteed_cpus(case, the_pod, expected):
    assert guaranteed_cpus(the_pod, the_pod["spec"]["containers"][0]) == expected


def test_burstable_pods_get_nothing_exclusive():
    policy = StaticPolicy(DUAL_HT)
    start = initial_state("static", DUAL_HT)
    assert policy.allocate(start, pod("p", container("a", "2"), container("b"))) == start


def test_exclusive_cpus_leave_the_shared_pool():
    policy = StaticPolicy(DUAL_HT, reserved=cpus("0,16"))
    state = policy.allocate(initial_state("static", DUAL_HT), pod("p1", container("a", "2"), container("b", "500m")))
    assert state.assigned("p1", "a") == {1, 17}  # the reserved core is never taken
    assert state.assigned("p1", "b") is None  # a fractional CPU is shared, even in a Guaranteed pod
    assert state.default == DUAL_HT.all_cpus - {1, 17}
    assert policy.cpuset(state, "p1", "b") == state.default
    assert policy.cpuset(state, "p1", "a") == {1, 17}


def test_allocation_is_idempotent_and_removal_frees():
    policy = StaticPolicy(SINGLE_HT, reserved=cpus("0"))
    the_pod = pod("p1", container("a", "2"))
    state = policy.allocate(initial_state("static", SINGLE_HT), the_pod)
    assert policy.allocate(state, the_pod) == state
    assert state.without_pod("p1") == initial_state("static", SINGLE_HT)


def test_reserved_cpus_count_against_availability():
    policy = StaticPolicy(SINGLE_HT, reserved=cpus("0,4"))
    with pytest.raises(CPUAllocationError, match="requested=7, available=6"):
        policy.allocate(initial_state("static", SINGLE_HT), pod("p", container("a", "7")))


def test_without_reserved_cpus_one_cpu_stays_shared():
    policy = StaticPolicy(TWO)
    state = policy.allocate(initial_state("static", TWO), pod("g1", container("a", "1")))
    assert state.assigned("g1", "a") == {1} and state.default == {0}
    with pytest.raises(CPUAllocationError, match="requested=1, available=0"):
        policy.allocate(state, pod("g2", container("a", "1")))


def test_failed_pod_allocation_takes_nothing():
    policy = StaticPolicy(SINGLE_HT, reserved=cpus("0"))
    start = initial_state("static", SINGLE_HT)
    with pytest.raises(CPUAllocationError):
        policy.allocate(start, pod("p", container("a", "4"), container("b", "4")))
    # The policy is pure: the caller keeps `start`, nothing of container a leaked into it.
    assert start.assignments == {} and start.default == SINGLE_HT.all_cpus


def test_init_container_cpus_are_reused_by_app_containers():
    policy = StaticPolicy(SINGLE_HT, reserved=cpus("0,4"))
    the_pod = pod("p", container("app", "2"), init=[container("setup", "2")])
    state = policy.allocate(initial_state("static", SINGLE_HT), the_pod)
    assert state.assigned("p", "app") == state.assigned("p", "setup") == {1, 5}
    assert state.default == cpus("0,2-4,6-7")


def test_sidecar_cpus_are_not_reused():
    policy = StaticPolicy(SINGLE_HT, reserved=cpus("0,4"))
    sidecar = container("proxy", "2", restartPolicy="Always")
    state = policy.allocate(initial_state("static", SINGLE_HT), pod("p", container("app", "2"), init=[sidecar]))
    assert not state.assigned("p", "app") & state.assigned("p", "proxy")


@pytest.mark.parametrize("reserved, problem", [
    (cpus("9"), "not online CPUs"), (cpus("0-7"), "leave no CPU"),
])
def test_bad_reserved_cpus(reserved, problem):
    with pytest.raises(CPUStateError, match=problem):
        StaticPolicy(SINGLE_HT, reserved)


# -- recorded state ------------------------------------------------------------------------------------------

def state(default, entries=None, policy="static"):
    return CPUState(policy, cpus(default), {uid: {n: cpus(c) for n, c in ctrs.items()}
                                            for uid, ctrs in (entries or {}).items()})


VALID = state("0,2-4,6-7", {"p": {"a": "1,5"}})


@pytest.mark.parametrize("recorded, reserved, problem", [
    (state("0-7", {"p": {"a": "1"}}), cpus("0"),
     r'pod: p, container: a cpuset: "1" overlaps with default cpuset "0-7"'),
    (state("1-7"), cpus("0"), r'not all reserved cpus: "0" are present in defaultCpuSet: "1-7"'),
    (state("0-3"), cpus("0"), r'current set of available CPUs "0-7" doesn\'t match with CPUs in state "0-3"'),
    (state("0-9"), cpus("0"), r"doesn't match with CPUs in state \"0-9\""),
    (state("0,2-4,6-7", {"p": {"a": "1,5"}}, policy="other"), cpus("0"),
     r'configured policy "static" differs from state checkpoint policy "other"'),
])
def test_validate_state_refuses_what_does_not_fit(recorded, reserved, problem):
    with pytest.raises(CPUStateError, match=problem):
        validate_state(recorded, "static", SINGLE_HT, reserved)


@pytest.mark.parametrize("recorded, expected", [
    (VALID, VALID),
    (state(""), initial_state("static", SINGLE_HT)),  # empty state: start fresh
    (state("0-7", policy="none"), initial_state("static", SINGLE_HT)),  # none -> static without assignments
])
def test_validate_state_accepts(recorded, expected):
    assert validate_state(recorded, "static", SINGLE_HT, cpus("0")) == expected


# -- configuration -------------------------------------------------------------------------------------------

def test_cpu_config_defaults_and_values():
    assert parse_config({}).cpu.policy == "none"
    config = parse_config({"cpu": {"policy": "static", "reserved_cpus": "0,2-3", "reconcile_period": "5s"}})
    assert config.cpu.reserved == {0, 2, 3} and config.cpu.reconcile_period == 5


@pytest.mark.parametrize("table, key, problem", [
    ({"policy": "dynamic"}, "cpu.policy", "must be one of none, static"),
    ({"reserved_cpus": "0-a"}, "cpu.reserved_cpus", "is not a CPU list"),
    ({"reserved_cpus": 0}, "cpu.reserved_cpus", "expected a string"),
])
def test_cpu_config_errors_name_the_key(table, key, problem):
    with pytest.raises(ConfigError, match=problem) as error:
        parse_config({"cpu": table}, "edgelet.toml")
    assert error.value.key == key
