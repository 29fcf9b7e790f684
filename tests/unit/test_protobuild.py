"""edgelet.util.protobuild against protobuf's own builder: the same names and the same message bytes, per _pb2 module.

Each side runs in a fresh interpreter, because protobuf caches a message class per descriptor: in one process the
second builder would hand back the first one's classes. "ours" imports the _pb2 module (edgelet.util.protobuild);
"library" reads the module's serialized descriptor from its source without importing it and calls
`google.protobuf.internal.builder`, as protoc's generated code does (with the real module name, as ours uses).
Both run under upb (the wheels' runtime) and under protobuf's pure-Python implementation (our fallback).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MODULES = ["edgelet.cri.runtime_v1_pb2", "edgelet.prober.health_v1_pb2", "edgelet.tunnel.konnectivity_pb2",
           "edgelet.cm.devicemanager.deviceplugin_v1beta1_pb2", "edgelet.podresources.podresources_v1_pb2"]

_SIDE = r'''
import ast, importlib, json, pathlib, sys
from google.protobuf.internal import api_implementation
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.message import Message

side, name, path = sys.argv[1:]
if side == "ours":
    namespace = vars(importlib.import_module(name))
else:
    from google.protobuf import descriptor_pool
    from google.protobuf.internal import builder
    call = next(node.value for node in ast.parse(pathlib.Path(path).read_text()).body
                if isinstance(node, ast.Assign) and node.targets[0].id == "DESCRIPTOR")
    namespace = {"__name__": name}
    namespace["DESCRIPTOR"] = descriptor_pool.Default().AddSerializedFile(ast.literal_eval(call.args[0]))
    builder.BuildMessageAndEnumDescriptors(namespace["DESCRIPTOR"], namespace)
    builder.BuildTopDescriptorsAndMessages(namespace["DESCRIPTOR"], name, namespace)


def describe(value):
    if isinstance(value, type) and issubclass(value, Message):
        nested = {key: describe(getattr(value, key)) for key in value.DESCRIPTOR.nested_types_by_name}
        return ["message", value.__module__, value.__qualname__, value.DESCRIPTOR.full_name, nested]
    if isinstance(value, EnumTypeWrapper):
        return ["enum", value.DESCRIPTOR.full_name, list(value.items())]
    if isinstance(value, int):
        return ["int", value]
    return [type(value).__name__, getattr(value, "full_name", getattr(value, "name", None))]


def fill(message, depth):
    """Sets every field of `message`, nested messages to `depth` levels, maps and repeated fields twice."""
    for field in message.DESCRIPTOR.fields:
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            target = getattr(message, field.name)
            for n in (1, 2):
                key = scalar(entry.fields_by_name["key"], n)
                value_field = entry.fields_by_name["value"]
                if value_field.message_type is None:
                    target[key] = scalar(value_field, n)
                elif depth:
                    fill(target[key], depth - 1)
        elif entry is not None:
            if not depth:
                continue
            if repeated(field):
                for _ in (1, 2):
                    fill(getattr(message, field.name).add(), depth - 1)
            else:
                fill(getattr(message, field.name), depth - 1)
        elif repeated(field):
            getattr(message, field.name).extend([scalar(field, 1), scalar(field, 2)])
        else:
            setattr(message, field.name, scalar(field, 1))
    return message


def repeated(field):
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED


def scalar(field, n):
    if field.enum_type is not None:
        return field.enum_type.values[-1].number
    if field.cpp_type == field.CPPTYPE_STRING:
        return b"\x00\xff" * n if field.type == field.TYPE_BYTES else f"{field.name}-\u00e9{n}"
    if field.cpp_type == field.CPPTYPE_BOOL:
        return True
    if field.cpp_type in (field.CPPTYPE_FLOAT, field.CPPTYPE_DOUBLE):
        return 1.5 * n
    if field.cpp_type in (field.CPPTYPE_INT32, field.CPPTYPE_INT64):
        return -field.number * 1000 * n
    return field.number * 1000 * n


def classes(cls):
    yield cls
    for key, nested in cls.DESCRIPTOR.nested_types_by_name.items():
        if not nested.GetOptions().map_entry:
            yield from classes(getattr(cls, key))


names = {key: describe(value) for key, value in namespace.items() if not key.startswith("__") and key != "_protobuild"}
wire = {}
for key in namespace["DESCRIPTOR"].message_types_by_name:
    for cls in classes(namespace[key]):
        message = fill(cls(), 3)
        data = message.SerializeToString(deterministic=True)
        assert cls.FromString(data) == message, cls
        assert data or not cls.DESCRIPTOR.fields, cls  # every field was set
        wire[cls.DESCRIPTOR.full_name] = data.hex()
print(json.dumps({"implementation": api_implementation.Type(), "names": names, "wire": wire}))
'''


def side(which: str, module: str, implementation: str) -> dict:
    path = REPO / (module.replace(".", "/") + ".py")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": implementation}
    done = subprocess.run([sys.executable, "-c", _SIDE, which, module, str(path)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["implementation"] == implementation
    return result


@pytest.mark.parametrize("implementation", ["upb", "python"])
@pytest.mark.parametrize("module", MODULES)
def test_the_module_has_the_names_and_bytes_protobufs_builder_makes(module, implementation):
    ours, library = side("ours", module, implementation), side("library", module, implementation)
    assert ours["names"] == library["names"]
    assert ours["wire"] == library["wire"]
    assert len(ours["wire"]) >= 2


def test_the_cri_module_builds_what_the_agent_reads():
    ours = side("ours", "edgelet.cri.runtime_v1_pb2", "upb")["names"]
    assert ours["PodSandboxConfig"][:4] == ["message", "edgelet.cri.runtime_v1_pb2", "PodSandboxConfig",
                                           "runtime.v1.PodSandboxConfig"]
    assert ours["PodSandboxConfig"][4]["LabelsEntry"][2] == "PodSandboxConfig.LabelsEntry"
    assert ours["CONTAINER_RUNNING"] == ["int", 1]
    assert ours["ContainerState"][0:2] == ["enum", "runtime.v1.ContainerState"]
    assert ours["_RUNTIMESERVICE"] == ["ServiceDescriptor", "runtime.v1.RuntimeService"]


_SAME_OBJECTS = r'''
from edgelet.util import protobuild
from google.protobuf import descriptor_pool, reflection
assert protobuild._POOL is descriptor_pool.Default()
assert protobuild._MESSAGE_TYPE is reflection.GeneratedProtocolMessageType
'''


def test_under_upb_the_pool_and_metaclass_are_the_ones_protobuf_uses():
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "upb"}
    done = subprocess.run([sys.executable, "-c", _SAME_OBJECTS], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_message_class_pickles_by_its_module():
    import pickle

    from edgelet.cri import runtime_v1_pb2 as pb

    message = pb.PodSandboxConfig(hostname="h", labels={"a": "b"})
    assert pickle.loads(pickle.dumps(message)) == message
