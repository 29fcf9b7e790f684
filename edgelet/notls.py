"""A node whose config names no TLS endpoint runs without OpenSSL.

Loading OpenSSL costs a standalone agent about 4.5 of its 48 MiB: libcrypto's pages, and the ssl module's
enums. asyncio and uvloop import `ssl` whether or not anything speaks TLS, and `hashlib` loads OpenSSL's
digests on import. A standalone node speaks no TLS: the runtime is a unix socket, the health and metrics
server is plain HTTP, the manifests are files. Only [cluster] (the API server, the kubelet API) and a
[pods] http_url (httpx builds a TLS context with every client) need it.

So before asyncio is imported, `edgelet run` asks `without_openssl()`:
- `_hashlib`, OpenSSL's digests, is marked absent (a None entry in sys.modules is the import system's "no such
  module"). hashlib then serves sha256, md5 and blake2b from CPython's own implementations, which give the
  same digests; they are slower, which only the air-gap image import would notice.
- `ssl` is a stand-in carrying the names asyncio and uvloop bind when they are imported. Nothing in such an
  agent opens a TLS connection; if something ever tried, it fails with `TLSNotLoaded`, saying why.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Config


class TLSNotLoaded(RuntimeError):
    """A TLS context was asked for in an agent that runs without OpenSSL."""

    def __init__(self) -> None:
        super().__init__("TLS is not loaded: edgelet runs without OpenSSL when its config has no [cluster] "
                         "and no [pods] http_url")


def config_needs_tls(config: Config) -> bool:
    """Whether anything this config sets up can open or serve a TLS connection."""
    return config.cluster is not None or bool(config.pods.http_url)


class _Unavailable:
    """SSLContext, MemoryBIO, SSLObject, SSLSocket: isinstance checks answer no, construction raises."""

    def __new__(cls, *args: object, **kwargs: object):
        raise TLSNotLoaded()


def _create_default_context(*args: object, **kwargs: object):
    raise TLSNotLoaded()


def _stand_in() -> types.ModuleType:
    """What asyncio (base_events, sslproto, selector_events) and uvloop read from `ssl` when imported."""

    class SSLError(OSError):
        pass

    class SSLWantReadError(SSLError):
        pass

    class SSLSyscallError(SSLError):
        pass

    class SSLZeroReturnError(SSLError):
        pass

    class CertificateError(ValueError):
        pass

    module = types.ModuleType("ssl", "Stand-in for ssl in an agent that runs without OpenSSL (edgelet.notls).")
    module.__dict__.update(
        SSLError=SSLError, SSLWantReadError=SSLWantReadError, SSLSyscallError=SSLSyscallError,
        SSLZeroReturnError=SSLZeroReturnError, CertificateError=CertificateError,
        SSLContext=_Unavailable, MemoryBIO=_Unavailable, SSLObject=_Unavailable, SSLSocket=_Unavailable,
        create_default_context=_create_default_context,
        # OpenSSL's SSL_ERROR_* numbers, which uvloop copies at import.
        SSL_ERROR_WANT_READ=2, SSL_ERROR_WANT_WRITE=3, SSL_ERROR_SYSCALL=5,
    )
    return module


def without_openssl() -> bool:
    """Keep OpenSSL out of this process from now on; False (and nothing changed) if it is already loaded.

    Call it before asyncio is imported, and only in a process that will never need TLS.
    """
    if "ssl" in sys.modules or "_ssl" in sys.modules or "_hashlib" in sys.modules:
        return False
    sys.modules["_hashlib"] = None  # type: ignore[assignment]
    sys.modules["ssl"] = _stand_in()
    return True
