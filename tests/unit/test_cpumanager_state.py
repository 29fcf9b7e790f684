"""The CPU manager's checkpoint: JSON round trip, damaged and impossible files, and what the manager
does with them at start; admission, cpusets and release survive a restart."""

import logging

import orjson
import pytest

from edgelet.cm.cpumanager import CPUManager, CPUStateError, CPUStateStore
from edgelet.cm.cpumanager.policy import CPUState
from edgelet.cm.cpumanager.state import decode_state, encode_state
from edgelet.cm.topology import build_topology
from edgelet.container.runtime import PodRuntimeStatus
from edgelet.util.cpuset import parse_cpuset

FOUR = build_topology(1, 4, 1)


def guaranteed_pod(uid, cpu="1"):
    resources = {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}}
    return {"metadata": {"name": uid, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "app", "image": "busybox", "resources": resources}]}}


def manager(tmp_path, policy="static", topology=FOUR, reserved="0", pods=()):
    return CPUManager(policy, CPUStateStore(str(tmp_path)), runtime=None, active_pods=lambda: list(pods),
                      runtime_status=lambda uid: PodRuntimeStatus(uid=uid), topology=topology,
                      reserved=parse_cpuset(reserved))


def test_encode_decode_round_trip_in_the_kubelets_shape():
    state = CPUState("static", parse_cpuset("0,3"), {"uid-1": {"app": parse_cpuset("1-2")}})
    payload = encode_state(state)
    assert orjson.loads(payload) == {"policyName": "static", "defaultCpuSet": "0,3",
                                     "entries": {"uid-1": {"app": "1-2"}}}
    assert decode_state(payload) == state


@pytest.mark.parametrize("payload, problem", [
    (b"{", "not JSON"),
    (b"[]", "expected a JSON object"),
    (b'{"defaultCpuSet": "0"}', "policyName"),
    (b'{"policyName": "static", "defaultCpuSet": "x"}', "defaultCpuSet: 'x' is not a CPU list"),
    (b'{"policyName": "static", "defaultCpuSet": "0", "entries": {"u": {"a": 1}}}', "entries.u.a: expected"),
    (b'{"policyName": "static", "defaultCpuSet": "0", "entries": {"u": []}}', "entries.u: expected"),
])
def test_decode_names_what_is_wrong(payload, problem):
    with pytest.raises(ValueError, match=problem):
        decode_state(payload)


def test_assignments_survive_a_restart(tmp_path):
    first = manager(tmp_path, pods=[guaranteed_pod("g1")])
    first.start()
    assert first.admit(guaranteed_pod("g1", "2")) == (True, "", "")
    exclusive = first.cpuset_for(guaranteed_pod("g1"), {"name": "app"})
    assert len(parse_cpuset(exclusive)) == 2 and "0" not in parse_cpuset(exclusive)

    second = manager(tmp_path)
    second.start()
    assert second.state == first.state
    assert second.cpuset_for(guaranteed_pod("g1"), {"name": "app"}) == exclusive
    shared = parse_cpuset(second.cpuset_for(guaranteed_pod("b1"), {"name": "other"}))
    assert shared == FOUR.all_cpus - parse_cpuset(exclusive)

    second.remove("g1")
    third = manager(tmp_path)
    third.start()
    assert third.cpuset_for(guaranteed_pod("b1"), {"name": "other"}) == "0-3"


def test_admission_failure_carries_the_kubelets_reason_and_message(tmp_path):
    cpu_manager = manager(tmp_path)
    cpu_manager.start()
    assert cpu_manager.admit(guaranteed_pod("g1", "4")) == (
        False, "UnexpectedAdmissionError",
        "Allocate failed due to not enough cpus available to satisfy request: requested=4, available=3, "
        "which is unexpected")
    assert cpu_manager.state.assignments == {}


def test_damaged_checkpoint_is_set_aside_and_the_manager_starts_fresh(tmp_path, caplog):
    first = manager(tmp_path)
    first.start()
    first.allocate(guaranteed_pod("g1"))
    path = first._store.path
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0x01  # a bit flip in the payload
    open(path, "wb").write(bytes(data))

    second = manager(tmp_path)
    with caplog.at_level(logging.WARNING):
        second.start()
    assert "checksum mismatch" in caplog.text
    assert second.state.assignments == {} and second.state.default == FOUR.all_cpus
    assert list((tmp_path / "cpumanager" / "corrupt").iterdir())


def test_state_of_another_machine_refuses_to_start_with_advice(tmp_path):
    first = manager(tmp_path, topology=build_topology(1, 8, 1))
    first.start()
    first.allocate(guaranteed_pod("g1"))
    second = manager(tmp_path)  # four CPUs now
    with pytest.raises(CPUStateError) as error:
        second.start()
    message = str(error.value)
    assert "cpu_manager_state.ckpt" in message and "doesn't match" in message and "drain this node" in message


@pytest.mark.parametrize("payload", [b'{"policyName": "static", "defaultCpuSet": 7}', b"null", b"[]"])
def test_valid_checksum_with_content_of_the_wrong_shape_is_damage_not_a_refusal(tmp_path, payload, caplog):
    # Like byte damage: set aside with one warning naming the file, and the agent starts.
    CPUStateStore(str(tmp_path))._store.write("cpu_manager_state", payload)
    started = manager(tmp_path)
    started.start()
    assert started.state.assignments == {} and started.state.default == FOUR.all_cpus
    (aside,) = (tmp_path / "cpumanager" / "corrupt").iterdir()
    assert aside.read_bytes().endswith(payload)
    assert [r.getMessage() for r in caplog.records if "cpu_manager_state" in r.getMessage()
            and "damaged" in r.getMessage()]


def test_policy_none_pins_nothing_and_refuses_static_assignments(tmp_path):
    static = manager(tmp_path)
    static.start()
    static.allocate(guaranteed_pod("g1"))
    none = manager(tmp_path, policy="none")
    with pytest.raises(CPUStateError, match='configured policy "none" differs from state checkpoint policy "static"'):
        none.start()

    fresh = manager(tmp_path / "other", policy="none")
    fresh.start()
    assert fresh.admit(guaranteed_pod("g1")) == (True, "", "")
    assert fresh.cpuset_for(guaranteed_pod("g1"), {"name": "app"}) == ""
    assert not (tmp_path / "other" / "cpumanager" / "cpu_manager_state.ckpt").exists()


class FullDiskStore(CPUStateStore):
    def save(self, state):
        raise OSError(28, "No space left on device")


def test_unwritable_state_rejects_the_allocation(tmp_path):
    cpu_manager = CPUManager("static", FullDiskStore(str(tmp_path)), runtime=None, active_pods=list,
                             runtime_status=lambda uid: PodRuntimeStatus(uid=uid), topology=FOUR)
    cpu_manager.start()  # the first write fails too: remembered and retried, the agent keeps starting
    ok, reason, message = cpu_manager.admit(guaranteed_pod("g1"))
    assert not ok and reason == "UnexpectedAdmissionError"
    assert "cannot record the CPU assignment" in message and "No space left" in message
    assert cpu_manager.state.assignments == {}


def test_reserved_cpus_of_another_machine_name_the_setting(tmp_path):
    with pytest.raises(CPUStateError, match=r"\[cpu\] reserved_cpus: reserved CPUs \"7\" are not online CPUs"):
        manager(tmp_path, reserved="7").start()


def test_the_pod_resources_cpus(tmp_path):
    """What the pod resources API reports: a container's exclusive CPUs, and the CPUs pods may get (the reserved
    ones left out; none under the "none" policy, as the kubelet answers)."""
    static = manager(tmp_path / "static", reserved="0")
    static.start()
    assert static.allocatable_cpus() == parse_cpuset("1-3")
    assert static.admit(guaranteed_pod("g1", "2")) == (True, "", "")
    assert len(static.exclusive_cpus("g1", "app")) == 2 and 0 not in static.exclusive_cpus("g1", "app")
    assert static.allocatable_cpus() == parse_cpuset("1-3")
    assert static.exclusive_cpus("g1", "other") == frozenset()
    none = manager(tmp_path / "none", policy="none")
    none.start()
    assert none.allocatable_cpus() == frozenset() and none.exclusive_cpus("g1", "app") == frozenset()
