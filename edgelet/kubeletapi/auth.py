"""Who is calling the kubelet API and may they: x509 client certificates, bearer tokens by TokenReview,
then a SubjectAccessReview on `nodes/<subresource>`; answers cached as the kubelet's webhooks cache them.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

# The kubelet's webhook cache lifetimes (authentication.webhook.cacheTTL, authorization.webhook.*).
TOKEN_TTL = 120.0
ALLOWED_TTL = 300.0
DENIED_TTL = 30.0
CACHE_ENTRIES = 1024

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

Review = Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]

_MISS = object()
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Identity:
    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


ANONYMOUS = Identity("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True, slots=True)
class Attributes:
    """What a request does, in authorization terms (resource is always `nodes`)."""

    verb: str
    node: str
    subresource: str


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str = ""


class TTLCache(Generic[K, V]):
    """A small LRU whose entries expire; the clock is injectable so tests need no sleeping."""

    def __init__(self, max_entries: int = CACHE_ENTRIES, *, clock: Callable[[], float] = time.monotonic):
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._max_entries = max_entries
        self._clock = clock

    def get(self, key: K, default: Any = None) -> Any:
        entry = self._entries.get(key)
        if entry is None:
            return default
        expires, value = entry
        if self._clock() >= expires:
            del self._entries[key]
            return default
        self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V, ttl: float) -> None:
        self._entries[key] = (self._clock() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def identity_from_peercert(cert: Mapping[str, Any] | None) -> Identity | None:
    """The user of a verified client certificate: CN is the user, each O a group (as the API server reads it)."""
    if not cert:
        return None
    names: list[str] = []
    groups: list[str] = []
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.append(value)
            elif key == "organizationName":
                groups.append(value)
    if not names or not names[0]:
        return None
    return Identity(names[0], tuple(groups) + ("system:authenticated",))


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for any other scheme or none."""
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_review_body(token: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def identity_from_token_review(review: Mapping[str, Any]) -> Identity | None:
    status = review.get("status") or {}
    if not status.get("authenticated"):
        return None
    user = status.get("user") or {}
    extra = tuple(sorted((key, tuple(values)) for key, values in (user.get("extra") or {}).items()))
    return Identity(user.get("username", ""), tuple(user.get("groups") or ()), user.get("uid", ""), extra)


def access_review_body(identity: Identity, attributes: Attributes) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "user": identity.user,
        "groups": list(identity.groups),
        "resourceAttributes": {"verb": attributes.verb, "resource": "nodes", "name": attributes.node,
                               "subresource": attributes.subresource, "group": "", "version": "v1"},
    }
    if identity.uid:
        spec["uid"] = identity.uid
    if identity.extra:
        spec["extra"] = {key: list(values) for key, values in identity.extra}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def decision_from_access_review(review: Mapping[str, Any]) -> Decision:
    status = review.get("status") or {}
    return Decision(bool(status.get("allowed")) and not status.get("denied"), status.get("reason", ""))


def forbidden_message(identity: Identity, attributes: Attributes) -> str:
    """The kubelet's words for a refused request."""
    return (f"Forbidden (user={identity.user}, verb={attributes.verb}, resource=nodes, "
            f"subresource={attributes.subresource})")


class Authenticator:
    """Client certificate first, then bearer token; anonymous only when configured."""

    def __init__(self, review: Review, *, anonymous: bool = False, clock: Callable[[], float] = time.monotonic):
        self._review = review
        self._anonymous = anonymous
        self._tokens: TTLCache[str, Identity | None] = TTLCache(clock=clock)

    async def authenticate(self, peercert: Mapping[str, Any] | None, authorization: str) -> Identity | None:
        identity = identity_from_peercert(peercert)
        if identity is not None:
            return identity
        token = bearer_token(authorization)
        if token is not None:
            return await self._token_identity(token)
        return ANONYMOUS if self._anonymous else None

    async def _token_identity(self, token: str) -> Identity | None:
        cached = self._tokens.get(token, _MISS)
        if cached is not _MISS:
            return cached
        try:
            review = await self._review(TOKEN_REVIEWS, token_review_body(token))
        except Exception as err:  # noqa: BLE001 - an unreachable API server means "not authenticated"
            log.warning("kubelet API: TokenReview failed: %s", err)
            return None
        identity = identity_from_token_review(review)
        self._tokens.put(token, identity, TOKEN_TTL)
        return identity


class Authorizer:
    """SubjectAccessReview with the kubelet's cache: allowed answers kept 5 min, denied ones 30 s."""

    def __init__(self, review: Review, *, clock: Callable[[], float] = time.monotonic):
        self._review = review
        self._decisions: TTLCache[tuple[Identity, Attributes], Decision] = TTLCache(clock=clock)

    async def authorize(self, identity: Identity, attributes: Attributes) -> Decision:
        """Raises when the API server cannot be asked: the caller answers 500, nothing is cached."""
        key = (identity, attributes)
        cached = self._decisions.get(key)
        if cached is not None:
            return cached
        review = await self._review(ACCESS_REVIEWS, access_review_body(identity, attributes))
        decision = decision_from_access_review(review)
        self._decisions.put(key, decision, ALLOWED_TTL if decision.allowed else DENIED_TTL)
        return decision
