"""Builds a generated `_pb2` module's descriptors, message classes and enums from its serialized file descriptor.

protoc's Python output hands the file to `google.protobuf.internal.builder`, which imports protobuf's whole
pure-Python message implementation (`descriptor_pool` imports `python_message`, which brings `text_format`, the
decoder and encoder, `containers` with `pickle`, and more) even when the upb runtime does all the work: 1.2 MiB of
an agent's memory for code it never runs. Under upb this module makes the same namespace from upb's own pool and
message metaclass, the objects protobuf's builder reaches through those imports; under any other implementation it
calls protobuf's builder itself. `tests/unit/test_protobuild.py` holds every name it makes, and the bytes of the
messages, to what protobuf's builder makes from the same descriptor.

`hack/gen-proto.sh` writes the `_pb2` modules that call `build_file`.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.internal import api_implementation
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.message import Message

__all__ = ["build_file"]

if api_implementation.Type() == "upb":
    # What protobuf's descriptor_pool.Default() and reflection.GeneratedProtocolMessageType are under upb
    # (cpp_message imports nothing more than api_implementation).
    from google.protobuf.pyext.cpp_message import GeneratedProtocolMessageType as _MESSAGE_TYPE

    _POOL = api_implementation._c_module.default_pool  # type: ignore[attr-defined]  # upb's own module, no stub
else:
    _MESSAGE_TYPE = _POOL = None


def build_file(serialized: bytes, module: dict[str, Any]) -> Any:
    """Adds the file descriptor `serialized` to the default pool and fills `module` (a `_pb2` module's globals)
    with what protoc's generated code makes: `_NAME` for each message, nested message, enum and service
    descriptor; each top-level enum's wrapper and its values; each message class, nested ones as its
    attributes. Classes are named by the module that built them, so they pickle. Returns the file descriptor,
    which the module keeps as `DESCRIPTOR`."""
    if _POOL is None:
        return _build_with_protobuf(serialized, module)
    file = _POOL.AddSerializedFile(serialized)
    for name, message in file.message_types_by_name.items():
        _add_descriptors(module, message, "_" + name.upper())
    for name, enum in file.enum_types_by_name.items():
        module["_" + name.upper()] = enum
        module[name] = EnumTypeWrapper(enum)
        for value in enum.values:
            module[value.name] = value.number
    for name, extension in file.extensions_by_name.items():
        module[name.upper() + "_FIELD_NUMBER"] = extension.number
        module[name] = extension
    for name, service in file.services_by_name.items():
        module["_" + name.upper()] = service
    for name, message in file.message_types_by_name.items():
        module[name] = _message_class(message, module["__name__"], "")
    return file


def _add_descriptors(module: dict[str, Any], message: Any, key: str) -> None:
    module[key] = message
    for name, nested in message.nested_types_by_name.items():
        _add_descriptors(module, nested, key + "_" + name.upper())
    for enum in message.enum_types:
        module[key + "_" + enum.name.upper()] = enum


def _message_class(message: Any, module_name: str, prefix: str) -> type:
    body: dict[str, Any] = {name: _message_class(nested, module_name, prefix + message.name + ".")
                            for name, nested in message.nested_types_by_name.items()}
    body["DESCRIPTOR"] = message
    body["__module__"] = module_name
    body["__qualname__"] = prefix + message.name
    return _MESSAGE_TYPE(message.name, (Message,), body)


def _build_with_protobuf(serialized: bytes, module: dict[str, Any]) -> Any:
    from google.protobuf import descriptor_pool
    from google.protobuf.internal import builder

    file = descriptor_pool.Default().AddSerializedFile(serialized)
    builder.BuildMessageAndEnumDescriptors(file, module)
    builder.BuildTopDescriptorsAndMessages(file, module["__name__"], module)
    return file
