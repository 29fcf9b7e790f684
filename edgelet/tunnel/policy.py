"""The tunnel's decisions, pure: what the node announces to konnectivity-server, which dials it splices (and
where to), how many streams it keeps, and what a failed stream means."""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

# Metadata keys konnectivity-server reads on the Connect stream (sent) and answers with (received). gRPC
# metadata keys are case-insensitive; Python's grpc wants them lower-case.
AGENT_ID = "agentid"
AGENT_IDENTIFIERS = "agentidentifiers"
SERVER_ID = "serverid"
SERVER_COUNT = "servercount"


def agent_identifiers(node_name: str, addresses: Iterable[str]) -> str:
    """The agentIdentifiers value: `host=<node>` plus `ipv4=`/`ipv6=` per address, url-encoded with sorted keys
    as konnectivity-agent's url.Values.Encode() writes them, so `--proxy-strategies=destHost` finds the node
    whether the API server dials its name or one of its IPs."""
    pairs: list[tuple[str, str]] = [("host", node_name)]
    seen = {node_name}
    for address in addresses:
        if not address or address in seen:
            continue
        seen.add(address)
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            pairs.append(("host", address))
            continue
        pairs.append(("ipv4" if ip.version == 4 else "ipv6", str(ip)))
    pairs.sort(key=lambda pair: pair[0])  # Go sorts by key, keeping each key's values in order
    return urllib.parse.urlencode(pairs)


def split_host_port(address: str) -> tuple[str, int] | None:
    """("host", port) of "host:port" or "[v6]:port"; None when it is not one."""
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    if host.startswith("["):
        if not host.endswith("]"):
            return None
        host = host[1:-1]
    return host.lower(), int(port)


def _normal(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower().rstrip(".")


@dataclass(frozen=True, slots=True)
class Destinations:
    """Which dials are spliced: the node's own kubelet API under any name the API server may use for it (the
    node name, its addresses) on the kubelet port, spliced to where it listens; plus exactly the destinations
    the config allows. Everything else is refused."""

    kubelet_names: frozenset[str]
    kubelet_port: int
    kubelet_target: tuple[str, int]
    allowed: frozenset[tuple[str, int]] = frozenset()

    @staticmethod
    def build(node_name: str, addresses: Iterable[str], kubelet_listen: str,
              allowed: Iterable[str] = ()) -> Destinations:
        """`kubelet_listen` is `[kubelet_api] address`; a wildcard host is reached on loopback."""
        listen = split_host_port(kubelet_listen)
        if listen is None:
            raise ValueError(f"kubelet API address {kubelet_listen!r} is not host:port")
        host, port = listen
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1" if host != "::" else "::1"
        names = {_normal(node_name)} | {_normal(a) for a in addresses if a}
        extra = set()
        for item in allowed:
            parsed = split_host_port(item)
            if parsed is None:
                raise ValueError(f"allowed destination {item!r} is not host:port")
            extra.add((_normal(parsed[0]), parsed[1]))
        return Destinations(frozenset(names), port, (host, port), frozenset(extra))

    def target(self, address: str) -> tuple[str, int] | None:
        """Where a DIAL_REQ for `address` is spliced to; None: refused."""
        parsed = split_host_port(address)
        if parsed is None:
            return None
        host, port = _normal(parsed[0]), parsed[1]
        if port == self.kubelet_port and host in self.kubelet_names:
            return self.kubelet_target
        if (host, port) in self.allowed:
            return host, port
        return None


def stream_slots(configured: int, announced: int) -> int:
    """How many streams to keep: one per configured address, and as many as the servers announce (serverCount)
    when that is more, as konnectivity-agent keeps dialling a load-balanced address until it holds a stream to
    every server instance. Bounded so a bad announcement cannot make the node open hundreds of streams."""
    return max(configured, min(max(announced, 0), configured * 8, 64))


def describe_stream_error(details: str) -> str:
    """What a failed Connect means, in the words an operator acts on."""
    text = details or ""
    lowered = text.lower()
    # TLS 1.3 ends the client's handshake before the server has checked the client's certificate: its refusal
    # arrives as an alert on the first read (the splice's "TLS: [SSL: ...]", in OpenSSL's words).
    if "bad_certificate" in lowered or "certificate_unknown" in lowered or "unknown_ca" in lowered \
            or "certificate required" in lowered or "certificate_required" in lowered:
        return (f"konnectivity-server refused the node's client certificate (is it signed by the CA of its "
                f"--cluster-ca-cert?): {text}")
    if "certificate verify failed" in lowered or "certificate_verify_failed" in lowered:
        return f"konnectivity-server's serving certificate is not trusted ([cluster.tunnel] ca_file): {text}"
    return text
