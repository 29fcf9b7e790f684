"""Container failure reasons reach the log once per change of reason, not once per retry."""

from __future__ import annotations

import logging

import pytest

from edgelet.kubelet.podsync import log_reason_changes

POD = {"metadata": {"name": "web", "namespace": "default", "uid": "u"}}
PULL = ("ErrImagePull", 'Failed to pull image "x": connection refused')
BACKOFF = ("ImagePullBackOff", 'Back-off pulling image "x"')


@pytest.mark.parametrize("before, after, logged", [
    ({}, {"main": PULL}, ["main: ErrImagePull: Failed to pull image"]),
    ({"main": PULL}, {"main": (PULL[0], "another message, same reason")}, []),
    ({"main": PULL}, {"main": BACKOFF}, ["main: ImagePullBackOff: Back-off pulling image"]),
    ({"main": PULL}, {}, []),
    ({}, {"a": PULL, "b": ("CreateContainerConfigError", 'configmap "c" not found')},
     ["a: ErrImagePull", 'b: CreateContainerConfigError: configmap "c" not found']),
])
def test_reasons_logged_once_per_change(caplog, before, after, logged):
    with caplog.at_level(logging.WARNING, logger="edgelet.kubelet.podsync"):
        log_reason_changes(POD, before, after)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(logged)
    for line, expected in zip(lines, logged):
        assert line.startswith("pod web_default container ") and expected in line
