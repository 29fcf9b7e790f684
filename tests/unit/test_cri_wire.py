"""The CRI wire contract we rely on (field numbers the relist parser reads) and the client's pure decisions."""

from __future__ import annotations

import grpc
import pytest

from edgelet.cri import CRIError, NotFound, RuntimeUnavailable, create_in_flight, start_in_flight
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.cri.client import normalize_endpoint, translate_error
from edgelet.util.errors import PermanentError, TemporaryError

# (message, field) -> number, as runtime.v1 defines them; a changed number breaks every runtime.
WIRE_NUMBERS = {
    ("ListPodSandboxResponse", "items"): 1,
    ("PodSandbox", "id"): 1,
    ("PodSandbox", "metadata"): 2,
    ("PodSandbox", "state"): 3,
    ("PodSandbox", "created_at"): 4,
    ("PodSandbox", "labels"): 5,
    ("PodSandbox", "annotations"): 6,
    ("PodSandbox", "runtime_handler"): 7,
    ("PodSandboxMetadata", "name"): 1,
    ("PodSandboxMetadata", "uid"): 2,
    ("PodSandboxMetadata", "namespace"): 3,
    ("PodSandboxMetadata", "attempt"): 4,
    ("ListContainersResponse", "containers"): 1,
    ("Container", "id"): 1,
    ("Container", "pod_sandbox_id"): 2,
    ("Container", "metadata"): 3,
    ("Container", "image"): 4,
    ("Container", "image_ref"): 5,
    ("Container", "state"): 6,
    ("Container", "created_at"): 7,
    ("Container", "labels"): 8,
    ("Container", "annotations"): 9,
    ("Container", "image_id"): 10,
    ("ContainerMetadata", "name"): 1,
    ("ContainerMetadata", "attempt"): 2,
    ("ImageSpec", "image"): 1,
    ("ImageSpec", "user_specified_image"): 18,
    ("ContainerStatus", "exit_code"): 7,
    ("ContainerStatus", "reason"): 10,
    ("ContainerStatus", "image_id"): 17,
    ("LinuxContainerSecurityContext", "run_as_group"): 12,
    ("LinuxSandboxSecurityContext", "run_as_group"): 8,
    ("Mount", "recursive_read_only"): 8,
}


@pytest.mark.parametrize(("message", "field"), sorted(WIRE_NUMBERS))
def test_field_numbers_match_runtime_v1(message, field):
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.fields_by_name[field].number == WIRE_NUMBERS[message, field]


@pytest.mark.parametrize(
    ("enum", "values"),
    [
        ("ContainerState",
         {"CONTAINER_CREATED": 0, "CONTAINER_RUNNING": 1, "CONTAINER_EXITED": 2, "CONTAINER_UNKNOWN": 3}),
        ("PodSandboxState", {"SANDBOX_READY": 0, "SANDBOX_NOTREADY": 1}),
        ("NamespaceMode", {"POD": 0, "CONTAINER": 1, "NODE": 2, "TARGET": 3}),
    ],
)
def test_enum_values_match_runtime_v1(enum, values):
    descriptor = pb.DESCRIPTOR.enum_types_by_name[enum]
    assert {v.name: v.number for v in descriptor.values} == values


def test_package_and_services():
    assert pb.DESCRIPTOR.package == "runtime.v1"
    assert set(pb.DESCRIPTOR.services_by_name) == {"RuntimeService", "ImageService"}


ENDPOINT = "unix:///run/x.sock"


@pytest.mark.parametrize(
    ("code", "error_type", "retry"),
    [
        (grpc.StatusCode.UNAVAILABLE, RuntimeUnavailable, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, RuntimeUnavailable, True),
        (grpc.StatusCode.NOT_FOUND, NotFound, False),
        (grpc.StatusCode.UNKNOWN, CRIError, False),
        (grpc.StatusCode.INVALID_ARGUMENT, CRIError, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, CRIError, False),
    ],
)
def test_translate_error(code, error_type, retry):
    error = translate_error(ENDPOINT, "list_containers", code, "the details")
    assert type(error) is error_type
    assert isinstance(error, TemporaryError if retry else PermanentError)
    assert (error.operation, error.code, error.details) == ("list_containers", code.name, "the details")
    assert "list_containers" in str(error) and "the details" in str(error)


def test_unavailable_names_the_endpoint():
    error = translate_error(ENDPOINT, "version", grpc.StatusCode.UNAVAILABLE, None)
    assert error.endpoint == ENDPOINT
    assert ENDPOINT in str(error)


# containerd's words (pkg/cri/server) for a create or start that an earlier, abandoned request still runs.
RESERVED = ('failed to reserve container name "main_web_default_0a1b_0": name "main_web_default_0a1b_0" '
            'is reserved for "9eeb59a27ffc2"')
STARTING = 'failed to set starting state for container "9eeb59a27ffc2": container is already in starting state'


@pytest.mark.parametrize(
    ("error", "creating", "starting"),
    [
        (CRIError("create_container", "UNKNOWN", RESERVED), True, False),
        (CRIError("start_container", "UNKNOWN", STARTING), False, True),
        (CRIError("start_container", "UNKNOWN", "failed to create containerd task: context canceled"), False, False),
        (CRIError("remove_container", "UNKNOWN", "container is in starting state, can't be removed"), False, False),
        (NotFound("start_container", "NOT_FOUND", "an error occurred when try to find container"), False, False),
        (RuntimeUnavailable(ENDPOINT, "start_container", "UNAVAILABLE", STARTING), False, False),
        (ValueError(STARTING), False, False),
    ],
)
def test_a_request_still_in_flight_in_the_runtime_is_recognised(error, creating, starting):
    assert (create_in_flight(error), start_in_flight(error)) == (creating, starting)


@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("unix:///run/containerd/containerd.sock", "unix:///run/containerd/containerd.sock"),
        ("/run/containerd/containerd.sock", "unix:///run/containerd/containerd.sock"),
    ],
)
def test_normalize_endpoint(given, target):
    assert normalize_endpoint(given) == target


@pytest.mark.parametrize("given", ["", "unix://", "tcp://127.0.0.1:1234", "containerd.sock"])
def test_normalize_endpoint_rejects(given):
    with pytest.raises(ValueError, match="runtime endpoint"):
        normalize_endpoint(given)
