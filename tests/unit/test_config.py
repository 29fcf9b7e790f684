"""Config: defaults, duration and size parsing, one clear error per bad key, effective-config round trip."""

from __future__ import annotations

import pathlib
import re
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgelet.config import (
    Config,
    Threshold,
    format_duration,
    format_effective,
    load_config,
    parse_config,
    parse_duration,
    parse_quantity_bytes,
)
from edgelet.util.errors import ConfigError

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "edgelet.toml"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0), ("0s", 0.0), ("10s", 10.0), ("5m", 300.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0),
        ("1h0m0s", 3600.0), ("1.5s", 1.5), (".5s", 0.5), ("1.s", 1.0), ("250us", 0.00025), ("250µs", 0.00025),
        ("100ns", 1e-7), ("-1s", -1.0), ("+2m", 120.0), ("1h2m3s4ms", 3723.004),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize("text", ["", "10", "s", "1x", "1 s", "1.2.3s", "m5", "1s ", ".s", "1d", "--1s"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (90, "1m30s"), (300, "5m"), (3600, "1h"), (3661, "1h1m1s"), (0.5, "500ms"), (0.0015, "1.5ms"),
     (1.25, "1.25s"), (2e-7, "200ns"), (-10, "-10s")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


_UNITS = ["ns", "us", "µs", "ms", "s", "m", "h"]
MAX_DURATION_TEXT = 64  # the longest duration text parse_duration reads
_NUMBERS = st.one_of(st.from_regex(r"[0-9]{1,12}", fullmatch=True),
                     st.from_regex(r"[0-9]{0,9}\.[0-9]{1,12}", fullmatch=True),
                     st.from_regex(r"[0-9]{1,9}\.", fullmatch=True))


@given(st.sampled_from(["", "-", "+"]), st.lists(st.tuples(_NUMBERS, st.sampled_from(_UNITS)), min_size=1, max_size=4))
def test_parse_duration_agrees_with_exact_fractions(sign, segments):
    """Integer arithmetic in the agent, checked against fractions.Fraction (which the agent no longer loads)."""
    from fractions import Fraction
    text = sign + "".join(number + unit for number, unit in segments)
    per_unit = {"ns": 1, "us": 10**3, "µs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
    exact = sum(Fraction(number) * per_unit[unit] for number, unit in segments)
    if len(text) > MAX_DURATION_TEXT:  # refused by length before any arithmetic (up to 97 characters here)
        with pytest.raises(ValueError, match="is not a duration"):
            parse_duration(text)
    elif exact > 2**63 - 1:
        with pytest.raises(ValueError, match="out of range"):
            parse_duration(text)
    else:
        assert parse_duration(text) == (-1 if sign == "-" else 1) * round(exact) / 1e9


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_format_duration_round_trips(nanoseconds):
    seconds = nanoseconds / 1e9
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [("10Mi", 10 * 2**20), ("1Gi", 2**30), ("100M", 100 * 10**6), ("4096", 4096), ("1.5Ki", 1536), ("1e3", 1000),
     ("0.5", 1), ("0", 0)],
)
def test_parse_quantity_bytes(text, size):
    assert parse_quantity_bytes(text) == size


@pytest.mark.parametrize("text", ["", "10MB", "1K", "-1Mi", "Mi", "10 Mi", "1.2.3"])
def test_parse_quantity_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_quantity_bytes(text)


def test_defaults_match_the_kubelet():
    config = parse_config({"node_name": "edge-1"})
    assert config.node_name == "edge-1"
    assert config.root_dir == "/var/lib/edgelet"
    assert (config.log_level, config.max_pods) == ("info", 110)
    assert config.runtime.endpoint == "unix:///run/containerd/containerd.sock"
    assert config.runtime.socket_path == "/run/containerd/containerd.sock"
    assert (config.runtime.request_timeout, config.runtime.image_pull_timeout) == (120, 0)
    assert (config.pods.manifest_dir, config.pods.file_check_frequency) == ("/etc/edgelet/manifests", 20)
    assert (config.pods.http_url, config.pods.cluster_domain, config.pods.cluster_dns) == ("", "cluster.local", ())
    assert (config.pleg.relist_period, config.pleg.relist_threshold) == (1, 180)
    assert (config.sync.sync_frequency, config.sync.housekeeping_interval) == (60, 2)
    assert (config.backoff.crashloop_initial, config.backoff.crashloop_max) == (10, 300)
    assert (config.backoff.image_pull_initial, config.backoff.image_pull_max) == (10, 300)
    assert config.cluster is None and config.standalone
    assert config.server.host_port == ("127.0.0.1", 10248)
    assert (config.images.gc_high_threshold_percent, config.images.gc_low_threshold_percent) == (85, 80)
    assert config.images.minimum_gc_age == 120
    # The kubelet's serializeImagePulls (true) and maxParallelImagePulls (nil); containerd's 5 min of no progress.
    assert (config.images.serialize_image_pulls, config.images.max_parallel_image_pulls) == (True, 0)
    assert (config.images.parallel_pulls, config.images.pull_progress_timeout) == (1, 300)
    assert (config.logs.container_log_max_size, config.logs.container_log_max_files) == (10 * 2**20, 5)
    assert dict(config.eviction.hard) == {"memory.available": "100Mi", "nodefs.available": "10%",
                                          "imagefs.available": "15%", "nodefs.inodesFree": "5%"}
    assert config.eviction.thresholds()["memory.available"] == Threshold(quantity=100 * 2**20)
    assert config.eviction.thresholds()["nodefs.available"] == Threshold(fraction=0.10)
    assert config.eviction.pressure_transition_period == 300
    assert (config.gc.container_min_age, config.gc.max_per_pod_container, config.gc.max_containers) == (0, 1, -1)


def test_default_node_name_is_the_lower_cased_host_name(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "Edge-Box.Local")
    assert parse_config({}).node_name == "edge-box.local"


def test_derived_paths():
    config = parse_config({"node_name": "n", "root_dir": "/srv/edge"})
    assert config.derived_paths() == {
        "pods_dir": "/srv/edge/pods", "state_dir": "/srv/edge/state",
        "cache_dir": "/srv/edge/cache", "images_dir": "/srv/edge/images",
    }
    assert parse_config({"images": {"airgap_dir": "/media/usb"}}).images_dir == "/media/usb"


def test_cluster_section():
    config = parse_config({"node_name": "n", "cluster": {"kubeconfig": "/etc/kc", "node_labels": {"site": "a"}}},
                          base_dir="/")
    assert config.cluster is not None and not config.standalone
    assert (config.cluster.lease_duration, config.cluster.lease_renew_interval) == (40, 10)
    assert (config.cluster.node_status_update_frequency, config.cluster.node_status_report_frequency) == (10, 300)
    assert config.cluster.status_resync == 10
    assert dict(config.cluster.node_labels) == {"site": "a"}


@pytest.mark.parametrize(
    ("data", "key", "fragment"),
    [
        ({"nodename": "x"}, "nodename", "unknown setting"),
        ({"runtime": {"endpoint": "unix:///x", "timeout": "1s"}}, "runtime.timeout", "unknown setting"),
        ({"pleg": {"relist_period": 1}}, "pleg.relist_period", "expected a duration string"),
        ({"pleg": {"relist_period": "1 sec"}}, "pleg.relist_period", "is not a duration"),
        ({"pleg": {"relist_period": "0s"}}, "pleg.relist_period", "must be more than 0s"),
        ({"pleg": {"relist_period": "-1s"}}, "pleg.relist_period", "must be more than"),
        ({"pleg": {"relist_period": "5m"}}, "pleg.relist_threshold", "longer than relist_period"),
        ({"max_pods": 0}, "max_pods", "between 1 and"),
        ({"max_pods": "110"}, "max_pods", "expected an integer, got string"),
        ({"max_pods": True}, "max_pods", "expected an integer, got boolean"),
        ({"log_level": "verbose"}, "log_level", "must be one of debug, info, warning, error"),
        ({"node_name": "Edge_1"}, "node_name", "DNS-1123"),
        ({"runtime": {"endpoint": "tcp://127.0.0.1:1"}}, "runtime.endpoint", "unix socket"),
        ({"runtime": "x"}, "runtime", "expected a table"),
        ({"pods": {"http_url": "ftp://x"}}, "pods.http_url", "http:// or https://"),
        ({"pods": {"cluster_dns": ["10.0.0.10", "dns"]}}, "pods.cluster_dns", "item 1: 'dns' is not an IP"),
        ({"pods": {"cluster_dns": "10.0.0.10"}}, "pods.cluster_dns", "expected an array"),
        ({"logs": {"container_log_max_size": "10MB"}}, "logs.container_log_max_size", "does not match"),
        ({"logs": {"container_log_max_size": 10}}, "logs.container_log_max_size", "expected a size string"),
        ({"logs": {"container_log_max_files": 1}}, "logs.container_log_max_files", "at least 2"),
        ({"images": {"gc_high_threshold_percent": 101}}, "images.gc_high_threshold_percent", "between 0 and 100"),
        ({"images": {"gc_low_threshold_percent": 90}}, "images.gc_low_threshold_percent", "above gc_high"),
        ({"images": {"max_parallel_image_pulls": 3}}, "images.max_parallel_image_pulls", "serialize_image_pulls"),
        ({"images": {"max_parallel_image_pulls": -1}}, "images.max_parallel_image_pulls", "at least 0"),
        ({"images": {"pull_progress_timeout": "-1s"}}, "images.pull_progress_timeout", "at least 0s"),
        ({"eviction": {"hard": {"memory.free": "1Mi"}}}, "eviction.hard", "'memory.free': unknown eviction signal"),
        ({"eviction": {"hard": {"nodefs.available": "110%"}}}, "eviction.hard", "at most 100%"),
        ({"eviction": {"hard": {"nodefs.available": 10}}}, "eviction.hard", "expected a string"),
        ({"server": {"address": "localhost"}}, "server.address", "host:port"),
        ({"backoff": {"crashloop_max": "1s"}}, "backoff.crashloop_max", "shorter than crashloop_initial"),
        ({"cluster": {}}, "cluster.kubeconfig", "is required"),
        ({"cluster": {"kubeconfig": "k", "lease_renew_interval": "40s"}}, "cluster.lease_renew_interval", "shorter"),
        ({"cluster": {"kubeconfig": "k", "node_labels": {"bad key!": "x"}}}, "cluster.node_labels", "qualified name"),
        ({"gc": {"max_containers": -2}}, "gc.max_containers", "at least -1"),
    ],
)
def test_bad_settings_name_the_key(data, key, fragment):
    data = {"node_name": "n", **data}
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "/etc/edgelet/config.toml")
    error = caught.value
    assert (error.path, error.key) == ("/etc/edgelet/config.toml", key)
    assert fragment in error.message
    text = str(error)
    assert "\n" not in text and text.startswith(f"/etc/edgelet/config.toml: {key}: ")


def test_load_config_missing_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=re.escape(f"{missing}: cannot read config file")):
        load_config(missing)


def test_load_config_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "edgelet.toml"
    path.write_text('node_name = "n"\n[pods]\nmanifest_dir = \n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: TOML syntax error")
    assert "line 3" in str(caught.value)


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    path = tmp_path / "conf" / "edgelet.toml"
    path.parent.mkdir()
    path.write_text('node_name = "n"\nroot_dir = "../state"\n[pods]\nmanifest_dir = "manifests"\n'
                    '[images]\nairgap_dir = ""\n')
    config = load_config(path)
    assert config.root_dir == str(tmp_path / "state")
    assert config.pods.manifest_dir == str(tmp_path / "conf" / "manifests")
    assert config.images_dir == str(tmp_path / "state" / "images")


def test_empty_manifest_dir_stays_disabled():
    assert parse_config({"pods": {"manifest_dir": ""}}).pods.manifest_dir == ""


def test_format_effective_round_trips():
    config = parse_config({
        "node_name": "edge-7", "root_dir": "/data/edge", "log_level": "debug",
        "pods": {"cluster_dns": ["10.96.0.10"], "http_url": "http://127.0.0.1:8080/pods",
                 "file_check_frequency": "90s"},
        "eviction": {"hard": {"memory.available": "200Mi"}},
        "cluster": {"kubeconfig": "/etc/kc", "node_labels": {"example.com/site": "a-b"}},
        "logs": {"container_log_max_size": "100M"},
    }, base_dir="/")
    text = format_effective(config)
    assert parse_config(tomllib.loads(text), base_dir="/") == config
    assert 'file_check_frequency = "1m30s"' in text
    assert 'container_log_max_size = "100M"' in text


def test_to_dict_omits_cluster_when_standalone():
    data = parse_config({"node_name": "n"}).to_dict()
    assert "cluster" not in data
    assert data["pleg"] == {"relist_period": "1s", "relist_threshold": "3m", "evented": True,
                            "evented_relist_period": "5m"}


def test_config_is_frozen():
    config = parse_config({"node_name": "n"})
    with pytest.raises(AttributeError):
        config.max_pods = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.eviction.hard["memory.available"] = "1Gi"  # type: ignore[index]


def _uncommented_example() -> dict:
    """The example with its commented-out settings ("#key = ..." and "#[section]") switched on."""
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        if re.match(r"#(\[|[a-z_]+ = )", line):
            line = line[1:]
        lines.append(line)
    return tomllib.loads("\n".join(lines))


def test_example_config_loads():
    load_config(EXAMPLE)


def test_example_documents_every_setting_with_its_default():
    example = _uncommented_example()
    defaults = parse_config({"node_name": "n", "cluster": {"kubeconfig": "/k", "tunnel": {"servers": ["a:1"]}}},
                            base_dir="/").to_dict()
    # Values that legitimately differ from the defaults in the example (placeholders, local-run paths).
    placeholders = {"node_name", "root_dir", "runtime.endpoint", "pods.manifest_dir", "cluster.kubeconfig",
                    "cluster.node_labels", "cluster.server", "cluster.ca_file", "cluster.ca_cert_hash",
                    "cluster.bootstrap_token", "cluster.tunnel.servers"}

    def walk(expected: dict, actual: dict, prefix: str = "") -> None:
        assert set(actual) == set(expected), f"example keys differ in [{prefix or 'top level'}]"
        for key, value in expected.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict) and key not in ("hard", "node_labels"):
                walk(value, actual[key], f"{dotted}.")
            elif dotted not in placeholders:
                assert actual[key] == value, f"example {dotted} = {actual[key]!r}, default is {value!r}"

    walk(defaults, example)


def test_kubelet_api_table():
    settings = parse_config({"kubelet_api": {"address": "127.0.0.1:10250", "anonymous": True,
                                             "tls_cert_file": "tls/kubelet.crt",
                                             "tls_private_key_file": "tls/kubelet.key"}}, base_dir="/etc/edgelet")
    assert settings.kubelet_api.port == 10250 and settings.kubelet_api.anonymous
    assert settings.kubelet_api.tls_cert_file == "/etc/edgelet/tls/kubelet.crt"
    assert Config().kubelet_api.address == "0.0.0.0:10250" and not Config().kubelet_api.anonymous
    assert parse_config({"kubelet_api": {"address": ""}}).kubelet_api.port == 0
    assert Config().kubelet_api.journal_dir == ""  # the system journal
    assert parse_config({"kubelet_api": {"journal_dir": "journal"}}, base_dir="/data").kubelet_api.journal_dir == \
        "/data/journal"


@pytest.mark.parametrize("table, key, words", [
    ({"anonymous": "yes"}, "kubelet_api.anonymous", "true or false"),
    ({"address": "10250"}, "kubelet_api.address", "host:port"),
    ({"tls_cert_file": "/a.crt"}, "kubelet_api.tls_private_key_file", "set together"),
])
def test_kubelet_api_table_errors_name_the_key(table, key, words):
    with pytest.raises(ConfigError) as error:
        parse_config({"kubelet_api": table}, "edgelet.toml")
    assert error.value.key == key and words in error.value.message


def test_tunnel_settings_and_their_errors(tmp_path):
    from edgelet.config import load_config

    def load(text: str):
        path = tmp_path / "edgelet.toml"
        path.write_text(text)
        return load_config(path)

    base = '[cluster]\nkubeconfig = "/etc/edgelet/kubeconfig"\n[cluster.tunnel]\n'
    tunnel = load(base + 'servers = ["10.0.0.1:8132", "[fd00::1]:8132"]\nconnection_buffer = "1Mi"\n').cluster.tunnel
    assert tunnel.servers == ("10.0.0.1:8132", "[fd00::1]:8132")
    assert tunnel.connection_buffer == 1024 * 1024 and tunnel.max_connections == 64 and tunnel.idle_timeout == 4 * 3600
    assert load('[cluster]\nkubeconfig = "/k"\n').cluster.tunnel is None
    for text, key, words in [
        (base, "cluster.tunnel.servers", "at least one"),
        (base + 'servers = ["10.0.0.1"]\n', "cluster.tunnel.servers", "host:port"),
        (base + 'servers = ["a:1"]\nallowed_destinations = ["b"]\n', "cluster.tunnel.allowed_destinations",
         "host:port"),
        (base + 'servers = ["a:1"]\nmax_connections = 0\n', "cluster.tunnel.max_connections", "between"),
        (base + 'servers = ["a:1"]\nnope = 1\n', "cluster.tunnel.nope", "unknown setting"),
        ('[kubelet_api]\naddress = ""\n' + base + 'servers = ["a:1"]\n', "cluster.tunnel", "kubelet API"),
    ]:
        with pytest.raises(ConfigError) as caught:
            load(text)
        assert caught.value.key == key and words in caught.value.message, (text, caught.value)
        assert str(tmp_path / "edgelet.toml") in str(caught.value)


def test_a_duration_text_of_the_longest_length_is_read_and_a_longer_one_refused():
    assert parse_duration("0" * (MAX_DURATION_TEXT - 2) + "5s") == 5.0
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration("0" * (MAX_DURATION_TEXT - 1) + "5s")


def test_security_settings_and_their_errors():
    security = parse_config({"security": {"seccomp_default": True, "allowed_unsafe_sysctls": ["net.core.*"]}}).security
    assert (security.seccomp_default, security.allowed_unsafe_sysctls) == (True, ("net.core.*",))
    assert parse_config({}).security.seccomp_default is False  # as the kubelet's --seccomp-default
    with pytest.raises(ConfigError) as error:
        parse_config({"security": {"allowed_unsafe_sysctls": ["net.core.*", "vm.swappiness"]}}, "edgelet.toml")
    assert error.value.key == "security.allowed_unsafe_sysctls"
    assert 'item 1: the sysctls "vm.swappiness" are not known to be namespaced' in error.value.message


@pytest.mark.parametrize(
    ("images", "parallel"),
    [({}, 1), ({"max_parallel_image_pulls": 1}, 1), ({"serialize_image_pulls": False}, None),
     ({"serialize_image_pulls": False, "max_parallel_image_pulls": 4}, 4)],
)
def test_parallel_image_pulls_as_the_kubelet_reads_them(images, parallel):
    assert parse_config({"node_name": "n", "images": images}).images.parallel_pulls == parallel


def test_a_pull_deadline_is_read_but_said_to_be_ignored():
    assert list(parse_config({"node_name": "n"}).ignored()) == []
    (notice,) = parse_config({"node_name": "n", "runtime": {"image_pull_timeout": "10m"}}).ignored()
    assert notice.startswith("[runtime] image_pull_timeout = '10m' is ignored") and "pull_progress_timeout" in notice
