"""Talking to a Kubernetes control plane: kubeconfig, an async REST client and its error types."""

from edgelet.kubeapi.client import ApiClient
from edgelet.kubeapi.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    ServerError,
    Unauthorized,
    WatchStreamError,
)
from edgelet.kubeapi.kubeconfig import KubeConfig, KubeconfigError, load_kubeconfig, parse_kubeconfig, ssl_context

__all__ = [
    "AlreadyExists",
    "ApiClient",
    "ApiError",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeConfig",
    "KubeconfigError",
    "NotFound",
    "ServerError",
    "Unauthorized",
    "WatchStreamError",
    "load_kubeconfig",
    "parse_kubeconfig",
    "ssl_context",
]
