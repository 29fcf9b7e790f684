"""Kubelet API authentication and authorization: identities from certificates and TokenReviews, the
SubjectAccessReview body, and the review caches' lifetimes (a fake clock, a recording review function)."""

from __future__ import annotations

import pytest

from edgelet.kubeletapi.auth import (
    ACCESS_REVIEWS,
    ALLOWED_TTL,
    ANONYMOUS,
    DENIED_TTL,
    TOKEN_REVIEWS,
    TOKEN_TTL,
    Attributes,
    Authenticator,
    Authorizer,
    Identity,
    TTLCache,
    access_review_body,
    bearer_token,
    forbidden_message,
    identity_from_peercert,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Reviews:
    """Answers TokenReviews from a token table and SubjectAccessReviews from an allowed-users set."""

    def __init__(self, tokens: dict[str, str], allowed_users: set[str]) -> None:
        self.tokens = tokens
        self.allowed_users = allowed_users
        self.calls: list[tuple[str, dict]] = []
        self.fail = False

    async def __call__(self, path: str, body: dict) -> dict:
        self.calls.append((path, body))
        if self.fail:
            raise ConnectionError("API server unreachable")
        if path == TOKEN_REVIEWS:
            user = self.tokens.get(body["spec"]["token"])
            status = {"authenticated": True, "user": {"username": user, "groups": ["g1"]}} if user else {}
            return {**body, "status": status}
        assert path == ACCESS_REVIEWS
        return {**body, "status": {"allowed": body["spec"]["user"] in self.allowed_users}}

    def count(self, path: str) -> int:
        return sum(1 for p, _ in self.calls if p == path)


ATTRS = Attributes("get", "node-1", "stats")


def test_identity_from_peercert_takes_cn_as_user_and_o_as_groups():
    cert = {"subject": ((("organizationName", "system:masters"),), (("organizationName", "ops"),),
                        (("commonName", "kube-apiserver-kubelet-client"),))}
    assert identity_from_peercert(cert) == Identity(
        "kube-apiserver-kubelet-client", ("system:masters", "ops", "system:authenticated"))
    assert identity_from_peercert(None) is None
    assert identity_from_peercert({}) is None
    assert identity_from_peercert({"subject": ((("organizationName", "x"),),)}) is None


@pytest.mark.parametrize("header, token", [
    ("Bearer abc.def", "abc.def"), ("bearer  abc ", "abc"), ("Basic dXNlcg==", None), ("", None), ("Bearer ", None),
])
def test_bearer_token(header, token):
    assert bearer_token(header) == token


def test_access_review_body_names_the_node_subresource():
    body = access_review_body(Identity("alice", ("dev",), uid="u1", extra=(("scopes", ("a",)),)), ATTRS)
    assert body["kind"] == "SubjectAccessReview"
    assert body["apiVersion"] == "authorization.k8s.io/v1"
    assert body["spec"] == {
        "user": "alice", "groups": ["dev"], "uid": "u1", "extra": {"scopes": ["a"]},
        "resourceAttributes": {"verb": "get", "resource": "nodes", "name": "node-1", "subresource": "stats",
                               "group": "", "version": "v1"},
    }


def test_forbidden_message_is_the_kubelets():
    assert forbidden_message(Identity("bob"), Attributes("create", "n", "proxy")) == \
        "Forbidden (user=bob, verb=create, resource=nodes, subresource=proxy)"


def test_ttl_cache_expires_and_evicts_the_least_recently_used():
    clock = Clock()
    cache: TTLCache[str, int] = TTLCache(2, clock=clock)
    cache.put("a", 1, 10)
    cache.put("b", 2, 10)
    assert cache.get("a") == 1  # a is now the most recently used
    cache.put("c", 3, 10)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    clock.now += 10
    assert cache.get("a", "gone") == "gone"


async def test_certificate_wins_over_token_and_needs_no_review():
    reviews = Reviews({"t": "tokenuser"}, set())
    authn = Authenticator(reviews)
    cert = {"subject": ((("commonName", "apiserver"),),)}
    assert (await authn.authenticate(cert, "Bearer t")).user == "apiserver"
    assert reviews.calls == []


async def test_token_reviews_are_cached_for_two_minutes_both_ways():
    clock = Clock()
    reviews = Reviews({"good": "alice"}, set())
    authn = Authenticator(reviews, clock=clock)
    assert (await authn.authenticate(None, "Bearer good")) == Identity("alice", ("g1",))
    assert await authn.authenticate(None, "Bearer bad") is None
    await authn.authenticate(None, "Bearer good")
    await authn.authenticate(None, "Bearer bad")
    assert reviews.count(TOKEN_REVIEWS) == 2
    clock.now += TOKEN_TTL
    await authn.authenticate(None, "Bearer good")
    assert reviews.count(TOKEN_REVIEWS) == 3


async def test_no_credentials_is_anonymous_only_when_allowed():
    reviews = Reviews({}, set())
    assert await Authenticator(reviews).authenticate(None, "") is None
    assert await Authenticator(reviews, anonymous=True).authenticate(None, "") == ANONYMOUS


async def test_unreachable_token_review_refuses_and_is_not_cached():
    reviews = Reviews({"good": "alice"}, set())
    authn = Authenticator(reviews)
    reviews.fail = True
    assert await authn.authenticate(None, "Bearer good") is None
    reviews.fail = False
    assert (await authn.authenticate(None, "Bearer good")).user == "alice"


async def test_authorization_caches_allowed_5m_and_denied_30s():
    clock = Clock()
    reviews = Reviews({}, {"alice"})
    authz = Authorizer(reviews, clock=clock)
    alice, bob = Identity("alice"), Identity("bob")
    assert (await authz.authorize(alice, ATTRS)).allowed
    assert not (await authz.authorize(bob, ATTRS)).allowed
    assert reviews.count(ACCESS_REVIEWS) == 2
    clock.now += DENIED_TTL - 1
    await authz.authorize(alice, ATTRS)
    await authz.authorize(bob, ATTRS)
    assert reviews.count(ACCESS_REVIEWS) == 2
    clock.now += 1  # the denial expired, the permission did not
    await authz.authorize(alice, ATTRS)
    await authz.authorize(bob, ATTRS)
    assert reviews.count(ACCESS_REVIEWS) == 3
    clock.now += ALLOWED_TTL
    await authz.authorize(alice, ATTRS)
    assert reviews.count(ACCESS_REVIEWS) == 4


async def test_authorization_is_asked_per_subresource_and_verb():
    reviews = Reviews({}, {"alice"})
    authz = Authorizer(reviews)
    for attrs in (ATTRS, Attributes("create", "node-1", "proxy"), Attributes("get", "node-1", "proxy")):
        await authz.authorize(Identity("alice"), attrs)
    assert reviews.count(ACCESS_REVIEWS) == 3


async def test_authorization_failure_raises_and_is_not_cached():
    reviews = Reviews({}, {"alice"})
    authz = Authorizer(reviews)
    reviews.fail = True
    with pytest.raises(ConnectionError):
        await authz.authorize(Identity("alice"), ATTRS)
    reviews.fail = False
    assert (await authz.authorize(Identity("alice"), ATTRS)).allowed
