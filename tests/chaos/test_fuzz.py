"""Fuzzed manifests, config files and API objects through the agent's real parsing and validation entry points.

The bulk runs in-process (Hypothesis with a fixed seed, no shrinking: every case is counted, none stops the run):
manifests from the Pod schema, mutations of valid ones, byte damage and a fixed set of bombs; config files from
the config schema, mutations and known-bad values; API pods, ConfigMaps and Secrets. Memory is capped while it
runs, so a bomb ends in a MemoryError (a failure) rather than in the machine's swap.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import tomllib
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from edgelet import config as edgelet_config
from edgelet.api.objectstore import InvalidObjectError, validate_object
from edgelet.kubeapi.objects import cleaned
from edgelet.podconfig.apiserver import pod_problem
from edgelet.podconfig.manifest import parse_manifest
from edgelet.util.errors import EdgeletError
from tests.chaos.fuzzing import (
    WILD,
    Outcome,
    bombs,
    configmap_dicts,
    exercise_pod,
    garble,
    mutate,
    pod_dicts,
    run_case,
    serialize,
)
from tests.integration.agent_harness import REPO

SEED = 10_4242
NODE = "fuzznode"
MEMORY_HEADROOM = 1536 << 20
MEMORY_GROWTH_LIMIT_MB = 300
MEGABYTE = 1 << 20


def _settings(cases: int):
    return settings(max_examples=cases, database=None, deadline=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


@pytest.fixture
def capped_memory():
    """Caps the address space at what the process has plus MEMORY_HEADROOM; yields a function that tells the
    growth of the peak RSS since the start, in MB."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_vm("VmSize") + MEMORY_HEADROOM, hard))
    before = _vm("VmHWM")
    try:
        yield lambda: (_vm("VmHWM") - before) / (1 << 20)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def record(figures, what: str, outcomes: list[Outcome], growth_mb: float) -> None:
    failures = [o for o in outcomes if o.failure]
    figures.add("fuzz_cases", len(outcomes))
    figures.add("fuzz_failures", len(failures))
    kinds: dict[str, int] = {}
    for failure in failures:
        kinds[failure.failure[:60]] = kinds.get(failure.failure[:60], 0) + 1
    figures.note(f"fuzz {what}: seed={SEED} cases={len(outcomes)} failures={len(failures)} "
                 f"peak_rss_growth_mb={growth_mb:.0f}"
                 + "".join(f"\n    {count} x {text}" for text, count in sorted(kinds.items(), key=lambda kv: -kv[1])))
    details = "\n".join(f"{o.label}: {o.failure}" for o in failures[:25])
    assert not failures, f"{len(failures)} of {len(outcomes)} {what} cases failed:\n{details}"
    assert growth_mb <= MEMORY_GROWTH_LIMIT_MB, f"memory grew by {growth_mb:.0f} MB"


def valid_pods() -> list[dict]:
    """Valid manifests to mutate: the examples plus one busybox pod with most features."""
    pods = []
    for path in sorted((REPO / "examples" / "manifests").glob("*.yaml")):
        pods += [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc,
                                                                                   dict) and doc.get("kind") == "Pod"]
    pods.append({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "full", "labels": {"app": "x"}, "annotations": {"a": "b"}},
        "spec": {"restartPolicy": "Always", "terminationGracePeriodSeconds": 5, "activeDeadlineSeconds": 600,
                 "hostNetwork": True, "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}},
                                                  {"name": "cfg",
                                                   "configMap": {"name": "cfg", "items": [{"key": "k", "path": "p"}]}}],
                 "securityContext": {"runAsUser": 1000, "fsGroup": 2000},
                 "containers": [{"name": "main", "image": "docker.io/library/busybox:local",
                                 "command": ["sh", "-c", "sleep 1"],
                                 "env": [{"name": "A", "value": "1"},
                                         {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                                 "ports": [{"containerPort": 80, "hostPort": 8080}],
                                 "resources": {"limits": {"cpu": "500m", "memory": "64Mi"},
                                               "requests": {"cpu": "100m"}},
                                 "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                                 "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 5},
                                 "readinessProbe": {"httpGet": {"port": 80, "path": "/"}},
                                 "lifecycle": {"preStop": {"sleep": {"seconds": 1}}}}]},
    })
    return pods


def manifest_case(label: str, data: bytes, path: str, *, structured: bool) -> Outcome:
    def call():
        for pod in parse_manifest(data, path, NODE).pods:
            exercise_pod(pod)

    # Errors that a pod worker reports in the pod's status (e.g. an env reference) are handled, not crashes.
    return run_case(label, call, names=path, field_expected=structured, tolerated=(EdgeletError,))


def test_fuzz_manifests(scale, figures, capped_memory):
    outcomes: list[Outcome] = []
    valid = valid_pods()

    @_settings(scale.fuzz_cases)
    @seed(SEED)
    @given(st.data())
    def one_case(data):
        path = f"/fuzz/manifests/case-{len(outcomes)}.yaml"
        how = data.draw(st.sampled_from(["yaml", "json"]))
        style = data.draw(st.sampled_from(["schema", "schema", "mutation", "mutation", "bytes"]))
        if style == "schema":
            document = data.draw(st.one_of(pod_dicts(), pod_dicts(), pod_dicts(), configmap_dicts()))
            raw = serialize(document, how)
        elif style == "mutation":
            document = mutate(data.draw(st.sampled_from(valid)), data.draw, data.draw(st.integers(1, 4)))
            raw = serialize(document, how)
        else:
            raw = garble(serialize(data.draw(st.sampled_from(valid)), how), data.draw)
        # A document beyond the size limit is refused as a whole, before any field is looked at.
        structured = style != "bytes" and len(raw) < MEGABYTE
        outcomes.append(manifest_case(f"{style}/{how} #{len(outcomes)}", raw, path, structured=structured))

    one_case()
    for label, raw in bombs(valid[-1]):
        outcomes.append(manifest_case(label, raw, f"/fuzz/manifests/{label.replace(' ', '-')}.yaml", structured=False))
    record(figures, "manifests", outcomes, capped_memory())


# -- config files ----------------------------------------------------------------------------------------------

def config_keys(cls=edgelet_config.Config, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    keys = []
    for spec in dataclasses.fields(cls):
        if "section" in spec.metadata:
            keys += config_keys(spec.metadata["section"], (*prefix, spec.name))
        else:
            keys.append((*prefix, spec.name))
    return keys


TOML_VALUE = st.one_of(
    st.text(max_size=30), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.sampled_from(["", "\x00", "/tmp/x\x00y", "99999999999999999999h", "1e400s", "-5s", "0s", "1h2m3s", "1.5.5m",
                     "unix:///run/x.sock", "127.0.0.1:0", "[::1]:99999", "10Gi", "-1Mi", "memory.available<0%",
                     "nodefs.available<200%", "0-3", "3-1", "a" * 5000, "../../../", "relative/dir"]),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
)


def toml_document(values: dict[tuple[str, ...], object]) -> str:
    top = {k[0]: v for k, v in values.items() if len(k) == 1}
    lines = [f"{edgelet_config._toml_key(k)} = {edgelet_config._toml_value(v)}" for k, v in top.items()]
    sections: dict[str, list[str]] = {}
    for key, value in values.items():
        if len(key) > 1:
            sections.setdefault(".".join(key[:-1]), []).append(
                f"{edgelet_config._toml_key(key[-1])} = {edgelet_config._toml_value(value)}")
    for name, body in sections.items():
        lines += [f"[{name}]", *body]
    return "\n".join(lines) + "\n"


VALID_CONFIG = {("node_name",): "fuzznode", ("root_dir",): "/var/lib/edgelet-fuzz",
                ("runtime", "endpoint"): "unix:///run/containerd/containerd.sock",
                ("pods", "manifest_dir"): "/etc/edgelet/manifests", ("pods", "file_check_frequency"): "20s",
                ("backoff", "crashloop_initial"): "10s", ("backoff", "crashloop_max"): "5m",
                ("server", "address"): "127.0.0.1:10248"}
# Values that must be refused, each with the key the error must name (issue 10, point 7).
MUST_REFUSE = [
    ("root_dir", 'root_dir = ""'),
    ("root_dir", 'root_dir = "/var/lib/ed\\u0000gelet"'),
    ("pods.manifest_dir", '[pods]\nmanifest_dir = "/etc/\\u0000x"'),
    ("backoff.crashloop_max", '[backoff]\ncrashloop_max = "99999999999999999999h"'),
    ("pods.file_check_frequency", '[pods]\nfile_check_frequency = "99999999999999999999h"'),
]


def config_case(label: str, text: str | bytes, path: Path, *, whole_document: bool = False,
                must_refuse: str = "") -> Outcome:
    """`whole_document`: a case refused as a whole (size, depth), whose error needs to name no key."""
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(data)
    well_formed = False
    if not whole_document:
        try:
            tomllib.loads(data.decode())
            well_formed = True
        except (ValueError, RecursionError):  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
            pass
    outcome = run_case(label, lambda: edgelet_config.load_config(str(path)), names=str(path),
                       field_expected=well_formed)
    if must_refuse and not outcome.failure:
        try:
            edgelet_config.load_config(str(path))
            outcome.failure = f"accepted a bad {must_refuse}"
        except edgelet_config.ConfigError as err:
            if err.key != must_refuse:
                outcome.failure = f"named {err.key!r}, not {must_refuse!r}"
        except BaseException as err:  # noqa: BLE001
            outcome.failure = f"{type(err).__name__}"
    return outcome


def test_fuzz_config_files(tmp_path, scale, figures, capped_memory):
    keys = config_keys()
    outcomes: list[Outcome] = []

    @_settings(scale.config_fuzz_cases)
    @seed(SEED)
    @given(st.data())
    def one_case(data):
        style = data.draw(st.sampled_from(["schema", "mutation", "bytes"]))
        if style == "schema":
            picked = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=6, unique=True))
            text = toml_document({key: data.draw(TOML_VALUE) for key in picked})
        elif style == "mutation":
            values = dict(VALID_CONFIG)
            for _ in range(data.draw(st.integers(1, 3))):
                values[data.draw(st.sampled_from(list(values) + keys))] = data.draw(TOML_VALUE)
            text = toml_document(values)
        else:
            text = garble(toml_document(VALID_CONFIG).encode(), data.draw)
        outcomes.append(config_case(f"{style} #{len(outcomes)}", text, tmp_path / f"case-{len(outcomes)}.toml"))

    one_case()
    deep = 10_000
    fixed = [("deep array", "x = " + "[" * deep + "]" * deep),
             ("deep inline table", "x = " + "{a = " * deep + "1" + "}" * deep),
             ("deep dotted key", ".".join(["a"] * deep) + " = 1"), ("huge integer", "node_name = 1" + "0" * 5000),
             ("many sections", "\n".join(f"[s{i}]" for i in range(10_000))), ("not UTF-8", b"node_name = \"\xff\""),
             ("NUL byte", b"node_name = \"a\"\x00"), ("empty", ""),
             ("one MB value", f'node_name = "{"n" * 1_000_000}"')]
    for label, text in fixed:
        outcomes.append(config_case(label, text, tmp_path / f"{label.replace(' ', '-')}.toml", whole_document=True))
    for key, text in MUST_REFUSE:
        outcomes.append(config_case(f"refuse {key}: {text!r}", text, tmp_path / f"refuse-{len(outcomes)}.toml",
                                    must_refuse=key))
    record(figures, "config files", outcomes, capped_memory())


# -- API objects -----------------------------------------------------------------------------------------------

def api_pod_case(label: str, obj: object) -> Outcome:
    def call():
        if pod_problem(obj, NODE) is None:
            exercise_pod(cleaned(obj))

    return run_case(label, call, names="", field_expected=False, tolerated=(EdgeletError,))


def api_object_case(label: str, obj: object) -> Outcome:
    def call():
        try:
            validate_object(cleaned(obj) if isinstance(obj, dict) else obj)
        except InvalidObjectError as err:
            if len(str(err)) > 2000:
                raise AssertionError(f"error of {len(str(err))} characters") from None

    return run_case(label, call, names="", field_expected=False)


def test_fuzz_api_objects(scale, figures, capped_memory):
    outcomes: list[Outcome] = []

    @_settings(scale.api_fuzz_cases)
    @seed(SEED)
    @given(st.data())
    def one_case(data):
        if data.draw(st.integers(0, 3)) == 0:
            obj = data.draw(configmap_dicts())
            outcomes.append(api_object_case(f"object #{len(outcomes)}", obj))
            return
        pod = data.draw(pod_dicts())
        if isinstance(pod.get("metadata"), dict) and data.draw(st.booleans()):
            pod["metadata"].update(uid=data.draw(st.uuids()).hex, namespace="default")
        if isinstance(pod.get("spec"), dict) and data.draw(st.integers(0, 4)):
            pod["spec"]["nodeName"] = NODE
        if data.draw(st.booleans()):
            pod["status"] = data.draw(st.one_of(WILD, st.fixed_dictionaries({}, optional={
                "phase": WILD, "containerStatuses": WILD, "startTime": WILD, "podIP": WILD})))
        # What arrives over the wire is JSON: round-trip so only JSON-expressible values remain.
        pod = json.loads(json.dumps(pod))
        outcomes.append(api_pod_case(f"pod #{len(outcomes)}", pod))

    one_case()
    record(figures, "API objects", outcomes, capped_memory())
