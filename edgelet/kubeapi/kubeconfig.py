"""Kubeconfig loading: current-context -> cluster + user, and the TLS context they describe.

Parsing is pure (`parse_kubeconfig`); file reads and TLS setup live in `load_kubeconfig` and
`ssl_context`. Secrets (tokens, private keys) never appear in reprs, logs or error messages.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from edgelet import yamlload
from edgelet.util.errors import ConfigError, YAMLError


class KubeconfigError(ConfigError):
    """A kubeconfig problem naming the file and the field, e.g. `users[name=edge].user.token`."""


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """What one kubeconfig context says about how to reach and authenticate to the API server."""

    path: str
    context: str
    server: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure_skip_tls_verify: bool = False
    token: str | None = None
    token_file: str | None = None
    client_cert_file: str | None = None
    client_cert_data: bytes | None = None
    client_key_file: str | None = None
    client_key_data: bytes | None = None
    # Field names (as in the file) of the user's credentials, for error messages.
    user_field: str = "users"
    cluster_field: str = "clusters"

    def __repr__(self) -> str:
        auth = []
        if self.token is not None:
            auth.append("token=<redacted>")
        if self.token_file:
            auth.append(f"token_file={self.token_file!r}")
        if self.client_cert_file or self.client_cert_data:
            auth.append("client_cert=" + (repr(self.client_cert_file) if self.client_cert_file else "<inline>"))
        if self.client_key_file or self.client_key_data:
            auth.append("client_key=" + (repr(self.client_key_file) if self.client_key_file else "<redacted>"))
        tls = "insecure" if self.insecure_skip_tls_verify else ("custom-ca" if self.ca_file or self.ca_data
                                                                else "system-ca")
        return (f"KubeConfig(path={self.path!r}, context={self.context!r}, server={self.server!r}, tls={tls}, "
                f"{', '.join(auth) or 'anonymous'})")

    __str__ = __repr__


def load_kubeconfig(path: str | os.PathLike[str], *, context: str | None = None) -> KubeConfig:
    """Read and parse a kubeconfig file; a tokenFile is read here so a missing one fails at start."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise KubeconfigError(path, "", f"cannot read the kubeconfig: {e.strerror or e}") from None
    try:
        doc = yamlload.load(yamlload.decode(text))
    except YAMLError as e:
        where = f" at line {e.line + 1}" if e.line is not None else ""
        raise KubeconfigError(path, "", f"not valid YAML{where}") from None
    config = parse_kubeconfig(doc, path, context=context)
    if config.token is None and config.token_file:
        token = read_token_file(config.token_file, path, f"{config.user_field}.tokenFile")
        config = replace(config, token=token)
    return config


def read_token_file(token_file: str, kubeconfig_path: str, field: str) -> str:
    try:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise KubeconfigError(kubeconfig_path, field,
                              f"cannot read token file {token_file!r}: {getattr(e, 'strerror', None) or e}") from None
    if not token:
        raise KubeconfigError(kubeconfig_path, field, f"token file {token_file!r} is empty")
    return token


def parse_kubeconfig(doc: Any, path: str, *, context: str | None = None) -> KubeConfig:
    """Resolve the (current or given) context of a parsed kubeconfig document; relative paths are
    taken relative to the kubeconfig's directory, as kubectl does."""
    if not isinstance(doc, Mapping):
        raise KubeconfigError(path, "", "not a kubeconfig (expected a YAML mapping)")
    base_dir = os.path.dirname(os.path.abspath(path))

    context_name = context or doc.get("current-context")
    if not context_name or not isinstance(context_name, str):
        raise KubeconfigError(path, "current-context", "is not set and no context was given")
    ctx_field = f"contexts[name={context_name}]"
    ctx = _named_entry(doc, "contexts", context_name, "context", path)
    cluster_name = ctx.get("cluster")
    if not cluster_name or not isinstance(cluster_name, str):
        raise KubeconfigError(path, f"{ctx_field}.context.cluster", "is missing")
    user_name = ctx.get("user")

    cluster_field = f"clusters[name={cluster_name}].cluster"
    cluster = _named_entry(doc, "clusters", cluster_name, "cluster", path)
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeconfigError(path, f"{cluster_field}.server", "must be an http:// or https:// URL")
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        raise KubeconfigError(path, f"{cluster_field}.insecure-skip-tls-verify", "must be true or false")
    ca_file = _path_field(cluster, "certificate-authority", base_dir, path, cluster_field)
    ca_data = _data_field(cluster, "certificate-authority-data", path, cluster_field)

    user: Mapping[str, Any] = {}
    user_field = "users"
    if user_name:
        if not isinstance(user_name, str):
            raise KubeconfigError(path, f"{ctx_field}.context.user", "must be a string")
        user_field = f"users[name={user_name}].user"
        user = _named_entry(doc, "users", user_name, "user", path)
    for unsupported in ("exec", "auth-provider", "username", "password"):
        if user.get(unsupported):
            raise KubeconfigError(path, f"{user_field}.{unsupported}",
                                  "is not supported; use a token or a client certificate")

    token = user.get("token")
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise KubeconfigError(path, f"{user_field}.token", "must be a non-empty string")
    # An inline token wins over tokenFile, as in kubectl; the file is then never read.
    token_file = None if token else _path_field(user, "tokenFile", base_dir, path, user_field)
    cert_file = _path_field(user, "client-certificate", base_dir, path, user_field)
    cert_data = _data_field(user, "client-certificate-data", path, user_field)
    key_file = _path_field(user, "client-key", base_dir, path, user_field)
    key_data = _data_field(user, "client-key-data", path, user_field)
    has_cert = bool(cert_file or cert_data)
    has_key = bool(key_file or key_data)
    if has_cert != has_key:
        missing = "client-key or client-key-data" if has_cert else "client-certificate or client-certificate-data"
        raise KubeconfigError(path, f"{user_field}.{missing}", "is missing (a client certificate needs its key)")

    return KubeConfig(
        path=path,
        context=context_name,
        server=server.rstrip("/"),
        ca_file=ca_file,
        ca_data=ca_data,
        insecure_skip_tls_verify=insecure,
        token=token.strip() if token else None,
        token_file=token_file,
        client_cert_file=cert_file,
        client_cert_data=cert_data,
        client_key_file=key_file,
        client_key_data=key_data,
        user_field=user_field,
        cluster_field=cluster_field,
    )


def ssl_context(config: KubeConfig) -> ssl.SSLContext | None:
    """The TLS context for an https:// server (None for http://): server verified unless the
    kubeconfig says insecure-skip-tls-verify; the client certificate loaded when there is one."""
    if not config.server.startswith("https://"):
        return None
    try:
        if config.ca_data is not None:
            ctx = ssl.create_default_context(cadata=config.ca_data.decode("ascii"))
        elif config.ca_file:
            ctx = ssl.create_default_context(cafile=config.ca_file)
        else:
            ctx = ssl.create_default_context()
    except (OSError, ssl.SSLError, UnicodeDecodeError, ValueError) as e:
        field = "certificate-authority-data" if config.ca_data is not None else "certificate-authority"
        raise KubeconfigError(config.path, f"{config.cluster_field}.{field}",
                              f"not a usable CA certificate: {_short(e)}") from None
    if config.insecure_skip_tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if config.client_cert_file or config.client_cert_data:
        _load_client_cert(ctx, config)
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, config: KubeConfig) -> None:
    field = f"{config.user_field}.client-certificate / client-key"
    try:
        with _as_file(config.client_cert_file, config.client_cert_data) as cert_path, _as_file(
            config.client_key_file, config.client_key_data
        ) as key_path:
            ctx.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as e:
        # The message comes from OpenSSL and never holds the key material itself.
        raise KubeconfigError(config.path, field, f"cannot load the client certificate and key: {_short(e)}") from None


def pem_path(data: bytes) -> contextlib.AbstractContextManager[str]:
    """A path OpenSSL can read in-memory PEM `data` from, for as long as the context lasts (see _as_file)."""
    return _as_file(None, data)


@contextlib.contextmanager
def _as_file(path: str | None, data: bytes | None) -> Iterator[str]:
    """A path OpenSSL can read: the given file, or inline material in an anonymous memory file
    (memfd) so no readable copy of a private key ever reaches a disk."""
    if path:
        yield path
        return
    if data is None:
        raise ValueError("neither a file nor inline data to read")
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("edgelet-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    # No memfd: a 0600 file in a private directory, removed as soon as OpenSSL has read it.
    import tempfile  # here: it brings shutil, bz2 and lzma (0.5 MiB), and Linux has had memfd since 3.17

    with tempfile.TemporaryDirectory(prefix="edgelet-tls-") as tmp:
        fd, tmp_path = tempfile.mkstemp(dir=tmp)
        try:
            os.write(fd, data)
            os.close(fd)
            yield tmp_path
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp_path)


def _named_entry(doc: Mapping[str, Any], section: str, name: str, inner: str, path: str) -> Mapping[str, Any]:
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise KubeconfigError(path, section, "must be a list")
    for entry in entries:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get(inner) or {}
            if not isinstance(value, Mapping):
                raise KubeconfigError(path, f"{section}[name={name}].{inner}", "must be a mapping")
            return value
    raise KubeconfigError(path, f"{section}[name={name}]", "no entry with this name")


def _path_field(section: Mapping[str, Any], key: str, base_dir: str, path: str, field: str) -> str | None:
    value = section.get(key)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise KubeconfigError(path, f"{field}.{key}", "must be a file path")
    return value if os.path.isabs(value) else os.path.join(base_dir, value)


def _data_field(section: Mapping[str, Any], key: str, path: str, field: str) -> bytes | None:
    value = section.get(key)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise KubeconfigError(path, f"{field}.{key}", "must be base64 text")
    try:
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise KubeconfigError(path, f"{field}.{key}", "is not valid base64") from None


def _short(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} ({e.filename})" if e.filename else e.strerror
    return str(e) or type(e).__name__
