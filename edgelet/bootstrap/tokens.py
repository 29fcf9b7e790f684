"""Bootstrap tokens, kubeadm's CA public-key pins, and the JWS that signs the kube-public cluster-info.

All pure: kubeadm's formats (`abcdef.0123456789abcdef`, `sha256:<hex>`) and the bootstrapsigner's detached
HS256 JWS (`<header>..<signature>`, key = the token secret, `kid` = the token id).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass

_TOKEN = re.compile(r"([a-z0-9]{6})\.([a-z0-9]{16})")
_CA_HASH = re.compile(r"sha256:([0-9a-f]{64})")


class DiscoveryError(Exception):
    """The cluster-info the server sent cannot be trusted (signature, pin or shape)."""


@dataclass(frozen=True, slots=True)
class BootstrapToken:
    id: str
    secret: str

    @staticmethod
    def parse(text: str) -> BootstrapToken:
        match = _TOKEN.fullmatch(text)
        if not match:
            raise ValueError('must be a bootstrap token "<6 chars>.<16 chars>" of a-z and 0-9, '
                             'like "abcdef.0123456789abcdef"')
        return BootstrapToken(match.group(1), match.group(2))

    def __str__(self) -> str:
        return f"{self.id}.{self.secret}"

    def __repr__(self) -> str:
        return f"BootstrapToken(id={self.id!r}, secret=<redacted>)"


def token_error(text: str) -> str | None:
    try:
        BootstrapToken.parse(text)
    except ValueError as exc:
        return str(exc)
    return None


def ca_hash_error(text: str) -> str | None:
    if _CA_HASH.fullmatch(text):
        return None
    return 'must be kubeadm\'s "sha256:<64 lower-case hex digits>" (the SHA-256 of the CA\'s public key)'


def spki_hash(spki_der: bytes) -> str:
    """kubeadm's --discovery-token-ca-cert-hash of a CA: sha256 of its DER SubjectPublicKeyInfo."""
    return "sha256:" + hashlib.sha256(spki_der).hexdigest()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_detached(jws: str, payload: bytes, token: BootstrapToken) -> None:
    """Raise DiscoveryError unless `jws` is the token's HS256 signature of `payload`."""
    parts = jws.strip().split(".")
    if len(parts) != 3 or parts[1]:
        raise DiscoveryError("the cluster-info signature is not a detached JWS")
    try:
        header = json.loads(_unb64url(parts[0]))
        signature = _unb64url(parts[2])
    except (ValueError, binascii.Error):
        raise DiscoveryError("the cluster-info signature is not valid base64url JSON") from None
    # Only HS256 with this token: an "alg" chosen by the sender is the classic JWS forgery.
    if not isinstance(header, dict) or header.get("alg") != "HS256" or header.get("kid") != token.id:
        raise DiscoveryError(f"the cluster-info signature is not an HS256 JWS for token id {token.id}")
    expected = hmac.new(token.secret.encode(), f"{parts[0]}.{_b64url(payload)}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(expected, signature):
        raise DiscoveryError(f"the cluster-info signature does not match bootstrap token {token.id}")
