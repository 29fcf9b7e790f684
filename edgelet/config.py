"""The agent's settings: one TOML file read into small frozen dataclasses, every value checked with a clear error.

Durations are written as the kubelet writes them ("10s", "5m", "1m30s", "500ms") and held as float seconds;
sizes as Kubernetes quantities ("10Mi", "1Gi", "100M") and held as int bytes. Relative paths are resolved
against the directory of the config file, as the kubelet does for its config file.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
import tomllib
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from edgelet.api.limits import INT32_MAX as _INT32_MAX
from edgelet.api.limits import describe_int, document_problem
from edgelet.api.quantity import NANO, format_bytes, parse_quantity, parse_quantity_bytes
from edgelet.podconfig.validation import dns1123_subdomain_error, label_value_error, qualified_name_error
from edgelet.util.cpuset import parse_cpuset
from edgelet.util.errors import ConfigError

__all__ = [
    "Config", "ConfigError", "format_duration", "format_effective", "load_config", "parse_config",
    "parse_duration", "parse_quantity_bytes",
]

# -- durations ------------------------------------------------------------------------------------

_NS_PER_UNIT = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9,
                "h": 3600 * 10**9}
_SEGMENT = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h)"
_DURATION = re.compile(rf"[+-]?(?:{_SEGMENT})+")
_SEGMENTS = re.compile(r"([0-9]*\.?[0-9]*)(ns|us|µs|μs|ms|s|m|h)")
_MAX_DURATION_NS = 2**63 - 1  # Go's time.Duration
_MAX_DURATION_TEXT = 64


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration ("1m30s", "500ms", "2h", "0"); ValueError if malformed.

    Like Go's time.ParseDuration, a duration beyond int64 nanoseconds (about 292 years) is out of range.
    """
    if not isinstance(text, str):
        raise ValueError(f'expected a duration string like "10s", got {text!r}')
    if text in ("0", "+0", "-0"):
        return 0.0
    if len(text) > _MAX_DURATION_TEXT or not _DURATION.fullmatch(text):
        raise ValueError(f'{text[:_MAX_DURATION_TEXT]!r} is not a duration (write it like "10s", "5m", "1m30s" '
                         'or "500ms")')
    numerator, denominator = _exact_nanoseconds(_SEGMENTS.findall(text))
    if numerator > _MAX_DURATION_NS * denominator:
        raise ValueError(f"{text!r} is out of range (at most {format_duration(_MAX_DURATION_NS / 1e9)})")
    whole, rest = divmod(numerator, denominator)
    if 2 * rest > denominator or (2 * rest == denominator and whole % 2):  # half to even, as round() does
        whole += 1
    return (-1 if text.startswith("-") else 1) * whole / 1e9


def _exact_nanoseconds(segments: list[tuple[str, str]]) -> tuple[int, int]:
    """The segments' sum in nanoseconds as numerator / denominator (a power of ten), exactly: "1.5h" is 5400 s,
    and "0.1s" + "0.2s" no float's rounding. Integers only, so the agent does not load fractions and decimal."""
    denominator = 10 ** max(len(number.partition(".")[2]) for number, _ in segments)
    numerator = 0
    for number, unit in segments:
        whole, _, fraction = number.partition(".")
        scale = 10 ** len(fraction)
        numerator += (int(whole or 0) * scale + int(fraction or 0)) * _NS_PER_UNIT[unit] * (denominator // scale)
    return numerator, denominator


def format_duration(seconds: float) -> str:
    """The shortest Go-style spelling that parses back to the same value: 90 -> "1m30s", 0.5 -> "500ms"."""
    nanoseconds = round(seconds * 1e9)
    if nanoseconds == 0:
        return "0s"
    sign, nanoseconds = ("-", -nanoseconds) if nanoseconds < 0 else ("", nanoseconds)
    if nanoseconds < 10**9:
        unit, size = ("ns", 1) if nanoseconds < 10**3 else ("us", 10**3) if nanoseconds < 10**6 else ("ms", 10**6)
        return f"{sign}{_decimal(nanoseconds, size)}{unit}"
    hours, rest = divmod(nanoseconds, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    seconds_part = f"{_decimal(rest, 10**9)}s" if rest else ""
    return f"{sign}{f'{hours}h' if hours else ''}{f'{minutes}m' if minutes else ''}{seconds_part}"


def _decimal(value: int, unit: int) -> str:
    whole, fraction = divmod(value, unit)
    if not fraction:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{fraction:0{digits}d}".rstrip("0")


# -- how each setting is read and written ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Kind:
    """Turns a TOML value into the stored one (raising ValueError) and back into TOML for display."""

    read: Callable[[Any], Any]
    write: Callable[[Any], Any] = lambda value: value
    is_path: bool = False


def _toml_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}
    return names.get(type(value), type(value).__name__)


def _expect(value: Any, expected: type, what: str) -> Any:
    if type(value) is not expected:
        raise ValueError(f"expected {what}, got {_toml_type(value)} {value!r}")
    return value


def _string(check: Callable[[str], str | None] | None = None) -> _Kind:
    def read(value: Any) -> str:
        _expect(value, str, "a string")
        if check is not None and (problem := check(value)):
            raise ValueError(problem)
        return value
    return _Kind(read)


def _boolean() -> _Kind:
    return _Kind(lambda value: _expect(value, bool, "true or false"))


def _choice(*choices: str) -> _Kind:
    return _string(lambda v: None if v in choices else f"must be one of {', '.join(choices)}; got {v!r}")


def _path_error(required: bool) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if required and not value:
            return "must not be empty"
        if "\0" in value:
            return "must not contain a NUL character"
        return None
    return check


def _path(*, required: bool = False) -> _Kind:
    return dataclasses.replace(_string(_path_error(required)), is_path=True)


def _integer(low: int, high: int | None = None) -> _Kind:
    """An integer in [low, high]; without `high`, at most int32 (no setting needs more, and none is unbounded)."""
    def read(value: Any) -> int:
        _expect(value, int, "an integer")
        if high is not None and not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {describe_int(value)}")
        if value < low or value > _INT32_MAX:
            bound = f"at least {low}" if value < low else f"at most {_INT32_MAX}"
            raise ValueError(f"must be {bound}, got {describe_int(value)}")
        return value
    return _Kind(read)


def _duration(minimum: float = 0.0, *, exclusive: bool = True) -> _Kind:
    def read(value: Any) -> float:
        _expect(value, str, 'a duration string like "10s"')
        seconds = parse_duration(value)
        if seconds < minimum or (exclusive and seconds == minimum):
            bound = f"{'more than' if exclusive else 'at least'} {format_duration(minimum)}"
            raise ValueError(f"must be {bound}, got {value!r}")
        return seconds
    return _Kind(read, format_duration)


def _size(minimum: int = 0) -> _Kind:
    def read(value: Any) -> int:
        _expect(value, str, 'a size string like "10Mi"')
        size = parse_quantity_bytes(value)
        if size < minimum:
            raise ValueError(f"must be at least {format_bytes(minimum)}, got {value!r}")
        return size
    return _Kind(read, format_bytes)


def _string_list(check: Callable[[str], str | None]) -> _Kind:
    def read(value: Any) -> tuple[str, ...]:
        _expect(value, list, "an array of strings")
        for index, item in enumerate(value):
            problem = check(item) if type(item) is str else f"expected a string, got {_toml_type(item)} {item!r}"
            if problem:
                raise ValueError(f"item {index}: {problem}")
        return tuple(value)
    return _Kind(read, list)


def _string_table(key_check: Callable[[str], str | None], value_check: Callable[[str], str | None]) -> _Kind:
    def read(value: Any) -> Mapping[str, str]:
        _expect(value, dict, "a table")
        for key, item in value.items():
            problem = key_check(key) or (value_check(item) if type(item) is str else f"expected a string, got {item!r}")
            if problem:
                raise ValueError(f"{key!r}: {problem}")
        return MappingProxyType(dict(value))
    return _Kind(read, dict)


def setting(default: Any, kind: _Kind, *, factory: Callable[[], Any] | None = None, secret: bool = False) -> Any:
    """A dataclass field holding the already-read default; `kind` reads TOML values for it. A secret is left
    out of the dataclass repr (so of tracebacks and logs)."""
    metadata = {"kind": kind}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata, repr=not secret)
    return field(default=kind.read(default), metadata=metadata, repr=not secret)


def section(cls: type) -> Any:
    return field(default_factory=cls, metadata={"section": cls})


def _ip_error(value: str) -> str | None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return f"{value!r} is not an IP address"
    return None


def _unix_endpoint_error(value: str) -> str | None:
    if not value.startswith("unix://") or len(value) <= len("unix://"):
        return f'must be a unix socket like "unix:///run/containerd/containerd.sock", got {value!r}'
    return None


def _http_url_error(value: str) -> str | None:
    parsed = urllib.parse.urlsplit(value)
    if value and (parsed.scheme not in ("http", "https") or not parsed.netloc):
        return f"must be an http:// or https:// URL (or empty to disable), got {value!r}"
    return None


def _listen_address_error(value: str) -> str | None:
    if not value:
        return None
    host, colon, port = value.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535 or (host.startswith("[") != host.endswith("]")):
        return f'must be "host:port" (like "127.0.0.1:10248" or "[::1]:10248"), or empty to disable; got {value!r}'
    return None


# Signals the kubelet's eviction manager knows; thresholds are a quantity ("100Mi") or a percentage ("10%").
EVICTION_SIGNALS = ("memory.available", "allocatableMemory.available", "nodefs.available", "nodefs.inodesFree",
                    "imagefs.available", "imagefs.inodesFree", "containerfs.available", "containerfs.inodesFree",
                    "pid.available")
DEFAULT_EVICTION_HARD = {"memory.available": "100Mi", "nodefs.available": "10%", "imagefs.available": "15%",
                         "nodefs.inodesFree": "5%"}


@dataclass(frozen=True, slots=True)
class Threshold:
    """An eviction threshold: exactly one of an absolute quantity or a fraction (0 < fraction <= 1) of capacity."""

    quantity: int | None = None
    fraction: float | None = None

    @staticmethod
    def parse(text: str) -> Threshold:
        if text.endswith("%"):
            try:
                percent = float(text[:-1])
            except ValueError:
                raise ValueError(f"{text!r} is not a percentage") from None
            if not 0 < percent <= 100:
                raise ValueError(f"percentage {text!r} must be more than 0% and at most 100%")
            return Threshold(fraction=percent / 100)
        quantity = parse_quantity(text)
        if quantity < 0:
            raise ValueError(f"{text!r} must not be negative")
        return Threshold(quantity=quantity // NANO)


def _threshold_error(value: str) -> str | None:
    try:
        Threshold.parse(value)
    except ValueError as exc:
        return str(exc)
    return None


def _signal_error(value: str) -> str | None:
    return None if value in EVICTION_SIGNALS else f"unknown eviction signal; known: {', '.join(EVICTION_SIGNALS)}"


# -- the sections ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    endpoint: str = setting("unix:///run/containerd/containerd.sock", _string(_unix_endpoint_error))
    request_timeout: float = setting("2m", _duration())
    # No longer applied: a pull is judged by its progress ([images] pull_progress_timeout), not by a clock. Kept so
    # configs that set it still load; the agent says at start that it ignores a value other than "0".
    image_pull_timeout: float = setting("0", _duration(exclusive=False))
    runtime_handler: str = setting("", _string())

    @property
    def socket_path(self) -> str:
        return self.endpoint[len("unix://"):]


@dataclass(frozen=True, slots=True)
class PodsConfig:
    manifest_dir: str = setting("/etc/edgelet/manifests", _path())
    file_check_frequency: float = setting("20s", _duration())
    http_url: str = setting("", _string(_http_url_error))
    http_check_frequency: float = setting("20s", _duration())
    cluster_domain: str = setting("cluster.local", _string(dns1123_subdomain_error))
    cluster_dns: tuple[str, ...] = setting([], _string_list(_ip_error))


@dataclass(frozen=True, slots=True)
class PLEGConfig:
    relist_period: float = setting("1s", _duration())
    relist_threshold: float = setting("3m", _duration())
    # Follow the runtime's container events where it serves them (containerd >= 1.7), relisting on each batch
    # and every evented_relist_period; off (or on an older runtime) the relist runs every relist_period.
    evented: bool = setting(True, _boolean())
    evented_relist_period: float = setting("5m", _duration())

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.relist_threshold <= self.relist_period:
            yield "relist_threshold", "must be longer than relist_period"
        if self.evented_relist_period < self.relist_period:
            yield "evented_relist_period", "must not be shorter than relist_period"


@dataclass(frozen=True, slots=True)
class SyncConfig:
    sync_frequency: float = setting("1m", _duration())
    housekeeping_interval: float = setting("2s", _duration())


@dataclass(frozen=True, slots=True)
class BackoffConfig:
    crashloop_initial: float = setting("10s", _duration())
    crashloop_max: float = setting("5m", _duration())
    image_pull_initial: float = setting("10s", _duration())
    image_pull_max: float = setting("5m", _duration())

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.crashloop_max < self.crashloop_initial:
            yield "crashloop_max", "must not be shorter than crashloop_initial"
        if self.image_pull_max < self.image_pull_initial:
            yield "image_pull_max", "must not be shorter than image_pull_initial"


def _https_url_error(value: str) -> str | None:
    parsed = urllib.parse.urlsplit(value)
    if value and (parsed.scheme != "https" or not parsed.netloc):
        return f'must be the API server\'s https:// URL, like "https://10.0.0.1:6443"; got {value!r}'
    return None


def _ca_hash_error(value: str) -> str | None:
    if not value:
        return None
    # Token joins only: a standalone node never loads the bootstrap code (tokens, HMAC, the JWS).
    from edgelet.bootstrap.tokens import ca_hash_error

    return ca_hash_error(value)


def _token_error(value: str) -> str | None:
    if not value:
        return None
    from edgelet.bootstrap.tokens import token_error  # token joins only, as above

    return token_error(value)


def _taint_error(value: str) -> str | None:
    from edgelet.nodestatus.taints import taint_error  # cluster nodes only

    return taint_error(value)


def _service_host_error(value: str) -> str | None:
    if any(c in value for c in "/:[] ") and not _is_ipv6(value):
        return f"must be a host name or IP address (no scheme or port), got {value!r}"
    return None


def _is_ipv6(value: str) -> bool:
    try:
        return ipaddress.ip_address(value).version == 6
    except ValueError:
        return False


def _secret(check: Callable[[str], str | None]) -> _Kind:
    """A secret string: checked like any other, never shown by `check-config` or in logs."""
    return dataclasses.replace(_string(check), write=lambda value: "<redacted>" if value else "")


def _host_port_error(value: str) -> str | None:
    host, colon, port = value.rpartition(":")
    if (not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535
            or host.startswith("[") != host.endswith("]")):
        return f'must be "host:port" (like "10.0.0.1:8132" or "[fd00::1]:8132"), got {value!r}'
    return None


@dataclass(frozen=True, slots=True)
class TunnelConfig:
    """konnectivity: the node dials out to konnectivity-server's agent port(s) and the API server reaches the
    kubelet API through those streams (devices behind NAT or a firewall). An empty ca_file means the cluster CA."""

    servers: tuple[str, ...] = setting([], _string_list(_host_port_error))
    ca_file: str = setting("", _path())
    # Destinations beyond the node's own kubelet API that the API server may dial through the tunnel.
    allowed_destinations: tuple[str, ...] = setting([], _string_list(_host_port_error))
    max_connections: int = setting(64, _integer(1, 10_000))
    # Bytes queued towards one local connection before the stream is made to wait (back-pressure).
    connection_buffer: int = setting("256Ki", _size(4096))
    # The kubelet's --streaming-connection-idle-timeout: a connection with no bytes either way this long is closed.
    idle_timeout: float = setting("4h", _duration())

    def problems(self) -> Iterator[tuple[str, str]]:
        if not self.servers:
            yield "servers", 'needs at least one konnectivity-server agent address, like ["10.0.0.1:8132"]'


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """How to reach the API server: a kubeconfig, or a bootstrap token join (server + CA + token)."""

    kubeconfig: str = setting("", _path())
    server: str = setting("", _string(_https_url_error))
    ca_file: str = setting("", _path())
    ca_cert_hash: str = setting("", _string(_ca_hash_error))
    bootstrap_token: str = setting("", _secret(_token_error), secret=True)
    lease_duration: float = setting("40s", _duration())
    lease_renew_interval: float = setting("10s", _duration())
    node_status_update_frequency: float = setting("10s", _duration())
    node_status_report_frequency: float = setting("5m", _duration())
    status_resync: float = setting("10s", _duration())
    node_labels: Mapping[str, str] = setting({}, _string_table(qualified_name_error, label_value_error),
                                             factory=lambda: MappingProxyType({}))
    # The kubelet's --register-with-taints: taints the Node gets when this agent creates it ("key=value:Effect").
    register_with_taints: tuple[str, ...] = setting([], _string_list(_taint_error))
    # What pods see as KUBERNETES_SERVICE_HOST/PORT. An edge node has no kube-proxy to reach the `kubernetes`
    # Service's ClusterIP, so empty means the API server this agent itself talks to.
    kubernetes_service_host: str = setting("", _string(_service_host_error))
    kubernetes_service_port: int = setting(0, _integer(0, 65535))
    # The kubelet refreshes a service-account token older than 24 h whatever its lifetime.
    service_account_token_max_age: float = setting("24h", _duration())
    tunnel: TunnelConfig | None = field(default=None, metadata={"section": TunnelConfig, "optional": True})

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.kubeconfig and self.bootstrap_token:
            yield "bootstrap_token", "set either kubeconfig or a bootstrap token join (server, CA, token), not both"
        elif self.bootstrap_token:
            if not self.server:
                yield "server", "is required with bootstrap_token"
            if bool(self.ca_file) == bool(self.ca_cert_hash):
                yield "ca_file", "a bootstrap token join needs exactly one of ca_file or ca_cert_hash"
        elif not self.kubeconfig:
            yield "kubeconfig", ("is required when [cluster] is present unless bootstrap_token is set "
                                 "(remove the section to run standalone)")
        elif self.server or self.ca_file or self.ca_cert_hash:
            yield "server" if self.server else "ca_file" if self.ca_file else "ca_cert_hash", \
                "belongs to a bootstrap token join; with kubeconfig the kubeconfig says it"
        if self.lease_renew_interval >= self.lease_duration:
            yield "lease_renew_interval", "must be shorter than lease_duration"
        if self.node_status_report_frequency < self.node_status_update_frequency:
            yield "node_status_report_frequency", "must not be shorter than node_status_update_frequency"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    address: str = setting("127.0.0.1:10248", _string(_listen_address_error))

    @property
    def host_port(self) -> tuple[str, int] | None:
        """(host, port) to listen on, or None when the server is disabled."""
        if not self.address:
            return None
        host, _, port = self.address.rpartition(":")
        return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class KubeletApiConfig:
    """The kubelet API (logs, exec, attach, port-forward, stats) over TLS; served only with [cluster].

    Empty certificate paths mean a self-signed serving certificate kept under root_dir; an empty
    client_ca_file means the cluster CA of the kubeconfig.
    """

    address: str = setting("0.0.0.0:10250", _string(_listen_address_error))
    tls_cert_file: str = setting("", _path())
    tls_private_key_file: str = setting("", _path())
    client_ca_file: str = setting("", _path())
    anonymous: bool = setting(False, _boolean())
    # "csr": a serving certificate from the cluster's kubernetes.io/kubelet-serving signer (needs an approver),
    # renewed like the client certificate; the self-signed one serves until the first is issued.
    serving_cert: str = setting("self-signed", _choice("self-signed", "csr"))
    # What /logs/ serves and its node log queries read files from (the kubelet's /var/log).
    node_log_dir: str = setting("/var/log", _path(required=True))
    # The journal node log queries read (journalctl --directory); "" = the system journal.
    journal_dir: str = setting("", _path())

    def problems(self) -> Iterator[tuple[str, str]]:
        if bool(self.tls_cert_file) != bool(self.tls_private_key_file):
            missing = "tls_private_key_file" if self.tls_cert_file else "tls_cert_file"
            yield missing, "must be set together with the other (a certificate needs its key)"
        if self.serving_cert == "csr" and self.tls_cert_file:
            yield "serving_cert", '"csr" and tls_cert_file exclude each other (one serving certificate)'

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2]) if self.address else 0


@dataclass(frozen=True, slots=True)
class ImagesConfig:
    airgap_dir: str = setting("", _path())
    gc_high_threshold_percent: int = setting(85, _integer(0, 100))
    gc_low_threshold_percent: int = setting(80, _integer(0, 100))
    minimum_gc_age: float = setting("2m", _duration(exclusive=False))
    # The kubelet's serializeImagePulls and maxParallelImagePulls (0: no limit, the kubelet's nil).
    serialize_image_pulls: bool = setting(True, _boolean())
    max_parallel_image_pulls: int = setting(0, _integer(0))
    # A pull with no progress this long is cancelled and retried with the image back-off (containerd's
    # image_pull_progress_timeout); "0" never cancels. See edgelet.images.progress for who measures it.
    pull_progress_timeout: float = setting("5m", _duration(exclusive=False))
    # The kubelet's --image-credential-provider-config (a CredentialProviderConfig file, YAML or JSON) and
    # --image-credential-provider-bin-dir (where its plugins are); set both or neither.
    credential_provider_config: str = setting("", _path())
    credential_provider_bin_dir: str = setting("", _path())
    # The node's docker config (config.json, or a legacy .dockercfg); "" = the kubelet's search: root_dir,
    # the working directory, $HOME/.docker, /.docker.
    docker_config: str = setting("", _path())

    def problems(self) -> Iterator[tuple[str, str]]:
        if bool(self.credential_provider_config) != bool(self.credential_provider_bin_dir):
            missing = "credential_provider_bin_dir" if self.credential_provider_config else "credential_provider_config"
            yield missing, "must be set together with the other (a provider config names plugins in the bin dir)"
        if self.gc_low_threshold_percent > self.gc_high_threshold_percent:
            yield "gc_low_threshold_percent", "must not be above gc_high_threshold_percent"
        if self.serialize_image_pulls and self.max_parallel_image_pulls > 1:
            yield "max_parallel_image_pulls", "must be 0 or 1 while serialize_image_pulls is true (as the kubelet's)"

    @property
    def parallel_pulls(self) -> int | None:
        """How many pulls may run at once; None: no limit."""
        if self.serialize_image_pulls:
            return 1
        return self.max_parallel_image_pulls or None


@dataclass(frozen=True, slots=True)
class LogsConfig:
    container_log_max_size: int = setting("10Mi", _size(minimum=1024))
    container_log_max_files: int = setting(5, _integer(2))


@dataclass(frozen=True, slots=True)
class EvictionConfig:
    hard: Mapping[str, str] = setting(DEFAULT_EVICTION_HARD, _string_table(_signal_error, _threshold_error),
                                      factory=lambda: MappingProxyType(dict(DEFAULT_EVICTION_HARD)))
    pressure_transition_period: float = setting("5m", _duration(exclusive=False))

    def thresholds(self) -> dict[str, Threshold]:
        return {signal: Threshold.parse(value) for signal, value in self.hard.items()}


def _cpu_list_error(value: str) -> str | None:
    try:
        parse_cpuset(value)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True, slots=True)
class CPUConfig:
    """The CPU manager (the kubelet's cpuManagerPolicy, reservedSystemCPUs, cpuManagerReconcilePeriod)."""

    policy: str = setting("none", _choice("none", "static"))
    reserved_cpus: str = setting("", _string(_cpu_list_error))
    reconcile_period: float = setting("10s", _duration())

    @property
    def reserved(self) -> frozenset[int]:
        return parse_cpuset(self.reserved_cpus)


def _reservable_error(name: str) -> str | None:
    return None if name in ("cpu", "memory") else "only cpu and memory can be reserved"


def _quantity_error(value: str) -> str | None:
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        return str(exc)
    return "must not be negative" if amount < 0 else None


@dataclass(frozen=True, slots=True)
class CgroupsConfig:
    """The kubelet's cgroup layout: --cgroup-driver (empty: the runtime's answer to RuntimeConfig, containerd >=
    2.0, else cgroupfs), --cgroups-per-qos, --cgroup-root, --kube-reserved and --system-reserved (cpu, memory)."""

    driver: str = setting("", _choice("", "cgroupfs", "systemd"))
    per_qos: bool = setting(True, _boolean())
    root: str = setting("/", _string(lambda value: None if value.startswith("/") else "must be an absolute path"))
    kube_reserved: Mapping[str, str] = setting({}, _string_table(_reservable_error, _quantity_error),
                                               factory=lambda: MappingProxyType({}))
    system_reserved: Mapping[str, str] = setting({}, _string_table(_reservable_error, _quantity_error),
                                                 factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class GCConfig:
    container_min_age: float = setting("0s", _duration(exclusive=False))
    max_per_pod_container: int = setting(1, _integer(-1))
    max_containers: int = setting(-1, _integer(-1))


def _sysctl_pattern_error(value: str) -> str | None:
    from edgelet.kuberuntime.security import sysctl_pattern_error  # with the CRI messages: not for every CLI call
    return sysctl_pattern_error(value)


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """The kubelet's --seccomp-default (RuntimeDefault for containers that ask for no seccomp profile) and
    --allowed-unsafe-sysctls (names or `prefix.*` patterns pods may set beyond the safe ones)."""

    seccomp_default: bool = setting(False, _boolean())
    allowed_unsafe_sysctls: tuple[str, ...] = setting([], _string_list(_sysctl_pattern_error))


@dataclass(frozen=True, slots=True)
class ShutdownConfig:
    """Graceful node shutdown (the kubelet's shutdownGracePeriod and shutdownGracePeriodCriticalPods);
    0 = off. The part for critical pods is taken from the whole, regular pods get the rest."""

    grace_period: float = setting("0s", _duration(exclusive=False))
    critical_pods_grace_period: float = setting("0s", _duration(exclusive=False))

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.critical_pods_grace_period > self.grace_period:
            yield "critical_pods_grace_period", "must not be longer than grace_period (it is part of it)"

    @property
    def enabled(self) -> bool:
        return self.grace_period > 0


@dataclass(frozen=True, slots=True)
class CsiConfig:
    """CSI node plugins: the directory where plugins put their registration sockets (the kubelet's; empty: none
    are watched). Staging paths are under root_dir/plugins/kubernetes.io/csi, as the kubelet's under its root."""

    plugins_registry: str = setting("/var/lib/kubelet/plugins_registry", _path())


@dataclass(frozen=True, slots=True)
class DevicesConfig:
    """Device plugins and the pod resources API, on the kubelet's paths (plugins and monitoring agents hard-code
    them): plugins register on `<plugin_dir>/kubelet.sock` (the kubelet's device-plugins directory); "" turns
    device plugins off. `pod_resources_socket` serves v1.PodResourcesLister; "" turns it off."""

    plugin_dir: str = setting("/var/lib/kubelet/device-plugins", _path())
    pod_resources_socket: str = setting("/var/lib/kubelet/pod-resources/kubelet.sock", _path())


def _default_node_name() -> str:
    return socket.gethostname().lower()


@dataclass(frozen=True, slots=True)
class Config:
    """Every setting; `Config()` is the all-defaults configuration."""

    node_name: str = setting("", _string(dns1123_subdomain_error), factory=_default_node_name)
    root_dir: str = setting("/var/lib/edgelet", _path(required=True))
    # Container logs where log collectors look, as the kubelet lays them out (its podLogsDir) and the symlinks it
    # makes for them (`<pod>_<namespace>_<container>-<id>.log`).
    pod_logs_dir: str = setting("/var/log/pods", _path(required=True))
    container_logs_dir: str = setting("/var/log/containers", _path(required=True))
    log_level: str = setting("info", _choice("debug", "info", "warning", "error"))
    max_pods: int = setting(110, _integer(1, 10_000))
    runtime: RuntimeConfig = section(RuntimeConfig)
    pods: PodsConfig = section(PodsConfig)
    pleg: PLEGConfig = section(PLEGConfig)
    sync: SyncConfig = section(SyncConfig)
    backoff: BackoffConfig = section(BackoffConfig)
    cluster: ClusterConfig | None = field(default=None, metadata={"section": ClusterConfig, "optional": True})
    server: ServerConfig = section(ServerConfig)
    kubelet_api: KubeletApiConfig = section(KubeletApiConfig)
    images: ImagesConfig = section(ImagesConfig)
    logs: LogsConfig = section(LogsConfig)
    eviction: EvictionConfig = section(EvictionConfig)
    cpu: CPUConfig = section(CPUConfig)
    cgroups: CgroupsConfig = section(CgroupsConfig)
    gc: GCConfig = section(GCConfig)
    shutdown: ShutdownConfig = section(ShutdownConfig)
    security: SecurityConfig = section(SecurityConfig)
    csi: CsiConfig = section(CsiConfig)
    devices: DevicesConfig = section(DevicesConfig)

    # Layout under root_dir (a kubelet-like tree, all in one place so one backup or wipe covers it):
    #   pods/<uid>/volumes/...                       per-pod directories (volumes, etc-hosts)
    #   logs -> pod_logs_dir                         where container logs were before they moved to pod_logs_dir
    #                                                (a symlink that keeps the older containers' log paths valid)
    #   state/                                       checkpoints (crash-safe, checksummed)
    #   cache/                                       API objects cached for offline restarts
    #   images/                                      air-gap image tarballs imported at start
    #   pki/                                         the node's certificates and keys from TLS bootstrap (0700)
    #   plugins/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount   CSI staging paths
    @property
    def pods_dir(self) -> str:
        return os.path.join(self.root_dir, "pods")

    @property
    def plugins_dir(self) -> str:
        """The CSI staging tree (the kubelet's <root>/plugins)."""
        return os.path.join(self.root_dir, "plugins")

    @property
    def logs_dir(self) -> str:
        """`<namespace>_<name>_<uid>/<container>/<restart>.log` of every container."""
        return self.pod_logs_dir

    @property
    def legacy_logs_dir(self) -> str:
        """Where container logs lived before they moved to pod_logs_dir; moved from at start (edgelet.logs.migrate)."""
        return os.path.join(self.root_dir, "logs")

    @property
    def state_dir(self) -> str:
        return os.path.join(self.root_dir, "state")

    @property
    def cache_dir(self) -> str:
        return os.path.join(self.root_dir, "cache")

    @property
    def pki_dir(self) -> str:
        return os.path.join(self.root_dir, "pki")

    @property
    def images_dir(self) -> str:
        return self.images.airgap_dir or os.path.join(self.root_dir, "images")

    @property
    def standalone(self) -> bool:
        return self.cluster is None

    def to_dict(self) -> dict[str, Any]:
        """The effective settings as TOML spells them (durations, sizes as strings); no "cluster" if standalone."""
        return _to_dict(self)

    def problems(self) -> Iterator[tuple[str, str]]:
        if problem := dns1123_subdomain_error(self.node_name):
            yield "node_name", f"{problem}; the default is the lower-cased host name, set node_name explicitly"
        if self.cluster is not None and self.cluster.tunnel is not None and not self.kubelet_api.address:
            yield "cluster.tunnel", "carries the kubelet API, which [kubelet_api] address = \"\" disables"

    def ignored(self) -> Iterator[str]:
        """Settings still read but no longer applied, each with what replaced it (logged at start)."""
        if self.runtime.image_pull_timeout:
            yield (f"[runtime] image_pull_timeout = {format_duration(self.runtime.image_pull_timeout)!r} is ignored: "
                   "a pull has no deadline and is cancelled only when it makes no progress ([images] "
                   "pull_progress_timeout)")

    def derived_paths(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in ("pods_dir", "state_dir", "cache_dir", "images_dir")}


# -- reading --------------------------------------------------------------------------------------

# The settings fit in a few kilobytes and three levels; anything far beyond is not a config file.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_CONFIG_DEPTH = 8
# tomllib keeps an entry for every prefix of a dotted key or table name, so a key of n parts costs n² (10,000
# parts: 400 MB) before any depth check can run; far more parts than any key or value has are refused unread.
MAX_DOTTED_PARTS = 64
_LONG_DOTTED_KEY = re.compile(
    r"""(?<![A-Za-z0-9_-])(?:(?:[A-Za-z0-9_-]++|"[^"\n]*+"|'[^'\n]*+')[ \t]*+\.[ \t]*+){"""
    + str(MAX_DOTTED_PARTS) + "}")  # the look-behind keeps the search linear: each run of key characters is tried once


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a config file; any problem raises ConfigError naming the file and the dotted key."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read config file: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(path, "", f"config file is more than the {MAX_CONFIG_BYTES} bytes allowed")
    try:
        text = raw.decode()
        if long_key := _LONG_DOTTED_KEY.search(text):
            line = text.count("\n", 0, long_key.start()) + 1
            raise ConfigError(path, "", f"more than {MAX_DOTTED_PARTS} dot-separated parts in one key or value "
                                        f"(line {line}): no setting is nested like that")
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", f"TOML syntax error: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "", f"not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ConfigError(path, "", f"nested more than {MAX_CONFIG_DEPTH} levels deep") from None
    except ValueError as exc:  # after its subclasses above: an integer of more than 4300 digits
        raise ConfigError(path, "", f"TOML value out of range: {str(exc)[:120]}") from None
    if problem := document_problem(data, max_depth=MAX_CONFIG_DEPTH):
        raise ConfigError(path, problem[0], problem[1])
    return parse_config(data, path, base_dir=os.path.dirname(os.path.abspath(path)))


def parse_config(data: Mapping[str, Any], path: str = "<config>", *, base_dir: str | None = None) -> Config:
    """Build a Config from parsed TOML; relative paths are resolved against `base_dir` (default: cwd)."""
    return _read_section(Config, data, path, "", base_dir or os.getcwd())


def _read_section(cls: type, table: Any, path: str, prefix: str, base_dir: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(path, prefix.rstrip("."), f"expected a table, got {_toml_type(table)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        spec = fields.get(key)
        if spec is None:
            known = ", ".join(fields)
            raise ConfigError(path, dotted, f"unknown setting (known here: {known})")
        if "section" in spec.metadata:
            values[key] = _read_section(spec.metadata["section"], value, path, f"{dotted}.", base_dir)
            continue
        kind: _Kind = spec.metadata["kind"]
        try:
            values[key] = kind.read(value)
        except ValueError as exc:
            raise ConfigError(path, dotted, str(exc)) from None
        if kind.is_path and values[key]:
            values[key] = os.path.normpath(os.path.join(base_dir, values[key]))
    result = cls(**values)
    for key, message in getattr(result, "problems", lambda: ())():
        raise ConfigError(path, f"{prefix}{key}", message)
    return result


# -- writing --------------------------------------------------------------------------------------

def _to_dict(obj: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for spec in dataclasses.fields(obj):
        value = getattr(obj, spec.name)
        if "section" in spec.metadata:
            if value is not None:
                result[spec.name] = _to_dict(value)
        else:
            result[spec.name] = spec.metadata["kind"].write(value)
    return result


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        escaped = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group()):04x}", escaped)
        return f'"{escaped}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def format_effective(config: Config) -> str:
    """The effective settings as a TOML document that `load_config` reads back into an equal Config."""
    data = config.to_dict()
    lines = ["# effective edgelet configuration"]
    lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for name, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{name}]"]
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]
    if config.cluster is None:
        lines += ["", "# [cluster] is absent: standalone (no API server)"]
    lines += ["", "# derived paths"]
    lines += [f"#   {name} = {value}" for name, value in config.derived_paths().items()]
    return "\n".join(lines) + "\n"
