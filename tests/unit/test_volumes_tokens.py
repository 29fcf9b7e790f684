"""Service-account tokens: the claims read back from a token, the kubelet's refresh schedule, the TokenRequest,
and what a failed refresh leaves in place."""

from __future__ import annotations

import asyncio
import base64

import orjson
import pytest

from edgelet.events.recorder import Recorder
from edgelet.kubeapi.errors import Forbidden, ServerError
from edgelet.volumes.errors import VolumeError
from edgelet.volumes.tokens import (
    MAX_TOKEN_AGE,
    NoTokens,
    TokenManager,
    TokenTimes,
    refresh_due,
    token_request,
    token_times,
)

POD = {"metadata": {"name": "web", "namespace": "prod", "uid": "u-1"},
       "spec": {"serviceAccountName": "runner", "containers": [{"name": "app"}]}}


def jwt(**claims) -> bytes:
    def part(obj):
        return base64.urlsafe_b64encode(orjson.dumps(obj)).rstrip(b"=")
    return b".".join([part({"alg": "RS256"}), part(claims), b"signature"])


@pytest.mark.parametrize(
    ("token", "times"),
    [
        (jwt(iat=1000, exp=4600), TokenTimes(1000, 4600)),
        # 1.20 extends a 3607 s token to a year and says when it should have ended: that counts.
        (jwt(iat=1000, exp=1000 + 365 * 86400, **{"kubernetes.io": {"warnafter": 4607}}), TokenTimes(1000, 4607)),
        (jwt(iat=1000), None),
        (jwt(iat=1000, exp=900), None),  # ends before it begins
        (jwt(iat=True, exp=4600), None),
        (b"not-a-jwt", None),
        (b"a.%%%.c", None),
        (b"a." + base64.urlsafe_b64encode(b"[1]") + b".c", None),
    ],
)
def test_token_times(token, times):
    assert token_times(token) == times


# A 1 h token issued at 0: 20 % of its lifetime left at 2880 s.
HOUR = TokenTimes(0, 3600)


@pytest.mark.parametrize(
    ("times", "now", "jitter", "max_age", "due"),
    [
        (HOUR, 2000, 0, MAX_TOKEN_AGE, False),
        (HOUR, 2880, 0, MAX_TOKEN_AGE, False),
        (HOUR, 2881, 0, MAX_TOKEN_AGE, True),  # past 80 % of its lifetime
        (HOUR, 2871, 10, MAX_TOKEN_AGE, True),  # the jitter brings it forward
        (TokenTimes(0, 7 * 86400), 86000, 0, MAX_TOKEN_AGE, False),
        (TokenTimes(0, 7 * 86400), 86401, 0, MAX_TOKEN_AGE, True),  # a week-long token: refreshed after 24 h
        (HOUR, 31, 0, 30, True),  # a shorter maximum age (the config knob) counts the same way
        (HOUR, 29, 0, 30, False),
        (None, 0, 0, MAX_TOKEN_AGE, True),  # nothing readable: get one
    ],
)
def test_refresh_schedule(times, now, jitter, max_age, due):
    assert refresh_due(times, now, jitter, max_age) is due


def test_the_token_request_is_bound_to_the_pod():
    path, body = token_request(POD, {"path": "token", "audience": "vault", "expirationSeconds": 600})
    assert path == "/api/v1/namespaces/prod/serviceaccounts/runner/token"
    assert body == {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
        "audiences": ["vault"], "expirationSeconds": 600,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u-1"}}}
    path, body = token_request({**POD, "spec": {}}, {"path": "token"})
    assert path.endswith("/serviceaccounts/default/token")
    assert body["spec"]["audiences"] == [] and body["spec"]["expirationSeconds"] == 3600


class FakeApi:
    def __init__(self, answers):
        self.answers = list(answers)
        self.requests = []

    async def create(self, path, obj):
        self.requests.append((path, obj))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return {"status": {"token": answer.decode()}}


class Events(Recorder):
    def __init__(self):
        self.seen = []

    def event(self, ref, type, reason, message):
        self.seen.append((type, reason, message))


def manager(api, now, events=None):
    return TokenManager(api, recorder=events or Events(), clock=lambda: now, jitter=lambda: 0.0)


def run(coro):
    return asyncio.run(coro)


def test_a_current_token_on_disk_is_kept_without_asking_the_api():
    api = FakeApi([])
    current = jwt(iat=0, exp=3600)
    assert run(manager(api, 1000).token(POD, "kube-api-access-x", {"path": "token"}, current)) == current
    assert api.requests == []


def test_a_due_or_missing_token_is_requested():
    fresh = jwt(iat=2900, exp=6500)
    api = FakeApi([fresh, fresh])
    assert run(manager(api, 2900).token(POD, "v", {"path": "token"}, jwt(iat=0, exp=3600))) == fresh
    assert run(manager(api, 2900).token(POD, "v", {"path": "token"}, None)) == fresh
    assert len(api.requests) == 2


def test_a_failed_refresh_keeps_the_current_token_until_it_expires_and_says_so():
    current = jwt(iat=0, exp=3600)
    events = Events()
    api = FakeApi([ServerError(0, "ConnectionError", "connection refused")])
    assert run(manager(api, 3000, events).token(POD, "kube-api-access-x", {"path": "token"}, current)) == current
    [(kind, reason, message)] = events.seen
    assert (kind, reason) == ("Warning", "FailedMount")
    assert message.startswith('MountVolume.SetUp failed for volume "kube-api-access-x" : failed to fetch token')
    assert "1970-01-01T01:00:00Z" in message
    assert current.decode() not in message
    # Expired: nothing left to serve, the mount fails.
    api = FakeApi([Forbidden(403, "Forbidden", 'pods "web" not found')])
    with pytest.raises(VolumeError, match='failed to fetch token: .*pods "web" not found'):
        run(manager(api, 3600).token(POD, "v", {"path": "token"}, current))


def test_a_standalone_node_cannot_serve_a_token():
    with pytest.raises(VolumeError, match='service account "runner": this node runs standalone'):
        run(NoTokens().token(POD, "v", {"path": "token"}, None))
