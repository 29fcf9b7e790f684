"""The metric types and their Prometheus text format 0.0.4: number formatting, escaping, cumulative
histogram buckets, labelled and unlabelled families, misuse rejected; and a real parser reading it all."""

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgelet.metrics import registry as metrics
from edgelet.metrics.registry import Counter, Gauge, Histogram, Registry, format_value
from tests.scrape import sample_value


@pytest.mark.parametrize("value, text", [
    (0, "0.0"), (1, "1.0"), (3, "3.0"), (-2.5, "-2.5"), (0.005, "0.005"), (2.5, "2.5"), (3600, "3600.0"),
    (0.1953125, "0.1953125"), (1e-7, "1e-07"), (0.0001, "0.0001"),
    (999999.0, "999999.0"), (1e6, "1e+06"), (1234567.5, "1.2345675e+06"), (-1e6, "-1e+06"),
    (1.5e15, "1.5e+15"), (1e16, "1e+16"), (1e20, "1e+20"),
    (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"),
])
def test_format_value(value, text):
    assert format_value(value) == text


def exposition_of(build) -> str:
    registry = Registry()
    build(registry)
    return registry.exposition().decode()


@pytest.mark.parametrize("case, build, text", [
    ("unlabelled counter gets _total, starts at zero",
     lambda r: Counter("syncs", "Syncs done.", registry=r),
     "# HELP syncs_total Syncs done.\n# TYPE syncs_total counter\nsyncs_total 0.0\n"),
    ("a given _total is not doubled",
     lambda r: Counter("syncs_total", "Syncs done.", registry=r).inc(2.5),
     "# HELP syncs_total Syncs done.\n# TYPE syncs_total counter\nsyncs_total 2.5\n"),
    ("labelled family with no children shows only HELP and TYPE",
     lambda r: Counter("errors", "Errors.", ["code"], registry=r),
     "# HELP errors_total Errors.\n# TYPE errors_total counter\n"),
    ("children in the order first used; by name or by position alike",
     lambda r: [(g := Gauge("temp", "T.", ["room", "floor"], registry=r)).labels("b", 2).set(1),
                g.labels(floor="1", room="a").set(-3)],
     '# HELP temp T.\n# TYPE temp gauge\ntemp{room="b",floor="2"} 1.0\ntemp{room="a",floor="1"} -3.0\n'),
    ("help escapes backslash and newline, not quotes",
     lambda r: Gauge("g", 'a\\b\nc "q"', registry=r),
     '# HELP g a\\\\b\\nc "q"\n# TYPE g gauge\ng 0.0\n'),
    ("label values escape backslash, quote and newline",
     lambda r: Gauge("g", "G.", ["path"], registry=r).labels('C:\\x "y"\nz').set(1),
     '# HELP g G.\n# TYPE g gauge\ng{path="C:\\\\x \\"y\\"\\nz"} 1.0\n'),
    ("families in the order created",
     lambda r: [Gauge("b", "B.", registry=r), Gauge("a", "A.", registry=r)],
     "# HELP b B.\n# TYPE b gauge\nb 0.0\n# HELP a A.\n# TYPE a gauge\na 0.0\n"),
])
def test_exposition(case, build, text):
    assert exposition_of(build) == text, case


def test_empty_registry_is_empty():
    assert Registry().exposition() == b""


def observe_all(histogram, values):
    for value in values:
        histogram.observe(value)


@pytest.mark.parametrize("values, buckets, total", [
    ([], ["0.0", "0.0", "0.0", "0.0"], "0.0"),
    ([0.5], ["1.0", "1.0", "1.0", "1.0"], "0.5"),
    ([1.0, 1.0001, 2.5], ["0.0", "1.0", "3.0", "3.0"], "4.5001"),  # a value on a bound counts in that bucket
    ([0.1, 7, 100], ["1.0", "1.0", "1.0", "3.0"], "107.1"),
    ([math.nan], ["0.0", "0.0", "0.0", "1.0"], "NaN"),  # as Go's client: into +Inf
])
def test_histogram_buckets_are_cumulative(values, buckets, total):
    text = exposition_of(lambda r: observe_all(Histogram("d", "D.", buckets=(0.5, 1, 2.5), registry=r), values))
    expected = [f'd_bucket{{le="{le}"}} {count}' for le, count in zip(["0.5", "1.0", "2.5", "+Inf"], buckets)]
    assert text.splitlines()[2:] == [*expected, f"d_sum {total}", f"d_count {float(len(values))}"]


def test_labelled_histogram_puts_le_last_and_keeps_children_apart():
    def build(r):
        histogram = Histogram("op_seconds", "Ops.", ["op"], buckets=(0.1, math.inf), registry=r)
        histogram.labels("list").observe(0.05)
        histogram.labels(op="start").observe(3)
    assert exposition_of(build).splitlines()[2:] == [
        'op_seconds_bucket{op="list",le="0.1"} 1.0', 'op_seconds_bucket{op="list",le="+Inf"} 1.0',
        'op_seconds_sum{op="list"} 0.05', 'op_seconds_count{op="list"} 1.0',
        'op_seconds_bucket{op="start",le="0.1"} 0.0', 'op_seconds_bucket{op="start",le="+Inf"} 1.0',
        'op_seconds_sum{op="start"} 3.0', 'op_seconds_count{op="start"} 1.0',
    ]


@pytest.mark.parametrize("case, misuse, error", [
    ("counter cannot go down", lambda r: Counter("c", "C.", registry=r).inc(-1), ValueError),
    ("labelled child cannot go down either", lambda r: Counter("c", "C.", ["l"], registry=r).labels("x").inc(-0.5),
     ValueError),
    ("too few label values", lambda r: Counter("c", "C.", ["a", "b"], registry=r).labels("x"), ValueError),
    ("unknown label name", lambda r: Counter("c", "C.", ["a"], registry=r).labels(b="x"), ValueError),
    ("positional and named mixed", lambda r: Counter("c", "C.", ["a", "b"], registry=r).labels("x", b="y"),
     ValueError),
    ("labels() on an unlabelled metric", lambda r: Gauge("g", "G.", registry=r).labels("x"), ValueError),
    ("a labelled metric without labels()", lambda r: Gauge("g", "G.", ["a"], registry=r).set(1), ValueError),
    ("same name twice", lambda r: [Gauge("g", "G.", registry=r), Gauge("g", "G.", registry=r)], ValueError),
    ("invalid metric name", lambda r: Gauge("kubelet-pods", "G.", registry=r), ValueError),
    ("invalid label name", lambda r: Gauge("g", "G.", ["pod name"], registry=r), ValueError),
    ("reserved label name", lambda r: Gauge("g", "G.", ["__name"], registry=r), ValueError),
    ("histogram label le", lambda r: Histogram("h", "H.", ["le"], buckets=(1,), registry=r), ValueError),
    ("unsorted buckets", lambda r: Histogram("h", "H.", buckets=(1, 0.5), registry=r), ValueError),
    ("remove what is not there", lambda r: Counter("c", "C.", ["a"], registry=r).remove("x"), KeyError),
])
def test_misuse_is_rejected(case, misuse, error):
    with pytest.raises(error):
        misuse(Registry())


def test_remove_drops_the_series_and_a_new_child_starts_at_zero():
    registry = Registry()
    probes = Counter("probes", "P.", ["result"], registry=registry)
    probes.labels("ok").inc(5)
    assert sample_value(registry, "probes_total", {"result": "ok"}) == 5
    probes.remove("ok")
    assert sample_value(registry, "probes_total", {"result": "ok"}) is None
    assert "probes_total{" not in registry.exposition().decode()
    probes.labels("ok").inc()
    assert probes.labels("ok").value == 1


def test_a_real_parser_reads_the_agents_metrics():
    """prometheus_client's parser (a test dependency only) reads every family the agent exports."""
    metrics.runtime_operations_duration_seconds.labels("version").observe(0.002)
    metrics.started_containers_errors.labels("regular", 'Crash "\\loop"\n').inc()
    metrics.running_pods.set(110)
    metrics.pleg_relist_duration_seconds.observe(0.01)
    parsed = {family.name: family for family in text_string_to_metric_families(metrics.exposition().decode())}
    assert parsed["kubelet_started_containers_errors"].type == "counter"
    assert any(sample.labels == {"container_type": "regular", "code": 'Crash "\\loop"\n'} and sample.value >= 1
               for sample in parsed["kubelet_started_containers_errors"].samples)
    assert parsed["kubelet_running_pods"].samples[0].value == 110
    assert parsed["kubelet_runtime_operations_duration_seconds"].type == "histogram"
    bounds = [sample.labels["le"] for sample in parsed["kubelet_runtime_operations_duration_seconds"].samples
              if sample.name.endswith("_bucket") and sample.labels["operation_type"] == "version"]
    assert bounds[:3] == ["0.005", "0.0125", "0.03125"] and bounds[-1] == "+Inf" and len(bounds) == 15
    assert set(parsed) >= {"kubelet_evictions", "edgelet_events_dropped",
                           "kubelet_pleg_last_seen_seconds", "kubelet_pod_start_sli_duration_seconds"}
