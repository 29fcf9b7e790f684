"""Service-account tokens for projected volumes, the kubelet's token manager: a TokenRequest as the node, bound
to the pod, refreshed at 80 % of its lifetime or after 24 h (with jitter), the current token kept while a
refresh fails and it has not expired.

The token file in the pod's volume is the only copy: after a restart it is read back from there and serves
until its refresh is due. Nothing here logs a token or keeps one beyond the call that writes it.
"""

from __future__ import annotations

import base64
import binascii
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

import orjson

from edgelet.api import podutil
from edgelet.api.podutil import Pod
from edgelet.util.errors import EdgeletError

from ..events import NO_EVENTS, WARNING, Recorder, pod_ref
from .errors import VolumeError

log = logging.getLogger(__name__)

# The kubelet's token manager constants: a token older than this is refreshed whatever its lifetime, and a
# random part of up to MAX_JITTER spreads the refreshes of many pods.
MAX_TOKEN_AGE = 24 * 3600.0
MAX_JITTER = 10.0
REFRESH_FRACTION = 0.2  # refreshed once less than this part of its lifetime is left
DEFAULT_EXPIRATION_SECONDS = 3600  # the API's default for serviceAccountToken.expirationSeconds
TOKEN_FILE_MODE_WITH_OWNER = 0o600


@dataclass(frozen=True, slots=True)
class TokenTimes:
    """When a token was issued and until when the kubelet counts it valid (epoch seconds)."""

    issued_at: float
    expires_at: float


def token_times(token: bytes) -> TokenTimes | None:
    """`iat` and the end of the token's lifetime from a JWT's claims, or None for anything else.

    The end is `kubernetes.io.warnafter` where the API server extended a 3607 s token to a year (1.20's
    --service-account-extend-token-expiration): the TokenRequest's own expirationTimestamp, which is what
    the kubelet counts from.
    """
    parts = token.split(b".")
    if len(parts) != 3:
        return None
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(parts[1] + b"=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not isinstance(claims, dict):
        return None
    kubernetes = claims.get("kubernetes.io")
    warn_after = kubernetes.get("warnafter") if isinstance(kubernetes, dict) else None
    issued_at = claims.get("iat")
    expires_at = warn_after if _is_number(warn_after) else claims.get("exp")
    if not (_is_number(issued_at) and _is_number(expires_at)) or expires_at <= issued_at:
        return None
    return TokenTimes(float(issued_at), float(expires_at))


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def refresh_due(times: TokenTimes | None, now: float, jitter: float, max_age: float = MAX_TOKEN_AGE) -> bool:
    """The kubelet's requiresRefresh: older than `max_age`, or within 20 % of its lifetime of the end,
    each brought forward by `jitter` seconds. A token whose times cannot be read is always due."""
    if times is None:
        return True
    if now > times.issued_at + max_age - jitter:
        return True
    lifetime = times.expires_at - times.issued_at
    return now > times.expires_at - lifetime * REFRESH_FRACTION - jitter


def expired(times: TokenTimes | None, now: float) -> bool:
    return times is None or now >= times.expires_at


def service_account_name(pod: Pod) -> str:
    spec = podutil.spec(pod)
    return spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"


def token_request(pod: Pod, source: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The path and body of the TokenRequest the kubelet sends for one serviceAccountToken source."""
    spec: dict[str, Any] = {
        "audiences": [source["audience"]] if source.get("audience") else [],
        "expirationSeconds": int(source.get("expirationSeconds") or DEFAULT_EXPIRATION_SECONDS),
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": podutil.name(pod), "uid": podutil.uid(pod)},
    }
    namespace = podutil.namespace(pod) or "default"
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account_name(pod)}/token"
    return path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def fs_user(pod: Pod) -> int | None:
    """The one runAsUser every init and regular container runs as, or None (the kubelet's FsUserFrom)."""
    pod_user = (podutil.spec(pod).get("securityContext") or {}).get("runAsUser")
    found: int | None = None
    for container in podutil.init_containers(pod) + podutil.containers(pod):
        user = (container.get("securityContext") or {}).get("runAsUser", pod_user)
        if user is None or (found is not None and user != found):
            return None
        found = user
    return found


def token_file_mode(default_mode: int, owner: int | None, fs_group: int | None) -> int:
    """The token file's bits: the volume's defaultMode, or 0600 once the file has an owner or group (an
    fsGroup then adds group read, 0640, as the kubelet's SetVolumeOwnership does)."""
    return TOKEN_FILE_MODE_WITH_OWNER if owner is not None or fs_group is not None else default_mode


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class TokenApi(Protocol):
    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]: ...


class TokenManager:
    """Gets and refreshes tokens through the API client the node uses (its own credentials)."""

    def __init__(self, api: TokenApi, *, recorder: Recorder = NO_EVENTS, max_age: float = MAX_TOKEN_AGE,
                 clock: Callable[[], float] = time.time, jitter: Callable[[], float] | None = None):
        self._api = api
        self._recorder = recorder
        self._max_age = max_age
        self._clock = clock
        self._jitter = jitter or (lambda: random.uniform(0.0, MAX_JITTER))

    async def token(self, pod: Pod, volume_name: str, source: dict[str, Any], current: bytes | None) -> bytes:
        """The token to write for `source`: `current` (the file in the volume) unless its refresh is due.

        A failed refresh keeps `current` while it has not expired and reports a FailedMount event; with
        no usable token left it raises VolumeError.
        """
        times = token_times(current) if current else None
        now = self._clock()
        if current and times is not None and not refresh_due(times, now, self._jitter(), self._max_age):
            log.debug("pod %s: the service-account token of volume %s is current (issued %s, valid until %s)",
                      podutil.full_name(pod), volume_name, _stamp(times.issued_at), _stamp(times.expires_at))
            return current
        path, body = token_request(pod, source)
        try:
            reply = await self._api.create(path, body)
            token = ((reply.get("status") or {}).get("token") or "").encode()
            if not token:
                raise VolumeError("the TokenRequest answer holds no token")
            return token
        except EdgeletError as exc:
            problem = f"failed to fetch token: {exc}"
            if current and times is not None and not expired(times, now):
                until = _stamp(times.expires_at)
                self._recorder.event(pod_ref(pod), WARNING, "FailedMount",
                                     f'MountVolume.SetUp failed for volume "{volume_name}" : {problem} '
                                     f"(the current token serves until it expires at {until})")
                return current
            raise VolumeError(problem) from None


class NoTokens:
    """A node without an API server: a serviceAccountToken source cannot be served, the mount fails."""

    async def token(self, pod: Pod, volume_name: str, source: dict[str, Any], current: bytes | None) -> bytes:
        raise VolumeError(f'cannot get a token for service account "{service_account_name(pod)}": this node '
                          "runs standalone (no [cluster]), and only an API server issues service-account tokens")


TokenSource = TokenManager | NoTokens
