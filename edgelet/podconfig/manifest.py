"""Manifest files (YAML or JSON, one or many documents) -> static pods plus the ConfigMaps and Secrets beside them."""

from __future__ import annotations

import ast
import base64
import binascii
import datetime
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from edgelet import yamlload
from edgelet.api import podutil
from edgelet.api.limits import MAX_DEPTH, document_problem
from edgelet.podconfig.defaults import apply_defaults, make_static
from edgelet.podconfig.schema import LIST, OBJECTS, unknown_fields
from edgelet.podconfig.validation import Problems, configmap_key_error, validate_object_meta, validate_pod
from edgelet.util.errors import ConfigError, YAMLError

_LIST_KINDS = ("List", "PodList")
_OBJECT_KINDS = ("Pod", "ConfigMap", "Secret")
# Beyond any real pod list (the API server stores objects of at most 1.5 MB); it keeps a stray disk image in
# the manifest directory from eating the memory: a 3 MB YAML list already takes 160 MB while it is parsed.
MAX_MANIFEST_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ManifestObjects:
    """What one or more manifests hold, each object defaulted and validated."""

    pods: tuple[dict[str, Any], ...] = ()
    configmaps: tuple[dict[str, Any], ...] = ()
    secrets: tuple[dict[str, Any], ...] = ()

    @staticmethod
    def merge(parts: Iterable[ManifestObjects]) -> ManifestObjects:
        pods: list[dict[str, Any]] = []
        configmaps: list[dict[str, Any]] = []
        secrets: list[dict[str, Any]] = []
        for part in parts:
            pods.extend(part.pods)
            configmaps.extend(part.configmaps)
            secrets.extend(part.secrets)
        return ManifestObjects(tuple(pods), tuple(configmaps), tuple(secrets))


def publish_objects(new: ManifestObjects, old: ManifestObjects | None,
                    on_objects: Callable[[list[dict[str, Any]]], None] | None) -> None:
    """Hand a source's ConfigMaps and Secrets to `on_objects` when they differ from what it last handed over."""
    if on_objects is None:
        return
    if old is None or (new.configmaps, new.secrets) != (old.configmaps, old.secrets):
        on_objects([*new.configmaps, *new.secrets])


@dataclass(slots=True)
class _Collector:
    path: str
    node_name: str
    source: str
    location: str
    seen: str | None
    pods: list[dict[str, Any]] = field(default_factory=list)
    configmaps: list[dict[str, Any]] = field(default_factory=list)
    secrets: list[dict[str, Any]] = field(default_factory=list)


def load_manifest_file(path: str, node_name: str) -> ManifestObjects:
    """Read and check one manifest file; any problem raises ConfigError naming the file and the field."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read manifest: {exc.strerror or exc}") from None
    return parse_manifest(data, path, node_name)


def parse_manifest(data: bytes, path: str, node_name: str, *, source: str = podutil.SOURCE_FILE,
                   location: str | None = None, seen: str | None = None) -> ManifestObjects:
    """Parse manifest bytes; `path` names the input in errors, `location` (default: path) feeds static uids."""
    documents = [doc for doc in _decode(data, path) if doc is not None]
    collector = _Collector(path, node_name, source, location or path, seen)
    for index, document in enumerate(documents):
        where = f"document {index + 1}: " if len(documents) > 1 else ""
        if problem := document_problem(document):
            raise ConfigError(path, f"{where}{problem[0]}".rstrip(": "), problem[1])
        # _plain builds a new object: the decoded `written` stays as the user wrote it, for the error messages.
        written, document = document, _plain(document, path, where)
        if not isinstance(document, dict):
            got = type(document).__name__
            raise ConfigError(path, where.rstrip(": "), f"expected an object with a kind, got {got}")
        kind = document.get("kind")
        if kind in _LIST_KINDS:
            if problems := unknown_fields(document, LIST):
                raise manifest_error(path, where, problems)
            items = document.get("items")
            if not isinstance(items, list):
                raise ConfigError(path, f"{where}items", f"a {kind} needs a list of items")
            for item_index, item in enumerate(items):
                if not isinstance(item, dict):
                    raise ConfigError(path, f"{where}items[{item_index}]", "must be an object")
                allowed = ("Pod",) if kind == "PodList" else _OBJECT_KINDS
                _add_object(collector, item, f"{where}items[{item_index}].", allowed=allowed,
                            written=written["items"][item_index])
        else:
            _add_object(collector, document, where, allowed=_OBJECT_KINDS, written=written)
    return ManifestObjects(tuple(collector.pods), tuple(collector.configmaps), tuple(collector.secrets))


def _decode(data: bytes, path: str) -> list[Any]:
    if len(data) > MAX_MANIFEST_BYTES:
        raise ConfigError(path, "", f"manifest is {len(data)} bytes or more, more than the {MAX_MANIFEST_BYTES} "
                                    "bytes allowed")
    text = _text(data, path)
    json_error = None
    if text.lstrip()[:1] in ("{", "["):
        try:
            return [json.loads(text)]  # the fast path for JSON manifests
        except json.JSONDecodeError as exc:
            json_error = ConfigError(path, "", f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")
        except RecursionError:
            raise ConfigError(path, "", f"document is nested more than {MAX_DEPTH} levels deep") from None
    try:
        parsed = yamlload.parse(text)
        if _may_alias_or_nest_deep(text):
            _check_yaml_events(parsed, path)
        return yamlload.load_parsed(parsed)  # also YAML flow style, like {kind: Pod}
    except YAMLError as exc:
        if json_error is not None:
            raise json_error from None  # it looked like JSON: the JSON error is the helpful one
        where = f" at line {exc.line + 1}, column {(exc.column or 0) + 1}" if exc.line is not None else ""
        raise ConfigError(path, "", f"invalid YAML{where}: {exc.problem}") from None


def _may_alias_or_nest_deep(text: str, max_depth: int = MAX_DEPTH) -> bool:
    """Whether `_check_yaml_events` could refuse the text, told from its characters (the walk costs a third of
    a parse). An anchor needs an '&', an alias a '*'; each level of nesting is opened by an indicator (':' or
    '?' of a mapping, '-' of a block sequence, '[' or '{' of a flow collection), so a text with neither '&' nor
    '*' and no more than `max_depth` of those characters can hold no alias and no nesting beyond it."""
    if "&" in text or "*" in text:
        return True
    return sum(map(text.count, ":?-[{")) > max_depth


def _check_yaml_events(parsed: tuple[list[tuple], YAMLError | None], path: str) -> None:
    """Refuses anchors and aliases (a manifest is data: an alias bomb of a few hundred bytes would expand
    to gigabytes) and nesting beyond MAX_DEPTH, before anything is built. libyaml's event parser is not
    recursive, so any depth is safe to look at here. A parse error after the events is the loader's to raise."""
    depth = 0
    for kind, line, column, anchor, *_ in parsed[0]:
        if anchor is not None:  # an alias names one; a scalar or collection with one defines it
            raise ConfigError(path, "", f"YAML anchors and aliases are not allowed (line {line + 1}, "
                                        f"column {column + 1}): write the value out")
        if kind == yamlload.SEQUENCE_START or kind == yamlload.MAPPING_START:
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(path, "", f"document is nested more than {MAX_DEPTH} levels deep "
                                            f"(line {line + 1})")
        elif kind == yamlload.SEQUENCE_END or kind == yamlload.MAPPING_END:
            depth -= 1


def _text(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "", f"not UTF-8 text (byte {exc.start})") from None


def _plain(value: Any, path: str, where: str, field_path: str = "") -> Any:
    """The JSON shape of a YAML value: string keys only, timestamps as RFC 3339 strings.

    Keys are interned: the parser makes a new string for every key of every pod, while field names are few
    and most already live in the interpreter (the code spells them), so every pod shares one of each.
    """
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(path, f"{where}{field_path}".rstrip("."), f"key {key!r} must be a string")
            result[sys.intern(key)] = _plain(item, path, where, f"{field_path}{key}.")
        return result
    if isinstance(value, list):
        return [_plain(item, path, where, f"{field_path.rstrip('.')}[{index}].") for index, item in enumerate(value)]
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()  # YAML !!binary: keep it as the API would (base64)
    return value


def _add_object(collector: _Collector, obj: dict[str, Any], where: str, *, allowed: tuple[str, ...],
                written: Any) -> None:
    """Defaults, checks and collects `obj`; `written` is the same object as decoded, untouched by defaulting."""
    kind = obj.get("kind")
    path = collector.path
    if kind not in allowed:
        raise ConfigError(path, f"{where}kind", f"unsupported kind {kind!r} (expected {', '.join(allowed)})")
    api_version = obj.get("apiVersion")
    if api_version not in (None, "v1"):
        raise ConfigError(path, f"{where}apiVersion", f"a {kind} must be apiVersion v1, got {api_version!r}")
    # Strict decoding, as kubectl validates before sending: fields we do not know are errors, not dropped.
    unknown = unknown_fields(obj, OBJECTS[kind])
    if kind == "Pod":
        make_static(obj, collector.node_name, collector.location, source=collector.source, seen=collector.seen)
        apply_defaults(obj)
        problems = reportable(unknown, validate_pod(obj), written=written, defaulted=obj)
        target = collector.pods
    else:
        problems = unknown
        validate_object_meta(obj.get("metadata"), problems, namespaced=True)
        metadata = obj.setdefault("metadata", {})
        if isinstance(metadata, dict) and not metadata.get("namespace"):
            metadata["namespace"] = "default"
        _check_data(obj, kind, problems)
        target = collector.configmaps if kind == "ConfigMap" else collector.secrets
    if problems:
        raise manifest_error(path, where, problems)
    target.append(obj)


def manifest_error(path: str, where: str, problems: Problems) -> ConfigError:
    """One line listing every problem: the first names its field as ConfigError.key, the others follow."""
    (first_path, first_message), rest = problems[0], problems[1:]
    message = "; ".join([first_message, *(f"{where}{field}: {text}" for field, text in rest)])
    return ConfigError(path, f"{where}{first_path}", message)


def reportable(unknown: Problems, problems: Problems, *, written: Any, defaulted: Any) -> Problems:
    """Unknown fields, then validation problems, each at a field the user wrote (or one that is missing).

    A problem at a field only defaulting filled in (a request copied from a bad limit, a hostPort from a bad
    containerPort) is dropped: the field it was copied from reports it under the name the user wrote.
    """
    result = list(unknown)
    seen = {field_path for field_path, _ in unknown}
    for field_path, message in problems:
        if field_path in seen or (not field_present(written, field_path) and field_present(defaulted, field_path)):
            continue
        seen.add(field_path)
        result.append((field_path, message))
    return result


_PATH_TOKEN = re.compile(r"\[(\d+)\]|\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]|\.?([^.\[]+)")


def field_present(obj: Any, field_path: str) -> bool:
    """Whether `spec.containers[0].resources.limits['example.com/gpu']`-style paths name a value in obj."""
    tokens: list[int | str] = []
    for index, quoted, name in _PATH_TOKEN.findall(field_path):
        tokens.append(int(index) if index else ast.literal_eval(quoted) if quoted else name)
    return _present(obj, tokens)


def _present(value: Any, tokens: list[int | str]) -> bool:
    if not tokens:
        return True
    head, rest = tokens[0], tokens[1:]
    if isinstance(head, int):
        return isinstance(value, list) and head < len(value) and _present(value[head], rest)
    if not isinstance(value, dict):
        return False
    # Resource names hold dots (example.com/gpu) and are written unquoted: try longer joined keys too.
    for end in range(len(tokens), 0, -1):
        parts = tokens[:end]
        if all(isinstance(p, str) for p in parts) and (key := ".".join(parts)) in value:  # type: ignore[arg-type]
            if _present(value[key], tokens[end:]):
                return True
    return False


def _check_data(obj: dict[str, Any], kind: str, problems: list[tuple[str, str]]) -> None:
    """ConfigMap/Secret payloads; a Secret's stringData is folded into data as the API server does."""
    encoded_field = "data" if kind == "Secret" else "binaryData"
    for field_name in ("data", "binaryData", "stringData"):
        value = obj.get(field_name)
        if value is None:
            continue
        if not isinstance(value, dict):
            problems.append((field_name, "must be an object of keys to strings"))
            continue
        for key, item in value.items():
            item_path = f"{field_name}[{key!r}]"
            if error := configmap_key_error(key):
                problems.append((item_path, error))
            elif not isinstance(item, str):
                problems.append((item_path, "must be a string (quote numbers and booleans)"))
            elif field_name == encoded_field:
                try:
                    base64.b64decode(item, validate=True)
                except (binascii.Error, ValueError):
                    problems.append((item_path, "is not valid base64"))
    if kind == "Secret":
        secret_type = obj.setdefault("type", "Opaque")
        if not isinstance(secret_type, str) or not secret_type:
            problems.append(("type", "must be a non-empty string"))
        string_data = obj.pop("stringData", None)
        if isinstance(string_data, dict) and not problems:
            data = obj.setdefault("data", {})
            for key, item in string_data.items():
                data[key] = base64.b64encode(item.encode()).decode()
    elif obj.get("stringData") is not None:
        problems.append(("stringData", "is only valid in a Secret"))

