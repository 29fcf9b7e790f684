"""The error of a call to a CSI plugin (light: the volume manager catches it without loading gRPC)."""

from __future__ import annotations

from edgelet.util.errors import EdgeletError


class CsiError(EdgeletError):
    """A plugin call failed; the message names the call and the plugin's answer."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)
