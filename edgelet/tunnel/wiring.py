"""The tunnel built from the agent's config and its client certificates: what it announces, what it may dial, the
node's own client certificate for each new stream, and the state record `edgelet describe node` reads."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

import orjson

from edgelet.config import ClusterConfig, Config, TunnelConfig
from edgelet.tunnel.agent import TlsMaterial, Tunnel
from edgelet.tunnel.policy import Destinations, agent_identifiers
from edgelet.util.checkpoint import replace_file
from edgelet.util.errors import ConfigError

if TYPE_CHECKING:
    from edgelet.bootstrap.manager import ClientCertificateManager

log = logging.getLogger(__name__)

STATE_NAME = "tunnel.json"
# Connections come and go by the dozen during a `kubectl cp`; the record is rewritten at most this often.
STATE_DEBOUNCE = 1.0


def read_pem_file(path: str, what: str) -> bytes:
    """A PEM file the tunnel needs; ConfigError naming the file and the setting otherwise."""
    try:
        with open(path, "rb") as file:
            pem = file.read()
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read {what}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in pem:
        raise ConfigError(path, "", f"{what} is not PEM text")
    return pem


def _tunnel_settings(config: Config) -> tuple[ClusterConfig, TunnelConfig]:
    """[cluster] and [cluster.tunnel] of a node that has them (the only config the tunnel is built for)."""
    if config.cluster is None or config.cluster.tunnel is None:
        raise RuntimeError("the konnectivity tunnel is built only for a node with [cluster.tunnel]")
    return config.cluster, config.cluster.tunnel


def tunnel_credentials(config: Config, certificates: ClientCertificateManager | None) -> TlsMaterial:
    """CA, key and certificate for the next stream: a token join's `certificates`, or (None) the files the
    kubeconfig names. Read at every connection, so a rotated certificate serves the next stream while the open
    ones carry on."""
    cluster, settings = _tunnel_settings(config)
    tunnel_ca = settings.ca_file
    if certificates is not None:
        ca = read_pem_file(tunnel_ca, "the konnectivity-server CA (cluster.tunnel.ca_file)") if tunnel_ca else \
            certificates.ca_pem
        if ca is None:
            raise RuntimeError("the cluster CA is not known yet")
        current = certificates.current
        if current is None or not certificates.valid():
            raise RuntimeError("the node has no valid client certificate yet")
        return ca, current.key_pem, current.cert_pem
    from edgelet.kubeapi.kubeconfig import load_kubeconfig

    kubeconfig = load_kubeconfig(cluster.kubeconfig)
    if tunnel_ca:
        ca = read_pem_file(tunnel_ca, "the konnectivity-server CA (cluster.tunnel.ca_file)")
    elif kubeconfig.ca_data is not None:
        ca = kubeconfig.ca_data
    elif kubeconfig.ca_file:
        ca = read_pem_file(kubeconfig.ca_file, "the kubeconfig's certificate-authority")
    else:
        raise ConfigError(cluster.kubeconfig, "certificate-authority",
                          "names no CA for konnectivity-server: set [cluster.tunnel] ca_file")
    key = kubeconfig.client_key_data or (kubeconfig.client_key_file and read_pem_file(
        kubeconfig.client_key_file, "the kubeconfig's client-key"))
    cert = kubeconfig.client_cert_data or (kubeconfig.client_cert_file and read_pem_file(
        kubeconfig.client_cert_file, "the kubeconfig's client-certificate"))
    if not key or not cert:
        raise ConfigError(cluster.kubeconfig, "users.user.client-certificate",
                          "konnectivity-server authenticates the node by its client certificate; the kubeconfig "
                          "user has none")
    return ca, key, cert


class StateRecord:
    """Writes the tunnel's snapshot under root_dir/state (atomic replace, debounced, not fsynced) for
    `edgelet describe node`."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, STATE_NAME)
        self._directory = directory
        self._timer: asyncio.TimerHandle | None = None
        self.tunnel: Tunnel | None = None

    def changed(self) -> None:
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(STATE_DEBOUNCE, self.write)
            except RuntimeError:  # no loop (tests building the tunnel): nothing to write yet
                pass

    def write(self) -> None:
        self._timer = None
        if self.tunnel is None:
            return
        try:
            os.makedirs(self._directory, mode=0o700, exist_ok=True)
            # Not durable: the snapshot is for display and rewritten at every start, and an fsync on a
            # slow SD card would hold the event loop each time the tunnel changes state.
            replace_file(self.path, orjson.dumps(self.tunnel.snapshot()), temp=self.path + ".new", mode=0o600,
                         exclusive=False, durable=False)
        except OSError as exc:
            log.warning("tunnel: cannot write %s: %s", self.path, exc)


def read_state(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, STATE_NAME), "rb") as file:
            state = orjson.loads(file.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    return state if isinstance(state, dict) else None


def build_tunnel(config: Config, *, node_ip: str, certificates: ClientCertificateManager | None) -> Tunnel:
    """Raises ConfigError for an unreadable [cluster.tunnel] ca_file (at start, not at the first dial)."""
    cluster, settings = _tunnel_settings(config)
    if settings.ca_file:
        read_pem_file(settings.ca_file, "the konnectivity-server CA (cluster.tunnel.ca_file)")
    addresses = [node_ip] if node_ip and not node_ip.startswith("127.") else []
    destinations = Destinations.build(config.node_name, addresses, config.kubelet_api.address,
                                      settings.allowed_destinations)
    record = StateRecord(config.state_dir)
    tunnel = Tunnel(settings, node_name=config.node_name, identifiers=agent_identifiers(config.node_name, addresses),
                    destinations=destinations, credentials=lambda: tunnel_credentials(config, certificates),
                    on_change=record.changed)
    record.tunnel = tunnel
    return tunnel
