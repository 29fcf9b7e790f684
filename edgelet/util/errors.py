"""Error types shared by every module: temporary errors are retried with backoff, permanent ones are reported."""

import re

# A quoted value longer than this is cut in messages: a 1 MB field must not land whole in every log line.
SHOWN_VALUE_CHARS = 200
_MAX_MESSAGE_CHARS = 2000
# Possessive (*+): a plain `(?:a|b)*` keeps a backtrack point per character, over 100 MB for a 1 MB value.
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*+'|\"(?:[^\"\\\n]|\\.)*+\"")


def cut_long_values(text: str) -> str:
    """`text` with every quoted value beyond SHOWN_VALUE_CHARS cut to that, marked "…(N bytes)"; the whole
    message is capped the same way."""
    def cut(match: re.Match[str]) -> str:
        value = match.group()
        return value if len(value) <= SHOWN_VALUE_CHARS else _cut(value, SHOWN_VALUE_CHARS)
    if len(text) <= SHOWN_VALUE_CHARS:
        return text
    text = _QUOTED.sub(cut, text)
    return text if len(text) <= _MAX_MESSAGE_CHARS else _cut(text, _MAX_MESSAGE_CHARS)


def _cut(text: str, keep: int) -> str:
    return f"{text[:keep]}…({len(text.encode('utf-8', 'replace'))} bytes)"


class EdgeletError(Exception):
    """Base of edgelet's own errors."""


class TemporaryError(EdgeletError):
    """Worth retrying later (runtime or API unreachable, timeout, 5xx)."""


class PermanentError(EdgeletError):
    """Retrying the same input cannot help (invalid spec, missing file, 4xx)."""


class CredentialsRefused(PermanentError):
    """A server refused edgelet's credentials (the API server's 401): retrying soon will not help, later may.
    Here, not with the API client, so that the retry helper knows it without loading that client."""

    # The server's answer, as every refusal carries it (the API client's Unauthorized sets them).
    status: int
    reason: str
    message: str


class ConfigError(PermanentError):
    """A config or manifest problem, naming the file and the key or field."""

    def __init__(self, path: str, key: str, message: str):
        self.path = path
        self.key = key = cut_long_values(key)
        self.message = message = cut_long_values(message)
        where = f"{path}: {key}" if key else str(path)
        super().__init__(f"{where}: {message}")


class YAMLError(ValueError):
    """Text that is not YAML, or YAML that does not load (edgelet.yamlload): the problem and where it is, as
    libyaml and PyYAML state them (0-based line and column; None where the parser gives no position)."""

    def __init__(self, problem: str, line: int | None = None, column: int | None = None, *,
                 context: str | None = None, context_line: int | None = None, context_column: int | None = None):
        self.problem = problem
        self.line = line
        self.column = column
        self.context = context
        self.context_line = context_line
        self.context_column = context_column
        where = f" (line {line + 1}, column {column + 1})" if line is not None and column is not None else ""
        super().__init__(f"{context}: {problem}{where}" if context else f"{problem}{where}")
