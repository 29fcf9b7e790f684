"""The record of parsed manifests: a restart parses only what changed, and a bad record costs nothing but time."""

from __future__ import annotations

import copy
import os
import time

import orjson
import pytest

from edgelet.api import podutil
from edgelet.podconfig import file as file_source
from edgelet.podconfig.file import PARSED_KIND, ManifestScanner, ParsedManifests
from edgelet.util import checkpoint

NODE = "n1"
POD = "kind: Pod\nmetadata: {name: %s}\nspec: {containers: [{name: c, image: 'busybox:1'}]}\n"
CONFIGMAP = "kind: ConfigMap\nmetadata: {name: settings}\ndata: {a: '1'}\n"


@pytest.fixture
def parses(monkeypatch):
    """The manifests parse_manifest was asked to parse, by file name."""
    seen: list[str] = []
    real = file_source.parse_manifest

    def counting(data, path, node_name):
        seen.append(os.path.basename(path))
        return real(data, path, node_name)

    monkeypatch.setattr(file_source, "parse_manifest", counting)
    return seen


@pytest.fixture
def manifests(tmp_path):
    directory = tmp_path / "manifests"
    directory.mkdir()
    (directory / "a.yaml").write_text(POD % "a" + "---\n" + CONFIGMAP)
    (directory / "b.yaml").write_text(POD % "b")
    (directory / "broken.yaml").write_text("kind: Pod\nmetadata: [\n")
    return directory


def scanner(manifests, state, node=NODE) -> ManifestScanner:
    return ManifestScanner(str(manifests), node, parsed=ParsedManifests(str(state), node))


def without_seen(objects):
    """The objects as parsed, but for config.seen: each read stamps its own (the kubelet's first-seen time)."""
    pods = copy.deepcopy(objects.pods)
    for pod in pods:
        del pod["metadata"]["annotations"][podutil.CONFIG_SEEN_ANNOTATION]
    return pods, objects.configmaps, objects.secrets


def record_file(state):
    return state / checkpoint.key_to_filename("parsed")


def test_a_restart_parses_only_the_files_it_could_not_reuse(manifests, tmp_path, parses):
    state = tmp_path / "state"
    first = scanner(manifests, state).scan()
    time.sleep(0.001)
    assert sorted(parses) == ["a.yaml", "b.yaml", "broken.yaml"]
    parses.clear()
    again = scanner(manifests, state).scan()  # the next start
    assert parses == ["broken.yaml"]  # not recorded: its error is reported at every start
    assert without_seen(again.objects) == without_seen(first.objects)
    assert [os.path.basename(error.path) for error in again.new_errors] == ["broken.yaml"]
    seen = [podutil.annotations(pod)[podutil.CONFIG_SEEN_ANNOTATION] for pod in (*first.objects.pods,
                                                                                 *again.objects.pods)]
    assert seen[0] < seen[2] and seen[1] < seen[3]  # stamped by the read that found them, as a parse stamps them


def test_written_when_content_changes_and_only_then(manifests, tmp_path, parses):
    state = tmp_path / "state"
    source = scanner(manifests, state)
    source.scan()
    written = record_file(state).stat()
    source.scan()
    scanner(manifests, state).scan()  # a restart with nothing changed writes nothing either
    assert (record_file(state).stat().st_ino, record_file(state).stat().st_mtime_ns) == (written.st_ino,
                                                                                        written.st_mtime_ns)
    (manifests / "b.yaml").write_text(POD % "b2")
    parses.clear()
    changed = source.scan()
    assert parses == ["b.yaml"]
    assert record_file(state).stat().st_ino != written.st_ino
    parses.clear()
    restarted = scanner(manifests, state).scan()
    assert parses == ["broken.yaml"]
    assert without_seen(restarted.objects) == without_seen(changed.objects)
    assert sorted(pod["metadata"]["name"] for pod in restarted.objects.pods) == ["a-n1", "b2-n1"]


def test_a_read_writes_nothing_and_its_record_is_pending_until_recorded(manifests, tmp_path):
    """The file source hands a read's pods on first and records them after (the record only speeds up the next
    start): `read` never writes, `record_pending` says whether `record` would."""
    state = tmp_path / "state"
    source = scanner(manifests, state)
    first = source.read()
    assert not record_file(state).exists()
    assert source.record_pending(first)
    source.record(first)
    written = record_file(state).stat()
    unchanged = source.read()
    assert not source.record_pending(unchanged)
    (manifests / "b.yaml").write_text(POD % "b2")
    changed = source.read()
    assert record_file(state).stat().st_ino == written.st_ino  # still the old record
    assert source.record_pending(changed)
    source.record(changed)
    assert not source.record_pending(changed)
    restarted = scanner(manifests, state).scan()
    assert sorted(pod["metadata"]["name"] for pod in restarted.objects.pods) == ["a-n1", "b2-n1"]
    assert not ManifestScanner(str(manifests), NODE).record_pending(unchanged)  # nowhere to record to


@pytest.fixture
def opened(monkeypatch):
    """The manifests the scanner opened, by file name."""
    seen: list[str] = []

    def counting(path, *args, **kwargs):
        seen.append(os.path.basename(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(file_source, "open", counting, raising=False)
    return seen


class Clock:
    """Wall-clock nanoseconds as the scanner reads them, `ahead` of the real clock."""

    def __init__(self):
        self.ahead = 0

    def __call__(self) -> int:
        return time.time_ns() + self.ahead


def test_a_restart_does_not_read_a_manifest_whose_recorded_stat_vouches_for_it(manifests, tmp_path, opened):
    state, clock = tmp_path / "state", Clock()
    source = ManifestScanner(str(manifests), NODE, parsed=ParsedManifests(str(state), NODE), clock=clock)
    source.scan()  # just written: too recent for their stat to vouch for their bytes (RACY_NS)
    written = record_file(state).stat()
    opened.clear()
    restarted = scanner(manifests, state).scan()
    assert sorted(opened) == ["a.yaml", "b.yaml", "broken.yaml"]  # recorded without a signature: read
    clock.ahead = file_source.RACY_NS + 1_000_000_000
    settled = source.read()
    assert source.record_pending(settled)  # the same bytes, now with a signature worth keeping
    source.record(settled)
    assert record_file(state).stat().st_ino != written.st_ino
    assert not source.record_pending(source.read())
    opened.clear()
    again = scanner(manifests, state).scan()
    assert opened == ["broken.yaml"]  # not recorded: read and reported at every start
    assert without_seen(again.objects) == without_seen(restarted.objects)
    (manifests / "b.yaml").write_text(POD % "c")  # same size, other bytes: another stat
    opened.clear()
    changed = scanner(manifests, state).scan()
    assert sorted(opened) == ["b.yaml", "broken.yaml"]
    assert sorted(pod["metadata"]["name"] for pod in changed.objects.pods) == ["a-n1", "c-n1"]


def test_a_record_without_signatures_is_read_as_before(manifests, tmp_path, opened, parses):
    """A record written before signatures were kept: every file is read again, none is parsed again."""
    state, clock = tmp_path / "state", Clock()
    clock.ahead = file_source.RACY_NS + 1_000_000_000
    ManifestScanner(str(manifests), NODE, parsed=ParsedManifests(str(state), NODE), clock=clock).scan()
    path = record_file(state)
    record = orjson.loads(checkpoint.decode(path.read_bytes(), PARSED_KIND))
    assert all(entry.pop("signature") for entry in record["entries"])
    path.write_bytes(checkpoint.encode(PARSED_KIND, orjson.dumps(record)))
    opened.clear()
    parses.clear()
    scanner(manifests, state).scan()
    assert sorted(opened) == ["a.yaml", "b.yaml", "broken.yaml"]
    assert parses == ["broken.yaml"]


def test_another_node_name_parses_anew(manifests, tmp_path, parses):
    state = tmp_path / "state"
    scanner(manifests, state).scan()
    parses.clear()
    result = scanner(manifests, state, node="n2").scan()
    assert sorted(parses) == ["a.yaml", "b.yaml", "broken.yaml"]
    assert sorted(pod["metadata"]["name"] for pod in result.objects.pods) == ["a-n2", "b-n2"]


@pytest.mark.parametrize("stamp", ["parser", "yaml"])
def test_a_record_of_another_parser_is_parsed_anew(manifests, tmp_path, parses, monkeypatch, stamp):
    """A parse that would yield other objects (its modules' source or the YAML library changed: another libyaml, or
    PyYAML in the pure run) does not reuse."""
    state = tmp_path / "state"
    scanner(manifests, state).scan()
    parses.clear()
    if stamp == "parser":
        monkeypatch.setattr(file_source, "PARSER_DIGEST", "sha256:" + "1" * 64)
    else:
        monkeypatch.setattr(file_source.yamlload, "LIBRARY", "libyaml 0.0")
    scanner(manifests, state).scan()
    assert sorted(parses) == ["a.yaml", "b.yaml", "broken.yaml"]
    parses.clear()
    scanner(manifests, state).scan()  # recorded again under the new parser
    assert parses == ["broken.yaml"]


@pytest.mark.parametrize("damage", [
    lambda data: data[:-3],  # torn write
    lambda data: checkpoint.encode(PARSED_KIND, b'[]'),  # intact bytes, no usable record
    lambda data: checkpoint.encode(PARSED_KIND, data.split(b"\n", 1)[1].replace(b'"pods":[{', b'"pods":[[{', 1)),
    lambda data: checkpoint.encode(PARSED_KIND,
                                   data.split(b"\n", 1)[1].replace(b'"signature":null', b'"signature":[1]', 1)),
])
def test_a_bad_record_is_set_aside_and_the_manifests_parsed(manifests, tmp_path, parses, damage, caplog):
    state = tmp_path / "state"
    expected = scanner(manifests, state).scan().objects
    path = record_file(state)
    path.write_bytes(damage(path.read_bytes()))
    parses.clear()
    result = scanner(manifests, state).scan()
    assert sorted(parses) == ["a.yaml", "b.yaml", "broken.yaml"]
    assert without_seen(result.objects) == without_seen(expected)
    assert len(list((state / checkpoint.CORRUPT_DIR).iterdir())) == 1
    assert str(path) in caplog.text or path.name in caplog.text
    parses.clear()
    scanner(manifests, state).scan()  # and rewritten whole
    assert parses == ["broken.yaml"]


def test_a_record_that_cannot_be_written_costs_a_warning(manifests, tmp_path, caplog):
    (tmp_path / "state").write_text("a file where the state directory belongs")
    state = tmp_path / "state" / "manifests"
    result = scanner(manifests, state).scan()
    assert sorted(pod["metadata"]["name"] for pod in result.objects.pods) == ["a-n1", "b-n1"]
    assert f"recording the parsed manifests under {state} failed" in caplog.text
