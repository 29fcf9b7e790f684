"""The ConfigMap/Secret store: per-source replacement, validation and change notifications."""

from __future__ import annotations

import base64

import pytest

from edgelet.api.objectstore import InvalidObjectError, ObjectStore, secret_data


def _cm(name, namespace="default", **data):
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}


def _secret(name, **data):
    return {"kind": "Secret", "metadata": {"name": name},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def test_put_get_delete_and_notifications():
    changes = []
    store = ObjectStore(on_change=lambda *change: changes.append(change))
    assert store.put(_cm("a", x="1"))
    assert not store.put(_cm("a", x="1"))  # identical: no change, no notification
    assert store.put(_secret("s", k="v"))
    assert store.get_configmap("default", "a")["data"] == {"x": "1"}
    assert store.get_secret("", "s") is not None  # an empty namespace means "default"
    assert store.get_configmap("other", "a") is None
    assert store.delete("ConfigMap", "default", "a")
    assert not store.delete("ConfigMap", "default", "a")
    assert [(kind, ns, name, obj is not None) for kind, ns, name, obj in changes] == [
        ("ConfigMap", "default", "a", True), ("Secret", "default", "s", True), ("ConfigMap", "default", "a", False)]


def test_replace_all_only_touches_its_own_source():
    store = ObjectStore()
    store.put(_cm("from-api"), source="api")
    store.replace_all("file", [_cm("one"), _cm("two")])
    store.replace_all("file", [_cm("two", x="2")])
    assert store.get_configmap("default", "one") is None
    assert store.get_configmap("default", "two")["data"] == {"x": "2"}
    assert store.get_configmap("default", "from-api") is not None
    assert [o["metadata"]["name"] for o in store.objects("file")] == ["two"]


def test_an_invalid_update_keeps_the_last_good_version():
    store = ObjectStore()
    store.replace_all("file", [_secret("s", k="v")])
    broken = _secret("s")
    broken["data"] = {"k": "not base64!"}
    problems = store.replace_all("file", [broken, {"kind": "Pod"}])
    assert problems == ["Secret default/s: data['k'] is not valid base64",
                        "kind: expected ConfigMap, Secret, PersistentVolumeClaim or PersistentVolume, got 'Pod'"]
    assert secret_data(store.get_secret("default", "s")) == {"k": b"v"}


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"kind": "ConfigMap", "metadata": {}}, "metadata.name is required"),
        ({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": 1}}, "data['k'] must be a string"),
        ({"kind": "ConfigMap", "metadata": {"name": "c"}, "data": []}, "data must be an object"),
        ({"kind": "ConfigMap", "metadata": {"name": "c"}, "binaryData": {"k": "@@"}}, "is not valid base64"),
        ("text", "expected a ConfigMap, Secret, PersistentVolumeClaim or PersistentVolume object"),
    ],
)
def test_put_rejects_unusable_objects(obj, message):
    with pytest.raises(InvalidObjectError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ObjectStore().put(obj)


def test_secret_string_data_wins_over_data():
    secret = _secret("s", k="old", other="o")
    secret["stringData"] = {"k": "new"}
    assert secret_data(secret) == {"k": b"new", "other": b"o"}


def test_a_failing_on_change_does_not_break_the_store():
    def explode(*_):
        raise RuntimeError("disk full")

    store = ObjectStore(on_change=explode)
    assert store.put(_cm("a"))
    assert store.get_configmap("default", "a") is not None
