"""The one error of the volume manager: a volume cannot be set up, torn down or mounted."""

from __future__ import annotations

from edgelet.util.errors import EdgeletError


class VolumeError(EdgeletError):
    """A volume problem a user can act on (missing ConfigMap, failed hostPath check, bad subPath)."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)
