"""TLS for the kubelet API: the serving certificate (a self-signed one made once when none is configured, as
the kubelet does, by `edgelet keygen` in a child) and the server context that asks callers for a client certificate.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import time
from collections.abc import Iterable

from edgelet.bootstrap.keygen import KeygenError, in_child
from edgelet.util.checkpoint import replace_file
from edgelet.util.errors import PermanentError

SELF_SIGNED_DAYS = 365


class TLSSetupError(PermanentError):
    """The kubelet API cannot serve TLS; the message names the setting or file at fault."""


def subject_alt_names(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) of a serving certificate: each name once, in order, addresses apart."""
    dns: list[str] = []
    ips: list[str] = []
    for name in names:
        if not name:
            continue
        try:
            kind, value = ips, str(ipaddress.ip_address(name))
        except ValueError:
            kind, value = dns, name
        if value not in kind:
            kind.append(value)
    return dns, ips


def ensure_self_signed(directory: str, node_name: str, addresses: Iterable[str]) -> tuple[str, str]:
    """(cert, key) under `directory`, made on the first call and kept: `kubelet.crt` and a 0600 `kubelet.key`."""
    cert_path = os.path.join(directory, "kubelet.crt")
    key_path = os.path.join(directory, "kubelet.key")
    if os.path.exists(cert_path) and os.path.exists(key_path):
        return cert_path, key_path
    os.makedirs(directory, mode=0o700, exist_ok=True)
    dns_names, ip_addresses = subject_alt_names([node_name, "localhost", *addresses])
    now = time.time()
    try:
        made = in_child({"kind": "self-signed", "common_name": f"{node_name}@{int(now)}", "dns_names": dns_names,
                         "ip_addresses": ip_addresses, "not_before": now, "days": SELF_SIGNED_DAYS})
    except KeygenError as exc:
        raise TLSSetupError(f"kubelet_api: cannot make a self-signed serving certificate: {exc}") from None
    key_pem, cert_pem = made["key"].encode("ascii"), made["certificate"].encode("ascii")
    # The key first: a certificate alone on disk would be taken as a complete pair next start. A temp file left
    # by a crash is overwritten.
    replace_file(key_path, key_pem, temp=key_path + ".new", mode=0o600, exclusive=False)
    replace_file(cert_path, cert_pem, temp=cert_path + ".new", mode=0o644, exclusive=False)
    return cert_path, key_path


def server_context(cert_file: str, key_file: str, *, client_ca_file: str = "",
                   client_ca_data: bytes | None = None) -> ssl.SSLContext:
    """TLS 1.2+ serving `cert_file`; a client certificate is asked for (not required) and verified
    against the client CA when one is given. A certificate from another CA fails the handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as err:
        raise TLSSetupError(f"kubelet_api.tls_cert_file / tls_private_key_file ({cert_file}, {key_file}): "
                            f"cannot load the serving certificate and key: {err}") from None
    if client_ca_file or client_ca_data:
        try:
            if client_ca_file:
                context.load_verify_locations(cafile=client_ca_file)
            else:
                context.load_verify_locations(cadata=(client_ca_data or b"").decode("ascii"))
        except (OSError, ssl.SSLError, UnicodeDecodeError, ValueError) as err:
            where = f"kubelet_api.client_ca_file ({client_ca_file})" if client_ca_file else \
                "kubelet_api.client_ca_file (default: the kubeconfig's certificate-authority)"
            raise TLSSetupError(f"{where}: not a usable CA certificate: {err}") from None
        context.verify_mode = ssl.CERT_OPTIONAL
    return context
