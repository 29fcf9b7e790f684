"""The device manager's decisions without I/O: resource names, which devices each container gets (init-container
reuse, sidecars, restarts, the kubelet's refusals), the node's capacity, preferred allocations, the merge of Allocate
answers into a container's config, and the checkpoint's format."""

import pytest

from edgelet.cm.devicemanager import deviceplugin_v1beta1_pb2 as api
from edgelet.cm.devicemanager.allocation import (
    AllocationError,
    Assignment,
    ResourceCount,
    admission_message,
    extended_requests,
    is_extended_resource_name,
    missing_resource_problem,
    node_resources,
    plan_pod,
    prefer,
    resource_name_error,
    run_options,
)
from edgelet.cm.devicemanager.checkpoint import DeviceState, decode_state, encode_state
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.kuberuntime.container import add_device_options

CAM = "example.com/camera"
TPU = "example.com/tpu"


def container(name, *, limits=None, requests=None, restart_policy=None):
    c = {"name": name, "image": "busybox", "resources": {}}
    if limits:
        c["resources"]["limits"] = limits
    if requests:
        c["resources"]["requests"] = requests
    if restart_policy:
        c["restartPolicy"] = restart_policy
    return c


def pod(uid, containers, init=(), source=None):
    meta = {"name": f"p-{uid}", "namespace": "default", "uid": uid}
    if source:
        meta["annotations"] = {"kubernetes.io/config.source": source}
    return {"metadata": meta, "spec": {"containers": list(containers), "initContainers": list(init)}}


def ids(plan):
    return {c: {r: a.device_ids for r, a in resources.items()} for c, resources in plan.items()}


@pytest.mark.parametrize("name, ok", [
    ("example.com/camera", True),
    ("vendor.io/gpu-1", True),
    ("camera", False),                      # no domain: a native resource name
    ("kubernetes.io/camera", False),        # the kubernetes.io domain is native
    ("example.kubernetes.io/x", False),
    ("requests.example.com/x", False),
    ("example.com/" + "x" * 64, False),     # name part over 63
    ("Example_com/x", False),               # the prefix must be a DNS subdomain
    ("example.com/-x", False),
])
def test_extended_resource_names(name, ok):
    assert is_extended_resource_name(name) is ok
    assert (resource_name_error(name) is None) is ok


@pytest.mark.parametrize("resources, expected", [
    ({"limits": {CAM: "2"}}, {CAM: 2}),
    ({"requests": {CAM: 1}}, {CAM: 1}),
    ({"requests": {CAM: "1"}, "limits": {CAM: "3"}}, {CAM: 3}),  # the limits count, as the kubelet reads them
    ({"limits": {"cpu": "2", "memory": "1Gi", CAM: "0"}}, {}),
    ({"limits": {CAM: "bogus"}}, {}),
])
def test_extended_requests(resources, expected):
    assert extended_requests({"name": "c", "resources": resources}) == expected


HEALTHY = {CAM: frozenset({"cam0", "cam1", "cam2"}), TPU: frozenset({"tpu0"})}

# (name, pods already holding devices, the pod, healthy devices, expected plan or the error's start)
PLANS = [
    ("one container, lowest ids first", {}, pod("a", [container("c", limits={CAM: "2"})]), HEALTHY,
     {"c": {CAM: ("cam0", "cam1")}}),
    ("two resources", {}, pod("a", [container("c", limits={CAM: "1", TPU: "1"})]), HEALTHY,
     {"c": {CAM: ("cam0",), TPU: ("tpu0",)}}),
    ("others' devices are taken", {"b": {"c": {CAM: Assignment(("cam0", "cam2"))}}},
     pod("a", [container("c", limits={CAM: "1"})]), HEALTHY, {"c": {CAM: ("cam1",)}}),
    ("two app containers never share", {},
     pod("a", [container("c1", limits={CAM: "2"}), container("c2", limits={CAM: "1"})]), HEALTHY,
     {"c1": {CAM: ("cam0", "cam1")}, "c2": {CAM: ("cam2",)}}),
    ("an init container's devices are reused by the app container", {},
     pod("a", [container("c", limits={CAM: "2"})], init=[container("i", limits={CAM: "2"})]), HEALTHY,
     {"i": {CAM: ("cam0", "cam1")}, "c": {CAM: ("cam0", "cam1")}}),
    ("reuse first, then free devices", {},
     pod("a", [container("c", limits={CAM: "3"})], init=[container("i", limits={CAM: "1"})]), HEALTHY,
     {"i": {CAM: ("cam0",)}, "c": {CAM: ("cam0", "cam1", "cam2")}}),
    ("reused once only: the second app container gets others", {},
     pod("a", [container("c1", limits={CAM: "1"}), container("c2", limits={CAM: "1"})],
         init=[container("i", limits={CAM: "1"})]), HEALTHY,
     {"i": {CAM: ("cam0",)}, "c1": {CAM: ("cam0",)}, "c2": {CAM: ("cam1",)}}),
    ("a sidecar keeps its devices: the app container gets others", {},
     pod("a", [container("c", limits={CAM: "1"})], init=[container("s", limits={CAM: "1"}, restart_policy="Always")]),
     HEALTHY, {"s": {CAM: ("cam0",)}, "c": {CAM: ("cam1",)}}),
    ("a restarted pod keeps what it holds", {"a": {"c": {CAM: Assignment(("cam2",), b"x")}}},
     pod("a", [container("c", limits={CAM: "1"})]), HEALTHY, {"c": {CAM: ("cam2",)}}),
    ("held devices need no plugin (a reboot before the plugin is back)",
     {"a": {"c": {CAM: Assignment(("cam2",), b"x")}}}, pod("a", [container("c", limits={CAM: "1"})]), {},
     {"c": {CAM: ("cam2",)}}),
    ("resources no plugin ever offered are not the device manager's", {},
     pod("a", [container("c", limits={"other.io/x": "1"})]), HEALTHY, {}),
    ("too many", {}, pod("a", [container("c", limits={CAM: "4"})]), HEALTHY,
     "requested number of devices unavailable for example.com/camera. Requested: 4, Available: 3"),
    ("too many with others' devices taken", {"b": {"c": {CAM: Assignment(("cam0",))}}},
     pod("a", [container("c", limits={CAM: "3"})]), HEALTHY,
     "requested number of devices unavailable for example.com/camera. Requested: 3, Available: 2"),
    ("two app containers over the total", {},
     pod("a", [container("c1", limits={CAM: "2"}), container("c2", limits={CAM: "2"})]), HEALTHY,
     "requested number of devices unavailable for example.com/camera. Requested: 2, Available: 1"),
    ("plugin away: none healthy", {}, pod("a", [container("c", limits={CAM: "1"})]), {CAM: frozenset()},
     "no healthy devices present; cannot allocate unhealthy devices example.com/camera"),
    ("known from the checkpoint only", {"b": {"c": {CAM: Assignment(("cam0",))}}},
     pod("a", [container("c", limits={CAM: "1"})]), {}, "cannot allocate unregistered device example.com/camera"),
    ("a changed request", {"a": {"c": {CAM: Assignment(("cam0",))}}},
     pod("a", [container("c", limits={CAM: "2"})]), HEALTHY,
     "pod 'a' container 'c' changed request for resource 'example.com/camera' from 1 to 2"),
]


@pytest.mark.parametrize("name, held, the_pod, healthy, expected", PLANS, ids=[p[0] for p in PLANS])
def test_plan_pod(name, held, the_pod, healthy, expected):
    if isinstance(expected, str):
        with pytest.raises(AllocationError) as refused:
            plan_pod(the_pod, held, healthy=healthy)
        assert str(refused.value) == expected
    else:
        assert ids(plan_pod(the_pod, held, healthy=healthy)) == expected


def test_plan_keeps_recorded_answers():
    held = {"a": {"c": {CAM: Assignment(("cam1",), b"answer")}}}
    assert plan_pod(pod("a", [container("c", limits={CAM: "1"})]), held, healthy=HEALTHY)["c"][CAM].response == \
        b"answer"


def test_admission_message_is_the_kubelets():
    assert admission_message(AllocationError("requested number of devices unavailable for x/y. Requested: 2, "
                                             "Available: 1")) == (
        "Allocate failed due to requested number of devices unavailable for x/y. Requested: 2, Available: 1, "
        "which is unexpected")


@pytest.mark.parametrize("containers, known, expected", [
    ([container("c", limits={CAM: "1"})], {CAM}, None),
    ([container("c", limits={"other.io/x": "2"})], {CAM},
     ("other.io/x", "Node didn't have enough resource: other.io/x, requested: 2, used: 0, capacity: 0")),
    ([container("c", limits={"cpu": "1"})], set(), None),
])
def test_missing_resources(containers, known, expected):
    assert missing_resource_problem(pod("a", containers), lambda name: name not in known) == expected


@pytest.mark.parametrize("assigned, preferred, available, must, expected", [
    (("cam0", "cam1"), ["cam2", "cam1"], {"cam1", "cam2"}, [], ("cam2", "cam1")),
    (("cam0",), ["cam9"], {"cam1"}, [], ("cam0",)),                         # not available: the plan stands
    (("cam0", "cam1"), ["cam2"], {"cam2"}, ["cam1"], ("cam1", "cam2")),     # a reused device stays
    (("cam0",), [], {"cam1"}, [], ("cam0",)),
])
def test_prefer(assigned, preferred, available, must, expected):
    assert prefer(assigned, preferred, available=available, must_include=must) == expected


def test_node_resources():
    devices = {CAM: {"cam0": "Healthy", "cam1": "Unhealthy", "cam2": "Healthy"}, TPU: {"tpu0": "Healthy"}}
    assert node_resources(devices, serving=frozenset({CAM}), removed=["gone.io/x"]) == {
        CAM: ResourceCount(3, 2), TPU: ResourceCount(1, 0), "gone.io/x": ResourceCount(0, 0)}


def response(**fields):
    return api.ContainerAllocateResponse(**fields)


def test_run_options_merge_and_conflicts():
    first = response(envs={"CAM": "0", "SHARED": "a"}, mounts=[api.Mount(container_path="/lib/x", host_path="/h/x",
                                                                         read_only=True)],
                     devices=[api.DeviceSpec(container_path="/dev/cam0", host_path="/dev/video0", permissions="rw")],
                     annotations={"a": "1"}, cdi_devices=[api.CDIDevice(name="example.com/camera=cam0")])
    second = response(envs={"SHARED": "b", "TPU": "0"},
                      devices=[api.DeviceSpec(container_path="/dev/cam0", host_path="/dev/video0", permissions="rw")],
                      cdi_devices=[api.CDIDevice(name="example.com/camera=cam0"), api.CDIDevice(name="x.io/t=1")])
    options = run_options([first, second])
    assert options.envs == [("CAM", "0"), ("SHARED", "a"), ("TPU", "0")]
    assert options.mounts == [("/lib/x", "/h/x", True)]
    assert options.devices == [("/dev/cam0", "/dev/video0", "rw")]
    assert options.annotations == {"a": "1"}
    assert options.cdi_devices == ["example.com/camera=cam0", "x.io/t=1"]
    assert options.conflicts == ["environment variable SHARED"]


def test_device_options_in_the_cri_config():
    config = pb.ContainerConfig(envs=[pb.KeyValue(key="CAM", value="mine")],
                                mounts=[pb.Mount(container_path="/data", host_path="/v")],
                                annotations={"io.kubernetes.container.hash": "h"})
    options = run_options([response(envs={"CAM": "0"}, mounts=[api.Mount(container_path="/lib", host_path="/h")],
                                    devices=[api.DeviceSpec(container_path="/dev/c", host_path="/dev/null",
                                                            permissions="rwm")],
                                    annotations={"io.kubernetes.container.hash": "x", "vendor": "v"},
                                    cdi_devices=[api.CDIDevice(name="example.com/camera=cam0")])])
    add_device_options(config, options)
    # The plugin's variables and mounts first: the container's own variable of the same name wins in the runtime.
    assert [(e.key, e.value) for e in config.envs] == [("CAM", "0"), ("CAM", "mine")]
    assert [m.container_path for m in config.mounts] == ["/lib", "/data"]
    assert [(d.container_path, d.host_path, d.permissions) for d in config.devices] == [("/dev/c", "/dev/null", "rwm")]
    assert dict(config.annotations) == {"io.kubernetes.container.hash": "h", "vendor": "v"}
    assert [d.name for d in config.CDI_devices] == ["example.com/camera=cam0"]
    # CDI_devices is field 17, as upstream numbers it.
    assert pb.ContainerConfig.DESCRIPTOR.fields_by_name["CDI_devices"].number == 17


def test_checkpoint_round_trip():
    state = DeviceState({"u1": {"c": {CAM: Assignment(("cam0", "cam1"), response(envs={"A": "1"}).SerializeToString())},
                               "i": {TPU: Assignment(("tpu0",))}}},
                        {CAM: ["cam0", "cam1", "cam2"]})
    assert decode_state(encode_state(state)) == state


@pytest.mark.parametrize("payload, problem", [
    (b"[]", "Data: expected an object"),
    (b'{"Data": {"PodDeviceEntries": {}}}', "Data.PodDeviceEntries: expected a list"),
    (b'{"Data": {"PodDeviceEntries": [{"PodUID": "u", "ContainerName": "c"}]}}', "must be non-empty strings"),
    (b'{"Data": {"PodDeviceEntries": [{"PodUID": "u", "ContainerName": "c", "ResourceName": "r", '
     b'"DeviceIDs": [1]}]}}', "DeviceIDs: expected a list of strings"),
    (b'{"Data": {"PodDeviceEntries": [{"PodUID": "u", "ContainerName": "c", "ResourceName": "r", '
     b'"DeviceIDs": [], "AllocResp": "!!"}]}}', "AllocResp: not base64"),
    (b'{"Data": {"RegisteredDevices": {"r": "x"}}}', "RegisteredDevices.r: expected a list of strings"),
])
def test_checkpoint_refuses_what_it_cannot_read(payload, problem):
    with pytest.raises(ValueError, match=problem.replace(".", r"\.").replace("[", r"\[")):
        decode_state(payload)


def test_node_status_carries_the_extended_resources():
    from edgelet.nodestatus.setters import NodeInfo, StatusInputs, set_capacity

    node: dict = {}
    set_capacity(node, StatusInputs(facts=NodeInfo(hostname="n", cpu_count=2, memory_bytes=2 << 30), now=0.0,
                                    extended_resources={CAM: (3, 2), "gone.io/x": (0, 0)}))
    assert node["status"]["capacity"][CAM] == "3" and node["status"]["allocatable"][CAM] == "2"
    # A resource whose plugin left for good reads 0: a strategic merge patch would otherwise keep the old count.
    assert node["status"]["capacity"]["gone.io/x"] == "0" and node["status"]["allocatable"]["gone.io/x"] == "0"
    assert node["status"]["capacity"]["cpu"] == "2"


def test_describe_node_shows_the_device_resources():
    from edgelet.cli.describe import describe_node

    devices = {CAM: {"capacity": 3, "allocatable": 2, "plugin": "/dp/cam.sock"},
               TPU: {"capacity": 1, "allocatable": 0, "plugin": ""}}
    text = describe_node("edge-1", None, [], 0.0, devices=devices)
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert lines[1:8] == ["Capacity:", f"{CAM}: 3", f"{TPU}: 1", "Allocatable:", f"{CAM}: 2", f"{TPU}: 0",
                          "Device Plugins:"]
    assert f"{TPU}: <not registered>" in lines


@pytest.mark.parametrize("resources, problem", [
    ({"limits": {CAM: "1"}}, None),
    ({"limits": {CAM: "2"}, "requests": {CAM: "2"}}, None),
    ({"limits": {CAM: "500m"}}, ("spec.containers[0].resources.limits.example.com/camera", "must be an integer")),
    ({"requests": {CAM: "1"}}, ("spec.containers[0].resources.limits.example.com/camera",
                                "Limit must be set for non overcommitable resources")),
    ({"requests": {CAM: "1"}, "limits": {CAM: "2"}},
     ("spec.containers[0].resources.requests.example.com/camera", "must be equal to example.com/camera limit")),
])
def test_manifests_ask_for_whole_devices_as_the_api_wants(resources, problem):
    from edgelet.podconfig.validation import validate_pod

    the_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "default", "uid": "u"},
               "spec": {"restartPolicy": "Always", "containers": [
                   {"name": "main", "image": "busybox", "imagePullPolicy": "Never", "resources": resources}]}}
    assert validate_pod(the_pod) == ([problem] if problem else [])
