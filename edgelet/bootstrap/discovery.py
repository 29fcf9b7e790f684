"""Finding the cluster CA as `kubeadm join --discovery-token-ca-cert-hash` does.

The kube-public/cluster-info ConfigMap is read anonymously over TLS that is not yet verified; it is trusted
only if the bootstrapsigner's JWS for our token matches it and its CA's public key has the pinned hash.
Then it is read again over TLS verified with that CA, and must not have changed.
"""

from __future__ import annotations

import base64
import binascii
import ssl
from typing import Any

from edgelet import yamlload
from edgelet.bootstrap.tokens import BootstrapToken, DiscoveryError, spki_hash, verify_detached
from edgelet.bootstrap.x509 import CertificateError, parse_certificate, pem_blocks
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import NotFound
from edgelet.util.errors import YAMLError

CLUSTER_INFO = "/api/v1/namespaces/kube-public/configmaps/cluster-info"


class UnsignedClusterInfo(DiscoveryError):
    """No JWS for our token (yet): the bootstrapsigner may not have signed, or the token is unknown."""


def trusted_ca(configmap: dict[str, Any], token: BootstrapToken, pinned_hash: str) -> bytes:
    """The CA bundle (PEM) of a cluster-info ConfigMap, or DiscoveryError saying why it is not trusted."""
    data = configmap.get("data") or {}
    kubeconfig = data.get("kubeconfig")
    if not isinstance(kubeconfig, str) or not kubeconfig:
        raise DiscoveryError("kube-public/cluster-info has no kubeconfig")
    signature = data.get(f"jws-kubeconfig-{token.id}")
    if not isinstance(signature, str):
        raise UnsignedClusterInfo(f"kube-public/cluster-info has no signature for bootstrap token id {token.id} "
                                  "(unknown or expired token, or no usage-bootstrap-signing)")
    verify_detached(signature, kubeconfig.encode(), token)
    ca_pem = _ca_data(kubeconfig)
    try:
        hashes = bundle_hashes(ca_pem)
    except CertificateError as exc:
        raise DiscoveryError(f"the CA in kube-public/cluster-info is not a certificate: {exc}") from None
    if pinned_hash not in hashes:
        raise DiscoveryError(f"the cluster CA's public key hash is {', '.join(hashes)}, not the pinned "
                             f"ca_cert_hash {pinned_hash}: refusing to trust this server")
    return ca_pem


def bundle_hashes(ca_pem: bytes) -> list[str]:
    """The public key hash of each certificate of a CA bundle, in order; CertificateError when it holds none.

    A pin may name any of them, as kubeadm's: a bundle carries the old CA beside the new during a rotation.
    """
    blocks = pem_blocks(ca_pem, "CERTIFICATE")
    if not blocks:
        raise CertificateError("no CERTIFICATE block")
    return [spki_hash(parse_certificate(der).spki_der) for der in blocks]


def _ca_data(kubeconfig: str) -> bytes:
    try:
        doc = yamlload.load(kubeconfig)
        clusters = doc["clusters"]
        encoded = clusters[0]["cluster"]["certificate-authority-data"]
        return base64.b64decode("".join(encoded.split()), validate=True)
    except (YAMLError, KeyError, IndexError, TypeError, AttributeError, binascii.Error, ValueError):
        raise DiscoveryError("the kubeconfig in kube-public/cluster-info has no "
                             "clusters[0].cluster.certificate-authority-data") from None


def unverified_context() -> ssl.SSLContext:
    """TLS for the first, unverified read: no certificate checked, and no CA store loaded only to be ignored
    (create_default_context() would parse the system's, about 1 MiB of heap)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def discover_ca(server: str, token: BootstrapToken, pinned_hash: str) -> bytes:
    """The pinned cluster CA (PEM), read from the server. Raises DiscoveryError or ApiError."""
    # Anonymous on purpose: the token must not reach a server that has not proven itself yet.
    async with ApiClient(server, tls=unverified_context()) as client:
        first = await _cluster_info(client)
    ca_pem = trusted_ca(first, token, pinned_hash)
    async with ApiClient(server, tls=ssl.create_default_context(cadata=ca_pem.decode("ascii"))) as client:
        second = await _cluster_info(client)
    if (second.get("data") or {}).get("kubeconfig") != first["data"]["kubeconfig"]:
        raise DiscoveryError("kube-public/cluster-info changed between the unverified and the verified read")
    return ca_pem


async def _cluster_info(client: ApiClient) -> dict[str, Any]:
    try:
        return await client.get(CLUSTER_INFO)
    except NotFound:
        raise DiscoveryError("the server has no kube-public/cluster-info ConfigMap to discover the CA from") from None
