"""A container's environment as the kubelet builds it (pure): envFrom, then env with `$(VAR)` expansion
and valueFrom references to pod fields, resources, ConfigMaps and Secrets.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from edgelet.api import podutil, resources
from edgelet.api.objectstore import InvalidObjectError, configmap_data, secret_data
from edgelet.api.podutil import Pod
from edgelet.util.errors import EdgeletError


class EnvError(EdgeletError):
    """A reference the container needs cannot be resolved; shown as CreateContainerConfigError."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)


class _Store(Protocol):
    """The part of edgelet.api.objectstore.ObjectStore this module reads."""

    def get_configmap(self, namespace: str, name: str) -> dict | None: ...
    def get_secret(self, namespace: str, name: str) -> dict | None: ...


# -- $(VAR) expansion ------------------------------------------------------------------------------

def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Expands `$(NAME)` with the kubelet's rules (third_party/forked/golang/expansion).

    `$$` is an escaped `$`; a reference whose name `lookup` does not know (None) stays as written;
    an unterminated `$(` and a `$` before any other character are kept literally.
    """
    if "$" not in text:
        return text
    out: list[str] = []
    i, end = 0, len(text)
    while i < end:
        char = text[i]
        if char != "$" or i + 1 == end:
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            close = text.find(")", i + 2)
            if close == -1:
                out.append("$(")
                i += 2
            else:
                name = text[i + 2:close]
                value = lookup(name)
                out.append(f"$({name})" if value is None else value)
                i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)


def _lookup_in(*contexts: Mapping[str, str]) -> Callable[[str], str | None]:
    def lookup(name: str) -> str | None:
        for context in contexts:
            if name in context:
                return context[name]
        return None
    return lookup


def expand_command(container: dict[str, Any], env: Iterable[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """The container's command and args with `$(VAR)` references to its environment expanded."""
    lookup = _lookup_in(dict(env))
    command = [expand(str(part), lookup) for part in container.get("command") or []]
    args = [expand(str(part), lookup) for part in container.get("args") or []]
    return command, args


# -- names -----------------------------------------------------------------------------------------

def is_env_var_name(name: str) -> bool:
    """The API's (relaxed, default since 1.32) rule: printable ASCII other than '=', not empty."""
    return bool(name) and all(" " <= char <= "~" and char != "=" for char in name)


_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _is_qualified_name(text: str) -> bool:
    prefix, slash, name = text.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED_NAME.fullmatch(name))


# -- fieldRef --------------------------------------------------------------------------------------

def _go_quote(text: str) -> str:
    """Go's %q (strconv.Quote), which the kubelet uses for label and annotation values."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif char in "\a\b\f\n\r\t\v":
            out.append({"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r",
                        "\t": r"\t", "\v": r"\v"}[char])
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def format_map(values: Mapping[str, str]) -> str:
    """Labels or annotations as the downward API writes them: sorted `key="value"` lines."""
    return "\n".join(f"{key}={_go_quote(str(values[key]))}" for key in sorted(values))


def _split_subscript(path: str) -> tuple[str, str] | None:
    if not path.endswith("']"):
        return None
    base, sep, subscript = path[:-2].partition("['")
    return (base, subscript) if sep and base else None


def metadata_field_value(pod: Pod, field_path: str) -> str:
    """A pod metadata field (the kubelet's ExtractFieldPathAsString); ValueError if unsupported."""
    meta = podutil.meta(pod)
    split = _split_subscript(field_path)
    if split is not None:
        base, key = split
        if base == "metadata.annotations":
            if not _is_qualified_name(key.lower()):
                raise ValueError(f"invalid key subscript in {field_path}")
            return str((meta.get("annotations") or {}).get(key, ""))
        if base == "metadata.labels":
            if not _is_qualified_name(key):
                raise ValueError(f"invalid key subscript in {field_path}")
            return str((meta.get("labels") or {}).get(key, ""))
        raise ValueError(f"fieldPath {field_path!r} does not support subscript")
    if field_path == "metadata.annotations":
        return format_map(meta.get("annotations") or {})
    if field_path == "metadata.labels":
        return format_map(meta.get("labels") or {})
    if field_path == "metadata.name":
        return podutil.name(pod)
    if field_path == "metadata.namespace":
        return podutil.namespace(pod)
    if field_path == "metadata.uid":
        return podutil.uid(pod)
    raise ValueError(f"unsupported fieldPath: {field_path}")


def pod_field_value(pod: Pod, field_ref: dict[str, Any], *, node_ips: Sequence[str] = (),
                    pod_ips: Sequence[str] = ()) -> str:
    """An env var's fieldRef: metadata fields plus the node name, service account and IPs."""
    api_version = field_ref.get("apiVersion") or "v1"
    if api_version != "v1":
        raise ValueError(f"unsupported pod version: {api_version}")
    path = field_ref.get("fieldPath") or ""
    spec = podutil.spec(pod)
    if path == "spec.nodeName":
        return spec.get("nodeName") or ""
    if path == "spec.serviceAccountName":
        return spec.get("serviceAccountName") or ""
    if path in ("status.hostIP", "status.hostIPs"):
        if not node_ips:
            raise ValueError(f"cannot resolve {path}: the node has no known IP address")
        return node_ips[0] if path == "status.hostIP" else ",".join(node_ips)
    if path == "status.podIP":
        return pod_ips[0] if pod_ips else ""
    if path == "status.podIPs":
        return ",".join(pod_ips)
    return metadata_field_value(pod, path)


# -- the environment -------------------------------------------------------------------------------

def _not_found(kind: str, name: str) -> EnvError:
    return EnvError(f'{kind} "{name}" not found')


class _References:
    """ConfigMaps and Secrets fetched once per resolution, as the kubelet caches them per call."""

    def __init__(self, store: _Store | None, namespace: str):
        self._store = store
        self._namespace = namespace
        self._configmaps: dict[str, dict[str, str] | None] = {}
        self._secrets: dict[str, dict[str, bytes] | None] = {}

    def configmap(self, name: str) -> dict[str, str] | None:
        if name not in self._configmaps:
            found = self._store.get_configmap(self._namespace, name) if self._store is not None else None
            self._configmaps[name] = None if found is None else _checked(configmap_data, found)
        return self._configmaps[name]

    def secret(self, name: str) -> dict[str, bytes] | None:
        if name not in self._secrets:
            found = self._store.get_secret(self._namespace, name) if self._store is not None else None
            self._secrets[name] = None if found is None else _checked(secret_data, found)
        return self._secrets[name]


def _checked(extract: Callable[[dict], dict], obj: dict) -> dict:
    try:
        return extract(obj)
    except InvalidObjectError as exc:
        raise EnvError(str(exc)) from None


def _text(value: bytes, secret: str, key: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise EnvError(f'secret "{secret}" key {key!r} is not UTF-8 text; use a volume for binary data') from None


# -- Service variables (the kubelet's envvars.FromServices and getServiceEnvVarMap) ----------------------

# Services of the default namespace every pod gets, whatever its enableServiceLinks.
MASTER_SERVICES = frozenset({"kubernetes"})
MASTER_NAMESPACE = "default"


def _variable_name(name: str) -> str:
    return name.replace("-", "_").upper()


def has_cluster_ip(service: Mapping[str, Any]) -> bool:
    """A Service pods can be told about: ClusterIP neither empty (ExternalName) nor "None" (headless)."""
    cluster_ip = (service.get("spec") or {}).get("clusterIP") or ""
    return cluster_ip not in ("", "None")


def service_variables(services: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """`{SVC}_SERVICE_HOST`, `{SVC}_SERVICE_PORT`, `{SVC}_SERVICE_PORT_{NAME}` per named port, and the Docker link
    variables (`{SVC}_PORT`, `{SVC}_PORT_{port}_{PROTO}` with `_PROTO`, `_PORT`, `_ADDR`) of each Service in turn."""
    result: dict[str, str] = {}
    for service in services:
        spec = service.get("spec") or {}
        ports = [port for port in spec.get("ports") or [] if isinstance(port, Mapping)]
        if not has_cluster_ip(service) or not ports:
            continue
        cluster_ip = spec["clusterIP"]
        prefix = _variable_name((service.get("metadata") or {}).get("name") or "")
        result[f"{prefix}_SERVICE_HOST"] = cluster_ip
        result[f"{prefix}_SERVICE_PORT"] = str(ports[0].get("port"))
        for port in ports:
            if port.get("name"):
                result[f"{prefix}_SERVICE_PORT_{_variable_name(port['name'])}"] = str(port.get("port"))
        address = f"[{cluster_ip}]" if ":" in cluster_ip else cluster_ip
        for index, port in enumerate(ports):
            protocol = port.get("protocol") or "TCP"
            url = f"{protocol.lower()}://{address}:{port.get('port')}"
            if index == 0:
                result[f"{prefix}_PORT"] = url
            port_prefix = f"{prefix}_PORT_{port.get('port')}_{protocol.upper()}"
            result[port_prefix] = url
            result[f"{port_prefix}_PROTO"] = protocol.lower()
            result[f"{port_prefix}_PORT"] = str(port.get("port"))
            result[f"{port_prefix}_ADDR"] = cluster_ip
    return result


def services_for(namespace: str, enable_service_links: bool,
                 services: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Services a pod of `namespace` is told about, by name: the master `kubernetes` Service of the default
    namespace always, the other Services of its own namespace when links are enabled (one of its own named
    `kubernetes` then wins over the master's). Sorted by name, for a stable environment."""
    chosen: dict[str, Mapping[str, Any]] = {}
    own: set[str] = set()
    for service in services:
        if not has_cluster_ip(service):
            continue
        meta = service.get("metadata") or {}
        name, service_namespace = meta.get("name") or "", meta.get("namespace") or MASTER_NAMESPACE
        if service_namespace == MASTER_NAMESPACE and name in MASTER_SERVICES:
            if name not in own:
                chosen[name] = service
        elif service_namespace == namespace and enable_service_links:
            chosen[name] = service
            own.add(name)
    return [chosen[name] for name in sorted(chosen)]


def pod_service_env(pod: Pod, services: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The Service variables of one pod (its spec.enableServiceLinks defaults to true, as the API sets it)."""
    links = podutil.spec(pod).get("enableServiceLinks")
    return service_variables(services_for(podutil.namespace(pod), links is None or bool(links), services))


def kubernetes_service(host: str, port: int) -> dict[str, Any]:
    """The master `kubernetes` Service (port 443 named https) as pods are told of it: at `host`:`port`."""
    return {"metadata": {"name": "kubernetes", "namespace": MASTER_NAMESPACE},
            "spec": {"clusterIP": host, "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}}


def kubernetes_service_env(host: str, port: int) -> dict[str, str]:
    """The variables the kubelet derives from the `kubernetes` Service for every pod, pointing at `host`:`port`."""
    return service_variables([kubernetes_service(host, port)])


def api_server_address(server: str, host: str = "", port: int = 0) -> tuple[str, int]:
    """Where pods are told the API is: `host`/`port` where set, else those of the agent's `server` URL."""
    parsed = urllib.parse.urlsplit(server)
    return host or parsed.hostname or "", port or parsed.port or 443


def resolve_env(
    pod: Pod,
    container: dict[str, Any],
    *,
    store: _Store | None,
    service_env: Mapping[str, str] | None = None,
    node_ip: str = "",
    pod_ip: str = "",
    pod_ips: Sequence[str] = (),
    node_ips: Sequence[str] = (),
    node_allocatable: Mapping[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> list[tuple[str, str]]:
    """The container's environment, as the kubelet's makeEnvironmentVariables computes it.

    `envFrom` first (invalid names skipped, reported in `warnings` as the kubelet's event text), then
    `env` in order, each value expanded against what came before and `service_env`; service variables
    not overridden come last. `pod_ips` wins over `pod_ip`, `node_ips` over `node_ip`; resource limits
    left unset read as `node_allocatable`. A required reference that cannot be resolved raises EnvError.
    """
    namespace = podutil.namespace(pod)
    service_env = service_env or {}
    pod_ips = list(pod_ips) or ([pod_ip] if pod_ip else [])
    node_ips = list(node_ips) or ([node_ip] if node_ip else [])
    refs = _References(store, namespace)
    env: dict[str, str] = {}

    for source in container.get("envFrom") or []:
        found = _env_from_entries(source, refs)
        if found is None:
            continue
        kind, name, entries = found
        prefix = source.get("prefix") or ""
        invalid = []
        for key, value in entries.items():
            key = prefix + key
            if is_env_var_name(key):
                env[key] = value
            else:
                invalid.append(key)
        if invalid and warnings is not None:
            warnings.append(f"Keys [{', '.join(sorted(invalid))}] from the EnvFrom {kind} {namespace}/{name} "
                            "were skipped since they are considered invalid environment variable names.")

    lookup = _lookup_in(env, service_env)
    for var in container.get("env") or []:
        name = var.get("name", "")
        value = var.get("value") or ""
        value_from = var.get("valueFrom")
        if value:
            value = expand(str(value), lookup)
        elif value_from:
            try:
                referenced = _value_from(pod, container, value_from, refs, node_ips=node_ips, pod_ips=pod_ips,
                                         node_allocatable=node_allocatable)
            except (ValueError, resources.ResourceError) as exc:
                raise EnvError(f"env {name}: {exc}") from None
            if referenced is None:  # an optional reference that is absent: the variable is left out
                continue
            value = referenced
        env[name] = value

    result = list(env.items())
    result.extend((key, value) for key, value in service_env.items() if key not in env)
    return result


def _env_from_entries(source: dict[str, Any], refs: _References) -> tuple[str, str, dict[str, str]] | None:
    """(kind, name, entries) of one envFrom source; None when it is optional and absent."""
    if source.get("configMapRef") is not None:
        kind, ref = "configMap", source["configMapRef"]
        entries = refs.configmap(ref.get("name", ""))
    elif source.get("secretRef") is not None:
        kind, ref = "secret", source["secretRef"]
        data = refs.secret(ref.get("name", ""))
        entries = None if data is None else {k: _text(v, ref.get("name", ""), k) for k, v in data.items()}
    else:
        return None
    name = ref.get("name", "")
    if entries is None:
        if ref.get("optional"):
            return None
        raise _not_found(kind.lower(), name)
    return kind, name, entries


def _value_from(pod: Pod, container: dict[str, Any], value_from: dict[str, Any], refs: _References, *,
                node_ips: Sequence[str], pod_ips: Sequence[str],
                node_allocatable: Mapping[str, Any] | None) -> str | None:
    if value_from.get("fieldRef") is not None:
        return pod_field_value(pod, value_from["fieldRef"], node_ips=node_ips, pod_ips=pod_ips)
    if value_from.get("resourceFieldRef") is not None:
        selector = value_from["resourceFieldRef"]
        return resources.resource_field_value(pod, selector.get("containerName") or container.get("name", ""),
                                              selector, node_allocatable)
    for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        ref = value_from.get(field)
        if ref is None:
            continue
        name, key, optional = ref.get("name", ""), ref.get("key", ""), bool(ref.get("optional"))
        data = refs.configmap(name) if kind == "ConfigMap" else refs.secret(name)
        if data is None:
            if optional:
                return None
            raise _not_found(kind.lower(), name)
        if key not in data:
            if optional:
                return None
            raise EnvError(f"couldn't find key {key} in {kind} {podutil.namespace(pod)}/{name}")
        value = data[key]
        return value if isinstance(value, str) else _text(value, name, key)
    return ""
