"""Error types shared by every module: temporary errors are retried with backoff, permanent ones are reported."""


class EdgeletError(Exception):
    """Base of edgelet's own errors."""


class TemporaryError(EdgeletError):
    """Worth retrying later (runtime or API unreachable, timeout, 5xx)."""


class PermanentError(EdgeletError):
    """Retrying the same input cannot help (invalid spec, missing file, 4xx)."""


class ConfigError(PermanentError):
    """A config or manifest problem, naming the file and the key or field."""

    def __init__(self, path: str, key: str, message: str):
        self.path = path
        self.key = key
        self.message = message
        where = f"{path}: {key}" if key else str(path)
        super().__init__(f"{where}: {message}")
