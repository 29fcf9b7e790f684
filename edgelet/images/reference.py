"""Image references as the container ecosystem reads them: `busybox` means `docker.io/library/busybox:latest`.

The grammar and the normalization rules are those of the distribution reference library that the
kubelet and containerd use, so a name valid for them is valid here and normalizes the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_DOMAIN = "docker.io"
LEGACY_DEFAULT_DOMAIN = "index.docker.io"
OFFICIAL_REPOSITORY_PREFIX = "library/"
DEFAULT_TAG = "latest"
NAME_TOTAL_LENGTH_MAX = 255

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_RE = re.compile(_DOMAIN)
_PATH_RE = re.compile(rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*")
_TAG_RE = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_IDENTIFIER_RE = re.compile(r"[a-f0-9]{64}")


class InvalidReference(ValueError):
    """The string is not an image reference; the message says which rule it breaks."""


@dataclass(frozen=True, slots=True)
class ImageReference:
    """A normalized reference: the domain is explicit, docker.io official images carry `library/`."""

    domain: str
    path: str
    tag: str = ""
    digest: str = ""

    @property
    def repository(self) -> str:
        return f"{self.domain}/{self.path}"

    @property
    def familiar_path(self) -> str:
        """The repository path without the implicit `library/` of docker.io official images."""
        if self.domain == DEFAULT_DOMAIN and self.path.startswith(OFFICIAL_REPOSITORY_PREFIX):
            return self.path[len(OFFICIAL_REPOSITORY_PREFIX) :]
        return self.path

    def __str__(self) -> str:
        text = self.repository
        if self.tag:
            text += ":" + self.tag
        if self.digest:
            text += "@" + self.digest
        return text


def split_domain(name: str) -> tuple[str, str]:
    """`name` (no tag or digest) -> (domain, path), docker.io and `library/` filled in as Docker does."""
    first, slash, rest = name.partition("/")
    looks_like_domain = "." in first or ":" in first or first == "localhost" or first.lower() != first
    if not slash or not looks_like_domain:
        domain, path = DEFAULT_DOMAIN, name
    else:
        domain, path = first, rest
    if domain == LEGACY_DEFAULT_DOMAIN:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = OFFICIAL_REPOSITORY_PREFIX + path
    return domain, path


def parse(image: str) -> ImageReference:
    """Parses and normalizes `image`; no default tag is added (see `with_default_tag`)."""
    if not image:
        raise InvalidReference("repository name must have at least one component")
    if image != image.strip():
        raise InvalidReference("invalid reference format: surrounding whitespace")
    name, at, digest = image.partition("@")
    if at and not _DIGEST_RE.fullmatch(digest):
        raise InvalidReference(f"invalid digest {digest!r}")
    if digest.startswith("sha256:") and len(digest) != len("sha256:") + 64:
        raise InvalidReference(f"invalid digest {digest!r}: sha256 takes 64 hex digits")
    # A colon after the last slash starts the tag; one before it belongs to a domain's port.
    tag = ""
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name, tag = name[:colon], name[colon + 1 :]
        if not _TAG_RE.fullmatch(tag):
            raise InvalidReference(f"invalid tag {tag!r}")
    if _IDENTIFIER_RE.fullmatch(name):
        raise InvalidReference(f"invalid repository name ({name}), cannot specify 64-byte hexadecimal strings")
    if len(name) > NAME_TOTAL_LENGTH_MAX:
        raise InvalidReference(f"repository name must not be more than {NAME_TOTAL_LENGTH_MAX} characters")
    domain, path = split_domain(name)
    if not _DOMAIN_RE.fullmatch(domain):
        raise InvalidReference(f"invalid registry domain {domain!r}")
    if path.lower() != path:
        raise InvalidReference("repository name must be lowercase")
    if not _PATH_RE.fullmatch(path):
        raise InvalidReference(f"invalid repository path {path!r}")
    return ImageReference(domain, path, tag, digest)


def with_default_tag(image: str) -> str:
    """`image` with `:latest` appended when it names neither tag nor digest, like the kubelet.

    The name is otherwise left as written (not expanded to docker.io/...), keeping the runtime in
    charge of its own defaults. Raises InvalidReference.
    """
    ref = parse(image)
    return image if ref.tag or ref.digest else f"{image}:{DEFAULT_TAG}"


def normalize(image: str) -> str:
    """The fully qualified form of `image` with the default tag applied; the key for maps and locks."""
    ref = parse(image)
    if not ref.tag and not ref.digest:
        ref = ImageReference(ref.domain, ref.path, DEFAULT_TAG)
    return str(ref)
