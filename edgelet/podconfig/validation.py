"""Pod validation: what the API server would reject and edgelet could not run, as (field path, message) pairs."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import Any

from edgelet.api.limits import INT32_MAX, INT64_MAX, describe_int
from edgelet.api.quantity import NANO, parse_quantity

Problems = list[tuple[str, str]]

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_IANA_SVC_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
_CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
_PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
_LIFECYCLE_HANDLERS = ("exec", "httpGet", "tcpSocket", "sleep")
_FIELD_REFS = {
    "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
    "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs",
}
_FIELD_REF_MAPS = re.compile(r"metadata\.(labels|annotations)\['[^']+'\]")
_RESOURCE_FIELD_REFS = {
    f"{kind}.{name}" for kind in ("limits", "requests") for name in ("cpu", "memory", "ephemeral-storage")
}
# Every volume source the API knows; exactly one may be set. Which ones edgelet mounts is the volume
# manager's decision, not a validation error.
VOLUME_SOURCES = (
    "hostPath", "emptyDir", "secret", "configMap", "projected", "downwardAPI", "persistentVolumeClaim",
    "ephemeral", "image", "csi", "nfs", "iscsi", "glusterfs", "rbd", "flexVolume", "cinder", "cephfs",
    "flocker", "fc", "azureFile", "azureDisk", "vsphereVolume", "quobyte", "photonPersistentDisk",
    "portworxVolume", "scaleIO", "storageos", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo",
)
_HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                    "BlockDevice"}


# -- name formats (also used by edgelet.config) ------------------------------------------------------

def dns1123_label_error(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > 63 or not _DNS1123_LABEL.fullmatch(value):
        return (f"{value!r} is not a DNS-1123 label (at most 63 lower-case letters, digits or '-', "
                "starting and ending with a letter or digit)")
    return None


def dns1123_subdomain_error(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value):
        return (f"{value!r} is not a DNS-1123 subdomain (at most 253 lower-case letters, digits, '-' or '.', "
                "starting and ending with a letter or digit)")
    return None


def qualified_name_error(value: Any) -> str | None:
    """Label and annotation keys: an optional DNS subdomain prefix and '/', then a name of up to 63 chars."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    prefix, slash, name = value.rpartition("/")
    if slash and (prefix_error := dns1123_subdomain_error(prefix)):
        return f"prefix of {value!r}: {prefix_error}"
    if len(name) > 63 or not _QUALIFIED_NAME_PART.fullmatch(name):
        return (f"{value!r} is not a qualified name (at most 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit, with an optional DNS prefix and '/')")
    return None


def label_value_error(value: Any) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    if value and (len(value) > 63 or not _QUALIFIED_NAME_PART.fullmatch(value)):
        return (f"{value!r} is not a label value (empty, or at most 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit)")
    return None


def port_name_error(value: Any) -> str | None:
    """IANA service names: at most 15 chars, lower-case letters, digits and single inner hyphens."""
    if (not isinstance(value, str) or len(value) > 15 or not _IANA_SVC_NAME.fullmatch(value)
            or "--" in value or not any(c.isalpha() for c in value)):
        return f"{value!r} is not a port name (at most 15 lower-case letters, digits and '-', with a letter)"
    return None


def env_name_error(value: Any) -> str | None:
    # The relaxed rule the API server applies since 1.32: printable ASCII without '=' (the runtime joins
    # name and value with '=').
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if "=" in value or not all(" " <= c <= "~" for c in value):
        return f"{value!r} is not a valid environment variable name (printable ASCII, no '=')"
    return None


def configmap_key_error(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > 253 or not _CONFIGMAP_KEY.fullmatch(value) or value in (".", ".."):
        return f"{value!r} is not a valid key (letters, digits, '-', '_' or '.')"
    return None


# -- typed access that reports instead of raising ---------------------------------------------------

def _mapping(value: Any, path: str, problems: Problems) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append((path, f"must be an object, got {type(value).__name__}"))
        return {}
    return value


def _items(value: Any, path: str, problems: Problems) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (path[i], item) for a list of objects, reporting a non-list or non-object item."""
    if value is None:
        return
    if not isinstance(value, list):
        problems.append((path, f"must be a list, got {type(value).__name__}"))
        return
    for index, item in enumerate(value):
        item_path = f"{path}[{index}]"
        if isinstance(item, dict):
            yield item_path, item
        else:
            problems.append((item_path, f"must be an object, got {type(item).__name__}"))


def _check(problems: Problems, path: str, error: str | None) -> None:
    if error:
        problems.append((path, error))


def _int_in(value: Any, path: str, problems: Problems, low: int, high: int | None = None, *, bits: int = 64) -> None:
    """An integer in [low, high]; without `high`, bounded by its API type (int64, or int32 with bits=32)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append((path, f"must be an integer, got {value!r}"))
        return
    top = high if high is not None else (INT32_MAX if bits == 32 else INT64_MAX)
    if value < low or value > top:
        if high is not None:
            bound = f"between {low} and {high}"
        else:  # the type's own bound: name the side that was crossed
            bound = f"at least {low}" if value < low else f"at most {top}"
        problems.append((path, f"must be {bound}, got {describe_int(value)}"))


def _one_of(value: Any, path: str, problems: Problems, allowed: tuple[str, ...], *, required: bool = False) -> None:
    if value is None and not required:
        return
    if value not in allowed:
        problems.append((path, f"must be one of {', '.join(allowed)}; got {value!r}"))


def _is_among(value: Any, allowed: set[str]) -> bool:
    return isinstance(value, str) and value in allowed


def _port(value: Any, path: str, problems: Problems, *, allow_name: bool) -> None:
    if isinstance(value, str) and allow_name:
        _check(problems, path, port_name_error(value))
    elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        problems.append((path, f"must be a port number between 1 and 65535{' or a port name' if allow_name else ''}"
                               f", got {value!r}"))


def _exactly_one(obj: dict[str, Any], keys: tuple[str, ...], path: str, problems: Problems, what: str) -> str | None:
    present = [key for key in keys if obj.get(key) is not None]
    if len(present) != 1:
        found = ", ".join(present) if present else "none"
        problems.append((path, f"must set exactly one {what} of {', '.join(keys)} (found {found})"))
        return None
    return present[0]


# -- the pod --------------------------------------------------------------------------------------

def validate_pod(pod: Any) -> Problems:
    """Everything wrong with a (defaulted) pod, as (field path, message); empty means valid."""
    problems: Problems = []
    if not isinstance(pod, dict):
        return [("", f"a pod must be an object, got {type(pod).__name__}")]
    validate_object_meta(pod.get("metadata"), problems, namespaced=True)
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        problems.append(("spec", "is required and must be an object"))
        return problems
    _validate_spec(spec, problems)
    return problems


def validate_object_meta(metadata: Any, problems: Problems, *, namespaced: bool) -> None:
    meta = _mapping(metadata, "metadata", problems)
    _check(problems, "metadata.name", dns1123_subdomain_error(meta.get("name")))
    if namespaced and meta.get("namespace") not in (None, ""):
        _check(problems, "metadata.namespace", dns1123_label_error(meta.get("namespace")))
    for key, value in _mapping(meta.get("labels"), "metadata.labels", problems).items():
        _check(problems, f"metadata.labels[{key!r}]", qualified_name_error(key) or label_value_error(value))
    for key, value in _mapping(meta.get("annotations"), "metadata.annotations", problems).items():
        error = qualified_name_error(key) or (None if isinstance(value, str) else "value must be a string")
        _check(problems, f"metadata.annotations[{key!r}]", error)


def _validate_spec(spec: dict[str, Any], problems: Problems) -> None:
    volumes = _validate_volumes(spec.get("volumes"), problems)
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        problems.append(("spec.containers", "at least one container is required"))
    names: set[str] = set()
    host_ports: set[tuple[str, int, str]] = set()
    host_network = spec.get("hostNetwork") is True
    for field in ("initContainers", "containers"):
        for path, container in _items(spec.get(field), f"spec.{field}", problems):
            _validate_container(container, path, problems, volumes, init=field == "initContainers",
                                host_network=host_network)
            name = container.get("name")
            if isinstance(name, str) and name in names:
                problems.append((f"{path}.name", f"duplicate container name {name!r}"))
            names.add(name if isinstance(name, str) else "")
            for port_path, port in _items(container.get("ports"), f"{path}.ports", problems):
                host_port = port.get("hostPort")
                if isinstance(host_port, int) and host_port > 0:
                    key = (str(port.get("hostIP") or ""), host_port, str(port.get("protocol") or "TCP"))
                    if key in host_ports:
                        problems.append((f"{port_path}.hostPort", f"host port {host_port}/{key[2]} is already used"))
                    host_ports.add(key)
    _validate_ephemeral_containers(spec, names, problems, volumes)
    _one_of(spec.get("restartPolicy"), "spec.restartPolicy", problems, ("Always", "OnFailure", "Never"), required=True)
    dns_policy = spec.get("dnsPolicy")
    _one_of(dns_policy, "spec.dnsPolicy", problems, ("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"))
    _validate_dns_config(spec.get("dnsConfig"), dns_policy, problems)
    _int_in(spec.get("terminationGracePeriodSeconds"), "spec.terminationGracePeriodSeconds", problems, 0)
    _int_in(spec.get("activeDeadlineSeconds"), "spec.activeDeadlineSeconds", problems, 1)
    _int_in(spec.get("priority"), "spec.priority", problems, -INT32_MAX - 1, bits=32)
    for field in ("hostname", "subdomain"):
        if spec.get(field) not in (None, ""):
            _check(problems, f"spec.{field}", dns1123_label_error(spec[field]))
    security = _validate_security_context(spec.get("securityContext"), "spec.securityContext", problems)
    _int_in(security.get("fsGroup"), "spec.securityContext.fsGroup", problems, 0, 2**31 - 1)
    for path, sysctl in _items(security.get("sysctls"), "spec.securityContext.sysctls", problems):
        if not isinstance(sysctl.get("name"), str) or not sysctl["name"] or not isinstance(sysctl.get("value"), str):
            problems.append((path, "needs a name and a value, both strings"))
    for path, secret in _items(spec.get("imagePullSecrets"), "spec.imagePullSecrets", problems):
        _check(problems, f"{path}.name", dns1123_subdomain_error(secret.get("name")))


_PROFILE_TYPES = ("RuntimeDefault", "Unconfined", "Localhost")


def _validate_security_context(value: Any, path: str, problems: Problems) -> dict[str, Any]:
    """A pod's or container's securityContext: what a wrong type would make the node run less confined."""
    context = _mapping(value, path, problems)
    for field in ("runAsUser", "runAsGroup"):
        _int_in(context.get(field), f"{path}.{field}", problems, 0, 2**31 - 1)
    for field in ("privileged", "runAsNonRoot", "readOnlyRootFilesystem", "allowPrivilegeEscalation"):
        if context.get(field) is not None and not isinstance(context[field], bool):
            problems.append((f"{path}.{field}", f"must be true or false, got {context[field]!r}"))
    _one_of(context.get("procMount"), f"{path}.procMount", problems, ("Default", "Unmasked"))
    for key, option in _mapping(context.get("seLinuxOptions"), f"{path}.seLinuxOptions", problems).items():
        if not isinstance(option, str):
            problems.append((f"{path}.seLinuxOptions.{key}", f"must be a string, got {option!r}"))
    for field in ("seccompProfile", "appArmorProfile"):
        profile = _mapping(context.get(field), f"{path}.{field}", problems)
        if profile:
            _one_of(profile.get("type"), f"{path}.{field}.type", problems, _PROFILE_TYPES, required=True)
            if profile.get("type") == "Localhost":
                _relative_path(profile.get("localhostProfile"), f"{path}.{field}.localhostProfile", problems)
            elif profile.get("localhostProfile") is not None:
                problems.append((f"{path}.{field}.localhostProfile", "may only be set with type Localhost"))
    return context


def _validate_dns_config(value: Any, dns_policy: Any, problems: Problems) -> None:
    config = _mapping(value, "spec.dnsConfig", problems)
    nameservers = config.get("nameservers") or []
    if dns_policy == "None" and not nameservers:
        problems.append(("spec.dnsConfig.nameservers", 'at least one nameserver is required with dnsPolicy "None"'))
    if not isinstance(nameservers, list) or len(nameservers) > 3:
        problems.append(("spec.dnsConfig.nameservers", "must be a list of at most 3 IP addresses"))
        return
    for index, server in enumerate(nameservers):
        try:
            ipaddress.ip_address(server if isinstance(server, str) else "")
        except ValueError:
            problems.append((f"spec.dnsConfig.nameservers[{index}]", f"{server!r} is not an IP address"))
    searches = config.get("searches") or []
    if not isinstance(searches, list) or len(searches) > 32:
        problems.append(("spec.dnsConfig.searches", "must be a list of at most 32 domains"))


def _validate_volumes(value: Any, problems: Problems) -> set[str]:
    names: set[str] = set()
    for path, volume in _items(value, "spec.volumes", problems):
        name = volume.get("name")
        _check(problems, f"{path}.name", dns1123_label_error(name))
        if isinstance(name, str):
            if name in names:
                problems.append((f"{path}.name", f"duplicate volume name {name!r}"))
            names.add(name)
        unknown = sorted(str(key) for key in set(volume) - set(VOLUME_SOURCES) - {"name"})
        if unknown:
            problems.append((f"{path}.{unknown[0]}", "unknown volume source"))
            continue
        kind = _exactly_one(volume, VOLUME_SOURCES, path, problems, "volume source")
        source = _mapping(volume.get(kind), f"{path}.{kind}", problems) if kind else {}
        _validate_volume_source(kind, source, f"{path}.{kind}", problems)
    return names


def _validate_volume_source(kind: str | None, source: dict[str, Any], path: str, problems: Problems) -> None:
    if kind == "hostPath":
        host_path = source.get("path")
        if not isinstance(host_path, str) or not host_path.startswith("/"):
            problems.append((f"{path}.path", "must be an absolute path"))
        if source.get("type") is not None and not _is_among(source["type"], _HOST_PATH_TYPES):
            problems.append((f"{path}.type", f"must be one of {', '.join(sorted(_HOST_PATH_TYPES - {''}))}"))
    elif kind == "emptyDir":
        if source.get("sizeLimit") is not None:
            _quantity(source["sizeLimit"], f"{path}.sizeLimit", problems)
    elif kind in ("secret", "configMap"):
        name_field = "secretName" if kind == "secret" else "name"
        _check(problems, f"{path}.{name_field}", dns1123_subdomain_error(source.get(name_field)))
    elif kind == "persistentVolumeClaim":
        _check(problems, f"{path}.claimName", dns1123_subdomain_error(source.get("claimName")))
    if kind in ("secret", "configMap", "downwardAPI", "projected"):
        _int_in(source.get("defaultMode"), f"{path}.defaultMode", problems, 0, 0o777)
        for item_path, item in _items(source.get("items"), f"{path}.items", problems):
            _relative_path(item.get("path"), f"{item_path}.path", problems)
            _int_in(item.get("mode"), f"{item_path}.mode", problems, 0, 0o777)


def _relative_path(value: Any, path: str, problems: Problems, *, required: bool = True) -> None:
    if value in (None, "") and not required:
        return
    if not isinstance(value, str) or not value:
        problems.append((path, "must be a non-empty relative path"))
    elif value.startswith("/") or ".." in value.split("/"):
        problems.append((path, f"{value!r} must be relative and must not contain '..'"))


# What an ephemeral container may not have, as the API server's validation says: it runs once, unprobed and unserved.
_NOT_FOR_EPHEMERAL = ("ports", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "resources",
                      "resizePolicy", "restartPolicy")


def _validate_ephemeral_containers(spec: dict[str, Any], names: set[str], problems: Problems,
                                   volumes: set[str]) -> None:
    targets = set(names)  # the init and app containers' names
    for path, container in _items(spec.get("ephemeralContainers"), "spec.ephemeralContainers", problems):
        for field in _NOT_FOR_EPHEMERAL:
            if container.get(field) not in (None, {}, []):
                problems.append((f"{path}.{field}", "may not be set on ephemeral containers"))
        probe_free = {k: v for k, v in container.items() if k not in _NOT_FOR_EPHEMERAL}
        _validate_container(probe_free, path, problems, volumes, init=False, host_network=False)
        name = container.get("name")
        if isinstance(name, str) and name in names:
            problems.append((f"{path}.name", f"duplicate container name {name!r}"))
        names.add(name if isinstance(name, str) else "")
        target = container.get("targetContainerName")
        if target is not None and target not in targets:
            problems.append((f"{path}.targetContainerName", f"must name a container of the pod, not {target!r}"))


def _validate_container(container: dict[str, Any], path: str, problems: Problems, volumes: set[str], *,
                        init: bool, host_network: bool) -> None:
    _check(problems, f"{path}.name", dns1123_label_error(container.get("name")))
    image = container.get("image")
    if not isinstance(image, str) or not image.strip():
        problems.append((f"{path}.image", "is required"))
    _one_of(container.get("imagePullPolicy"), f"{path}.imagePullPolicy", problems,
            ("Always", "IfNotPresent", "Never"), required=True)
    _one_of(container.get("terminationMessagePolicy"), f"{path}.terminationMessagePolicy", problems,
            ("File", "FallbackToLogsOnError"))
    _validate_security_context(container.get("securityContext"), f"{path}.securityContext", problems)
    restart = container.get("restartPolicy")
    if init:
        _one_of(restart, f"{path}.restartPolicy", problems, ("Always",))
    elif restart is not None:
        problems.append((f"{path}.restartPolicy", "may only be set on init containers (sidecars)"))
    for field in ("command", "args"):
        value = container.get(field)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            problems.append((f"{path}.{field}", "must be a list of strings"))
    port_names: set[str] = set()
    for port_path, port in _items(container.get("ports"), f"{path}.ports", problems):
        _port(port.get("containerPort"), f"{port_path}.containerPort", problems, allow_name=False)
        _int_in(port.get("hostPort"), f"{port_path}.hostPort", problems, 0, 65535)
        if host_network and port.get("hostPort") not in (None, port.get("containerPort")):
            problems.append((f"{port_path}.hostPort", "must match containerPort when hostNetwork is true"))
        _one_of(port.get("protocol"), f"{port_path}.protocol", problems, ("TCP", "UDP", "SCTP"), required=True)
        if port.get("name") is not None:
            _check(problems, f"{port_path}.name", port_name_error(port["name"]))
            if isinstance(port["name"], str):
                if port["name"] in port_names:
                    problems.append((f"{port_path}.name", f"duplicate port name {port['name']!r}"))
                port_names.add(port["name"])
    _validate_env(container, path, problems)
    _validate_resources(container.get("resources"), f"{path}.resources", problems)
    _validate_mounts(container.get("volumeMounts"), f"{path}.volumeMounts", problems, volumes)
    sidecar = init and restart == "Always"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if container.get(probe) is None:
            continue
        if init and not sidecar:
            problems.append((f"{path}.{probe}", "may not be set on init containers (only on sidecars)"))
            continue
        _validate_probe(container[probe], f"{path}.{probe}", problems, single_success=probe != "readinessProbe")
    lifecycle = _mapping(container.get("lifecycle"), f"{path}.lifecycle", problems)
    for hook in ("postStart", "preStop"):
        if lifecycle.get(hook) is not None:
            handler = _mapping(lifecycle[hook], f"{path}.lifecycle.{hook}", problems)
            _validate_handler(handler, f"{path}.lifecycle.{hook}", problems, _LIFECYCLE_HANDLERS)


def _validate_env(container: dict[str, Any], path: str, problems: Problems) -> None:
    for env_path, env in _items(container.get("env"), f"{path}.env", problems):
        _check(problems, f"{env_path}.name", env_name_error(env.get("name")))
        if env.get("value") is not None and not isinstance(env["value"], str):
            problems.append((f"{env_path}.value", "must be a string (quote numbers and booleans)"))
        if env.get("valueFrom") is None:
            continue
        if env.get("value"):
            problems.append((f"{env_path}.valueFrom", "may not be set together with value"))
        source = _mapping(env["valueFrom"], f"{env_path}.valueFrom", problems)
        kind = _exactly_one(source, ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef"),
                            f"{env_path}.valueFrom", problems, "source")
        ref = _mapping(source.get(kind), f"{env_path}.valueFrom.{kind}", problems) if kind else {}
        ref_path = f"{env_path}.valueFrom.{kind}"
        if kind == "fieldRef":
            field_path = ref.get("fieldPath")
            if not isinstance(field_path, str) or not (field_path in _FIELD_REFS
                                                       or _FIELD_REF_MAPS.fullmatch(field_path)):
                problems.append((f"{ref_path}.fieldPath", f"unsupported field path {field_path!r}"))
        elif kind == "resourceFieldRef":
            if not _is_among(ref.get("resource"), _RESOURCE_FIELD_REFS):
                problems.append((f"{ref_path}.resource", f"unsupported resource {ref.get('resource')!r}"))
        elif kind:
            _check(problems, f"{ref_path}.name", dns1123_subdomain_error(ref.get("name")))
            _check(problems, f"{ref_path}.key", configmap_key_error(ref.get("key")))
    for from_path, env_from in _items(container.get("envFrom"), f"{path}.envFrom", problems):
        kind = _exactly_one(env_from, ("configMapRef", "secretRef"), from_path, problems, "source")
        if kind:
            ref = _mapping(env_from[kind], f"{from_path}.{kind}", problems)
            _check(problems, f"{from_path}.{kind}.name", dns1123_subdomain_error(ref.get("name")))


def _quantity(value: Any, path: str, problems: Problems) -> Any:
    try:
        quantity = parse_quantity(value)
    except ValueError as exc:
        problems.append((path, str(exc)))
        return None
    if quantity < 0:
        problems.append((path, f"must not be negative, got {value!r}"))
        return None
    return quantity


def _validate_resources(value: Any, path: str, problems: Problems) -> None:
    resources = _mapping(value, path, problems)
    parsed: dict[str, dict[str, Any]] = {}
    for kind in ("requests", "limits"):
        parsed[kind] = {}
        for name, amount in _mapping(resources.get(kind), f"{path}.{kind}", problems).items():
            name_path = f"{path}.{kind}.{name}"
            if not isinstance(name, str):
                problems.append((name_path, "resource names must be strings"))
                continue
            if name not in _STANDARD_RESOURCES and not name.startswith("hugepages-") and "/" not in name:
                problems.append((name_path, f"unknown resource {name!r} (extended resources need a domain prefix)"))
                continue
            parsed[kind][name] = _quantity(amount, name_path, problems)
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if request is not None and limit is not None and request > limit:
            problems.append((f"{path}.requests.{name}", f"must be less than or equal to the {name} limit"))
    _validate_extended_resources(parsed, path, problems)


def _validate_extended_resources(parsed: dict[str, dict[str, Any]], path: str, problems: Problems) -> None:
    """The API's rules for extended resources (a domain outside kubernetes.io): whole numbers, never overcommitted
    (a request needs the same limit)."""
    for kind in ("requests", "limits"):
        for name, amount in parsed[kind].items():
            if "/" in name and "kubernetes.io/" not in name and amount is not None and amount % NANO:
                problems.append((f"{path}.{kind}.{name}", "must be an integer"))
    for name, request in parsed["requests"].items():
        if "/" not in name or "kubernetes.io/" in name:
            continue
        if name not in parsed["limits"]:
            problems.append((f"{path}.limits.{name}", "Limit must be set for non overcommitable resources"))
        elif request is not None and parsed["limits"][name] is not None and request != parsed["limits"][name]:
            problems.append((f"{path}.requests.{name}", f"must be equal to {name} limit"))


def _validate_mounts(value: Any, path: str, problems: Problems, volumes: set[str]) -> None:
    mount_paths: set[str] = set()
    for mount_path, mount in _items(value, path, problems):
        name = mount.get("name")
        if not isinstance(name, str) or name not in volumes:
            problems.append((f"{mount_path}.name", f"volume {name!r} is not defined in spec.volumes"))
        target = mount.get("mountPath")
        if not isinstance(target, str) or not target:
            problems.append((f"{mount_path}.mountPath", "is required"))
        elif target in mount_paths:
            problems.append((f"{mount_path}.mountPath", f"{target!r} is mounted twice"))
        else:
            mount_paths.add(target)
        _relative_path(mount.get("subPath"), f"{mount_path}.subPath", problems, required=False)
        _one_of(mount.get("mountPropagation"), f"{mount_path}.mountPropagation", problems,
                ("None", "HostToContainer", "Bidirectional"))


def _validate_probe(value: Any, path: str, problems: Problems, *, single_success: bool) -> None:
    probe = _mapping(value, path, problems)
    _validate_handler(probe, path, problems, _PROBE_HANDLERS)
    _int_in(probe.get("initialDelaySeconds"), f"{path}.initialDelaySeconds", problems, 0, bits=32)
    for field in ("periodSeconds", "timeoutSeconds", "successThreshold", "failureThreshold"):
        _int_in(probe.get(field), f"{path}.{field}", problems, 1, bits=32)
    _int_in(probe.get("terminationGracePeriodSeconds"), f"{path}.terminationGracePeriodSeconds", problems, 1)
    if single_success and probe.get("successThreshold") not in (None, 1):
        problems.append((f"{path}.successThreshold", "must be 1 for liveness and startup probes"))


def _validate_handler(handler: dict[str, Any], path: str, problems: Problems, kinds: tuple[str, ...]) -> None:
    kind = _exactly_one(handler, kinds, path, problems, "handler")
    if kind is None:
        return
    action = _mapping(handler[kind], f"{path}.{kind}", problems)
    if kind == "exec":
        command = action.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
            problems.append((f"{path}.exec.command", "must be a non-empty list of strings"))
    elif kind in ("httpGet", "tcpSocket"):
        _port(action.get("port"), f"{path}.{kind}.port", problems, allow_name=True)
        if kind == "httpGet":
            _one_of(action.get("scheme"), f"{path}.httpGet.scheme", problems, ("HTTP", "HTTPS"))
    elif kind == "grpc":
        _port(action.get("port"), f"{path}.grpc.port", problems, allow_name=False)
    elif kind == "sleep":
        _int_in(action.get("seconds"), f"{path}.sleep.seconds", problems, 0)
