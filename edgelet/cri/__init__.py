"""CRI v1 for edgelet: the protocol subset (runtime_v1.proto and its stubs), the client, and its errors.

The errors live here, free of grpc imports, so callers can catch them without loading the client.
"""

from edgelet.util.errors import EdgeletError, PermanentError, TemporaryError


class RuntimeCallError(EdgeletError):
    """A failed CRI call: the operation, the gRPC status code name (e.g. "NOT_FOUND") and the runtime's words."""

    def __init__(self, message: str, operation: str, code: str, details: str):
        super().__init__(message)
        self.operation = operation
        self.code = code
        self.details = details


class RuntimeUnavailable(RuntimeCallError, TemporaryError):
    """The runtime did not answer in time or cannot be reached at its endpoint; worth retrying."""

    def __init__(self, endpoint: str, operation: str, code: str, details: str):
        super().__init__(
            f"container runtime at {endpoint} unavailable ({operation}: {code}): {details}", operation, code, details
        )
        self.endpoint = endpoint


class RuntimeTimeout(RuntimeUnavailable):
    """No reply within the client's timeout to a call the runtime goes on carrying out (RunPodSandbox,
    CreateContainer, StartContainer): whether it succeeds shows in the runtime's state later, not here."""

    def __init__(self, endpoint: str, operation: str, seconds: float):
        super().__init__(endpoint, operation, "DEADLINE_EXCEEDED",
                         f"no reply within {seconds:g}s; the runtime may still be carrying the call out")


class NotFound(RuntimeCallError, PermanentError):
    """The sandbox, container or image named in the call does not exist (any more)."""

    def __init__(self, operation: str, code: str, details: str):
        super().__init__(f"{operation}: not found: {details}", operation, code, details)


class CRIError(RuntimeCallError, PermanentError):
    """The runtime refused or failed the call; `code` and `details` say how."""

    def __init__(self, operation: str, code: str, details: str):
        super().__init__(f"{operation} failed ({code}): {details}", operation, code, details)


def create_in_flight(error: Exception) -> bool:
    """CreateContainer refused because the container's name is reserved by a create still running in the
    runtime (containerd: `failed to reserve container name`); the container appears once that create ends."""
    return isinstance(error, CRIError) and "failed to reserve container name" in error.details


def start_in_flight(error: Exception) -> bool:
    """StartContainer refused because an earlier StartContainer of the same container still runs in the
    runtime (containerd: `container is already in starting state`)."""
    return isinstance(error, CRIError) and "already in starting state" in error.details


def in_starting_state(error: Exception) -> bool:
    """A call refused because the container's start is under way in the runtime (containerd: `already in starting
    state` to a second StartContainer, `in starting state, can't be removed` to RemoveContainer)."""
    return isinstance(error, CRIError) and "in starting state" in error.details


__all__ = ["CRIError", "NotFound", "RuntimeCallError", "RuntimeTimeout", "RuntimeUnavailable", "create_in_flight",
           "in_starting_state", "start_in_flight"]
