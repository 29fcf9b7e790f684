"""Errors of the Kubernetes API client, one type per answer a caller handles differently.

Server-side and transport trouble (5xx, 429, timeouts, refused connections, broken watch streams)
is a `TemporaryError`; rejected credentials (401) are a `PermanentError` the caller retries slowly; a
forbidden request (403) concerns that one request only, and the caller goes on with the others.
"""

from __future__ import annotations

from typing import Any

from edgelet.util.errors import CredentialsRefused, EdgeletError, PermanentError, TemporaryError


class ApiError(EdgeletError):
    """An answer from the API server other than success; `status` is the HTTP code (0: no answer)."""

    def __init__(self, status: int, reason: str, message: str, *, method: str = "", path: str = ""):
        self.status = status
        self.reason = reason
        self.message = message
        self.method = method
        self.path = path
        where = f"{method} {path}: " if method else ""
        super().__init__(f"{where}{status} {reason}: {message}" if status else f"{where}{reason}: {message}")


class NotFound(ApiError):
    """404: the object does not exist."""


class Conflict(ApiError):
    """409: resourceVersion or a precondition (uid) did not match; re-read and retry."""


class AlreadyExists(ApiError):
    """409 with reason AlreadyExists: create of a name that is taken."""


class Gone(ApiError):
    """410 (or a watch ERROR event with code 410): the resourceVersion is too old; list again."""


class Invalid(ApiError, PermanentError):
    """400 / 422: the server refused the object or the request as malformed."""


class Unauthorized(ApiError, CredentialsRefused):
    """401: the credentials were refused; retrying soon will not help, retrying later may."""


class Forbidden(ApiError, PermanentError):
    """403: the credentials are fine but this request is not allowed (RBAC, the Node authorizer, NodeRestriction
    refusing a mirror pod that references a Secret, a write to another node's object)."""


class ServerError(ApiError, TemporaryError):
    """5xx, 429, timeouts and connection failures: retry with backoff."""


class WatchStreamError(ServerError):
    """A watch stream that cannot be parsed (garbage, truncated line); the caller lists again."""


def error_from_status(status: int, body: Any, *, method: str = "", path: str = "") -> ApiError:
    """Map an HTTP status and a (possibly non-Status) response body to the matching error type."""
    reason = ""
    message = ""
    if isinstance(body, dict):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
    if not message:
        message = f"HTTP {status}"
    cls: type[ApiError]
    if status == 401:
        cls = Unauthorized
        reason = reason or "Unauthorized"
    elif status == 403:
        cls = Forbidden
        reason = reason or "Forbidden"
    elif status == 404:
        cls = NotFound
        reason = reason or "NotFound"
    elif status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
        reason = reason or "Conflict"
    elif status == 410:
        cls = Gone
        reason = reason or "Gone"
    elif status in (400, 422):
        cls = Invalid
        reason = reason or ("BadRequest" if status == 400 else "Invalid")
    elif status == 429 or status >= 500:
        cls = ServerError
        reason = reason or ("TooManyRequests" if status == 429 else "InternalError")
    else:
        cls = ApiError
        reason = reason or "Unknown"
    return cls(status, reason, message, method=method, path=path)
