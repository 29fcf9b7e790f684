"""The node's client certificate: kept under root_dir, obtained with the bootstrap token when there is none
(or it expired), rotated at a random point in 70-90 % of its life; every new one goes to the API client.

Nothing here stops the agent: without a certificate the pods from the cache keep running and the
bootstrap is retried until the API server answers.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgelet.api.kubetime import format_time
from edgelet.bootstrap import ACTION_RECORD
from edgelet.bootstrap.csr import (
    CLIENT_SIGNER,
    CLIENT_USAGES,
    NODES_GROUP,
    SERVING_SIGNER,
    SERVING_USAGES,
    csr_object,
    csr_outcome,
    new_key_and_request,
    node_user,
    rotation_deadline,
)
from edgelet.bootstrap.discovery import UnsignedClusterInfo, bundle_hashes, discover_ca
from edgelet.bootstrap.tokens import BootstrapToken, DiscoveryError
from edgelet.bootstrap.x509 import Certificate, CertificateError, first_certificate, pem_blocks
from edgelet.config import ClusterConfig, load_config
from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import ApiError, Unauthorized
from edgelet.kubeapi.kubeconfig import KubeConfig, KubeconfigError, ssl_context
from edgelet.util.backoff import JitteredBackoff
from edgelet.util.checkpoint import CheckpointStore, key_to_filename
from edgelet.util.errors import ConfigError, EdgeletError, TemporaryError

log = logging.getLogger(__name__)

CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
CLIENT_KEY = "kubelet-client"
SERVING_KEY = "kubelet-server"
CA_KEY = "cluster-ca"
# The kubelet waits this long for approval before it starts over with a new request.
APPROVAL_TIMEOUT = 15 * 60.0
# The longest single sleep before the rotation deadline is looked at again.
_RECHECK = 600.0


class CertificateDenied(EdgeletError):
    """The CSR was denied or failed; a new one is tried later (an operator may fix the approval rules)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    key_pem: bytes
    cert_pem: bytes
    cert: Certificate

    @staticmethod
    def from_pem(pem: bytes) -> Credentials:
        """Key and certificate as stored: one PEM text holding both (the kubelet's kubelet-client-current.pem)."""
        key = pem_blocks(pem, "PRIVATE KEY") or pem_blocks(pem, "EC PRIVATE KEY")
        if not key:
            raise CertificateError("no private key")
        start = pem.find(b"-----BEGIN CERTIFICATE-----")
        return Credentials(key_pem=pem[:start], cert_pem=pem[start:], cert=first_certificate(pem))

    @property
    def pem(self) -> bytes:
        return self.key_pem + self.cert_pem

    def valid(self, now: float) -> bool:
        # Only the end counts, as for the kubelet: a device that booted with its clock behind (no RTC, no NTP
        # yet) must not throw away a good certificate.
        return now < self.cert.not_after


def tls_context(server: str, ca_pem: bytes | None, credentials: Credentials | None, where: str) -> ssl.SSLContext:
    """TLS for the API server: verified against the cluster CA (none known yet: nothing verifies)."""
    if ca_pem is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no trusted CA at all: fails closed
    else:
        config = KubeConfig(path=where, context="", server=server, ca_data=ca_pem,
                            client_cert_data=credentials.cert_pem if credentials else None,
                            client_key_data=credentials.key_pem if credentials else None,
                            user_field="client certificate", cluster_field="cluster CA")
        verified = ssl_context(config)
        if verified is None:  # the config holds the server to https://; nothing here may speak plain HTTP
            raise ConfigError(where, "server", f"{server}: the cluster is reached over https:// only")
        ctx = verified
    return ctx


def read_ca_file(path: str) -> bytes:
    """The cluster CA of a token join ([cluster] ca_file); ConfigError naming the file otherwise."""
    try:
        with open(path, "rb") as f:
            pem = f.read()
        first_certificate(pem)
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read the cluster CA (cluster.ca_file): {exc.strerror or exc}") from None
    except CertificateError as exc:
        raise ConfigError(path, "", f"the cluster CA (cluster.ca_file) is not a PEM certificate: {exc}") from None
    return pem


async def request_certificate(client: ApiClient, csr: dict, *, timeout: float = APPROVAL_TIMEOUT,
                              poll: tuple[float, float] = (0.5, 5.0)) -> bytes:
    """Create `csr` and wait until it is signed; the certificate PEM. Denied/Failed raise CertificateDenied,
    no answer in `timeout` raises TemporaryError (the caller starts over with a new key)."""
    created = await client.create(CSR_PATH, csr)
    name = created["metadata"]["name"]
    log.info("created CertificateSigningRequest %s (signer %s); waiting for approval", name, csr["spec"]["signerName"])
    deadline = time.monotonic() + timeout
    delay, maximum = poll
    while time.monotonic() < deadline:
        outcome, detail = csr_outcome(await client.get(f"{CSR_PATH}/{name}"))
        if outcome == "issued":
            try:
                return base64.b64decode(detail, validate=True)
            except (binascii.Error, ValueError):
                raise CertificateDenied(f"CertificateSigningRequest {name}: status.certificate is not base64") from None
        if outcome != "pending":
            raise CertificateDenied(f"CertificateSigningRequest {name} {outcome}: {detail}")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, maximum)
    raise TemporaryError(f"CertificateSigningRequest {name} was not approved within {timeout:.0f}s")


async def request_serving_certificate(client: ApiClient, node_name: str, *, dns_names: tuple[str, ...],
                                      ip_addresses: tuple[str, ...]) -> Credentials:
    """A serving certificate for the kubelet API from kubernetes.io/kubelet-serving (needs an approver:
    kube-controller-manager approves only client certificates)."""
    request = await asyncio.to_thread(new_key_and_request, node_user(node_name), NODES_GROUP,
                                      dns_names=dns_names, ip_addresses=ip_addresses)
    pem = await request_certificate(client, csr_object("csr-", request.csr_pem, SERVING_SIGNER, SERVING_USAGES))
    return Credentials(request.key_pem, pem, first_certificate(pem))


class RenewedCertificate:
    """A key and certificate kept under root_dir/pki (one checkpoint, 0600, crash-safe) and replaced at a random
    point in 70-90 % of its life; subclasses say how a new one is obtained."""

    what = "certificate"

    def __init__(self, store: CheckpointStore, key: str, *, clock: Callable[[], float], rng: random.Random | None):
        self._store = store
        self._key = key
        self._clock = clock
        self._rng = rng or random.Random()
        self.current = self._stored_credentials()
        self._deadline = self._next_deadline()
        self.last_error: BaseException | None = None
        self._last_logged = ""

    def _stored_credentials(self) -> Credentials | None:
        pem = self._store.read(self._key)
        if pem is None:
            return None
        try:
            credentials = Credentials.from_pem(pem)
        except CertificateError as exc:
            log.warning("the stored %s is unusable (%s); requesting a new one", self.what, exc)
            return None
        if not credentials.valid(self._clock()):
            log.warning("the stored %s (serial %x) expired; %s", self.what, credentials.cert.serial,
                        self._expired_means)
        return credentials

    _expired_means = "requesting a new one"

    def _next_deadline(self) -> float:
        if self.current is None:
            return 0.0
        return rotation_deadline(self.current.cert.not_before, self.current.cert.not_after, self._rng)

    def valid(self) -> bool:
        return self.current is not None and self.current.valid(self._clock())

    def _renewal_due_now(self) -> bool:
        return not self.valid()

    async def run(self, on_new: Callable[[], None]) -> None:
        """Obtains a certificate when there is none, then renews it forever; `on_new` is called after each."""
        # Not a Retrier: each distinct problem here (discovery, a denied request, a refused token) needs an operator
        # and gets its own line (see _report), where the API loops log a streak once.
        backoff = JitteredBackoff(1.0, 60.0, rng=self._rng)
        announced = None
        while True:
            if not self._renewal_due_now():
                wait = self._deadline - self._clock()
                if wait > 0:
                    if announced != self._deadline and self.current is not None:  # valid: it is there
                        announced = self._deadline
                        log.info("%s serial %x valid until %s; rotating in %.0fs", self.what,
                                 self.current.cert.serial, format_time(self.current.cert.not_after), wait)
                    # In steps, so a wall clock set late (NTP after boot) moves the rotation with it.
                    await asyncio.sleep(min(wait, _RECHECK))
                    continue
            try:
                credentials = await self._obtain()
                await asyncio.to_thread(self._store.write, self._key, credentials.pem)
            except (ApiError, DiscoveryError, CertificateDenied, CertificateError, TemporaryError, KubeconfigError,
                    OSError) as exc:
                self._report(exc)
                await asyncio.sleep(backoff.next())
                continue
            log.info("got %s serial %x, valid until %s", self.what, credentials.cert.serial,
                     format_time(credentials.cert.not_after))
            self.current, self.last_error, self._last_logged = credentials, None, ""
            self._deadline = self._next_deadline()
            self._renewed()
            backoff.reset()
            on_new()

    def _renewed(self) -> None:
        """Hook: a new certificate is in place."""

    def _report(self, exc: BaseException) -> None:
        self.last_error = exc
        message = f"cannot get a {self.what} from {self._server_name()}: {exc}"
        # One clear line per distinct problem; the retries every minute would only repeat it.
        (log.error if message != self._last_logged else log.debug)("%s", message)
        self._last_logged = message

    async def _obtain(self) -> Credentials:
        raise NotImplementedError

    def _server_name(self) -> str:
        raise NotImplementedError


class ClientCertificateManager(RenewedCertificate):
    """Owns root_dir/pki: the cluster CA (from ca_file or discovered) and the node's client certificate."""

    what = "client certificate"
    _expired_means = "bootstrapping again with the token"

    def __init__(self, cluster: ClusterConfig, node_name: str, pki_dir: str, *, config_path: str = "",
                 state_dir: str = "", clock: Callable[[], float] = time.time, rng: random.Random | None = None):
        """Raises ConfigError for an unreadable ca_file. `config_path` is read again for a new bootstrap token
        while the API server refuses ours; `state_dir` keeps what an operator must do (`edgelet describe node`)."""
        self.server = cluster.server
        self.node_name = node_name
        self._token = BootstrapToken.parse(cluster.bootstrap_token)
        self._config_path = config_path
        self._action_record = os.path.join(state_dir, ACTION_RECORD) if state_dir else ""
        self._pinned_hash = cluster.ca_cert_hash or None
        ca_from_file = read_ca_file(cluster.ca_file) if cluster.ca_file else None
        store = CheckpointStore(pki_dir, kind="pki")
        self._where = os.path.join(pki_dir, CLIENT_KEY)
        self._cert_refused = False
        super().__init__(store, CLIENT_KEY, clock=clock, rng=rng)
        self.ca_pem = ca_from_file or self._stored_ca()

    # -- what is on disk ----------------------------------------------------------------------------

    def _stored_ca(self) -> bytes | None:
        """A CA discovered before, if it still has the pinned hash (the pin may have changed in the config)."""
        pem = self._store.read(CA_KEY)
        if pem is None:
            return None
        try:
            if self._pinned_hash in bundle_hashes(pem):
                return pem
        except CertificateError:
            pass
        log.warning("the stored cluster CA does not match ca_cert_hash; discovering it again")
        return None

    # -- what the cluster connection asks ----------------------------------------------------------

    def valid(self) -> bool:
        """A stored certificate counts only beside the cluster CA: while the CA is to be discovered (none stored,
        or the config's ca_cert_hash no longer matches it, say a node pointed at another cluster), the node
        has no credentials to talk with, and the discovery drops the certificate (see _obtain)."""
        return self.ca_pem is not None and super().valid()

    def tls_context(self) -> ssl.SSLContext:
        return tls_context(self.server, self.ca_pem, self.current if self.valid() else None, self._where)

    def problem(self) -> str | None:
        """Why there is no usable certificate, when the reason is not just an unreachable server."""
        error = self.last_error
        if (action := self.operator_action()) is not None:
            return action
        if isinstance(error, (DiscoveryError, CertificateDenied, Unauthorized, KubeconfigError)):
            return str(error)
        return None

    def operator_action(self) -> str | None:
        """The one line an operator needs when the node cannot join by itself: no valid certificate (it expired
        while the device was offline, say) and the API server refuses the bootstrap token (expired or deleted:
        kubeadm's live 24 h)."""
        if self.valid() or not isinstance(self.last_error, (Unauthorized, UnsignedClusterInfo)):
            return None
        if self.current is not None:
            lost = f"the client certificate expired at {format_time(self.current.cert.not_after)}"
        else:
            lost = "the node has no client certificate"
        where = f" in {self._config_path}" if self._config_path else ""
        return (f"{lost} and the API server refuses bootstrap token {self._token.id} (expired or deleted): write a "
                f"new token (kubeadm token create) to [cluster] bootstrap_token{where}; edgelet joins with it at "
                "its next attempt, no restart needed, and keeps running its pods meanwhile")

    def _reread_token(self) -> None:
        """A new [cluster] bootstrap_token written to the config file is used from this attempt on."""
        if not self._config_path:
            return
        try:
            cluster = load_config(self._config_path).cluster
        except ConfigError as exc:  # a half-written file: the next attempt reads it again
            log.debug("not reading a new bootstrap token: %s", exc)
            return
        text = cluster.bootstrap_token if cluster is not None else ""
        if text and text != str(self._token):
            self._token = BootstrapToken.parse(text)
            log.info("a new bootstrap token (id %s) in %s: joining with it", self._token.id, self._config_path)

    def _record_action(self, action: str | None) -> None:
        """What `edgelet describe node` shows: the operator's line while it holds, nothing once joined."""
        if not self._action_record:
            return
        try:
            if action is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._action_record)
            else:
                os.makedirs(os.path.dirname(self._action_record), exist_ok=True)
                temporary = f"{self._action_record}.tmp"
                with open(temporary, "w", encoding="utf-8") as file:
                    file.write(action + "\n")
                os.replace(temporary, self._action_record)
        except OSError as exc:
            log.debug("cannot record the bootstrap state: %s", exc)

    def _renewal_due_now(self) -> bool:
        return not self.valid() or self._cert_refused

    def _server_name(self) -> str:
        return self.server

    def _renewed(self) -> None:
        self._cert_refused = False
        self._record_action(None)

    def _report(self, exc: BaseException) -> None:
        if isinstance(exc, Unauthorized) and self.valid():
            self._cert_refused = True  # e.g. revoked or the CA changed: start over with the token
        self.last_error = exc
        action = self.operator_action()
        if action is None:
            super()._report(exc)
            return
        if action != self._last_logged:  # once, as every distinct problem
            log.error("%s", action)
            self._record_action(action)
        self._last_logged = action

    async def _obtain(self) -> Credentials:
        self._reread_token()
        if self.ca_pem is None:
            if self._pinned_hash is None:  # the config asks a token join for a CA file or its hash
                raise DiscoveryError("a bootstrap token join needs [cluster] ca_file or ca_cert_hash to trust the "
                                     "cluster it discovers")
            self.ca_pem = await discover_ca(self.server, self._token, self._pinned_hash)
            await asyncio.to_thread(self._store.write, CA_KEY, self.ca_pem)
            log.info("discovered the cluster CA (public key %s) from kube-public/cluster-info", self._pinned_hash)
            if self.current is not None:
                # Issued under a CA this node no longer knows (the pin changed: a rebuilt or another cluster). Its
                # server would refuse it in the TLS handshake, which looks like any broken connection: use the token.
                log.warning("the stored client certificate (serial %x) predates the discovered cluster CA; joining "
                            "again with the bootstrap token", self.current.cert.serial)
                self.current = None
        if self.valid() and not self._cert_refused:
            # Rotation: the node's own certificate asks (the approver's selfnodeclient rule).
            client = ApiClient(self.server, tls=self.tls_context())
        else:
            client = ApiClient(self.server, token=str(self._token),
                               tls=tls_context(self.server, self.ca_pem, None, self._where))
        request = await asyncio.to_thread(new_key_and_request, node_user(self.node_name), NODES_GROUP)
        async with client:
            pem = await request_certificate(client, csr_object("csr-", request.csr_pem, CLIENT_SIGNER, CLIENT_USAGES))
        credentials = Credentials(request.key_pem, pem, first_certificate(pem))
        tls_context(self.server, self.ca_pem, credentials, self._where)  # the key and certificate belong together
        return credentials


class ServingCertificateManager(RenewedCertificate):
    """The kubelet API's serving certificate from kubernetes.io/kubelet-serving ([kubelet_api] serving_cert =
    "csr"), beside the client certificate and renewed the same way. It needs an approver (kube-controller-manager
    approves only client certificates): until one approves, the self-signed certificate keeps serving."""

    what = "serving certificate"

    def __init__(self, pki_dir: str, node_name: str, addresses: tuple[str, ...], client: ApiClient, *,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None):
        self.node_name = node_name
        self._addresses = addresses
        self._client = client
        self.path = os.path.join(pki_dir, key_to_filename(SERVING_KEY))  # OpenSSL reads past the header line
        super().__init__(CheckpointStore(pki_dir, kind="pki"), SERVING_KEY, clock=clock, rng=rng)

    def _server_name(self) -> str:
        return self._client.server

    async def _obtain(self) -> Credentials:
        return await request_serving_certificate(self._client, self.node_name, dns_names=(self.node_name,),
                                                 ip_addresses=self._addresses)
