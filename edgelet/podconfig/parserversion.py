"""Which parser made a parsed manifest: a digest of the source of every module a manifest's parse runs.

The record of parsed manifests (podconfig/file.py) is reused only by the same parser. The digest is written
here rather than computed at start: an installed bundle carries bytecode, not source. A unit test recomputes
it from the tree and fails when any of these modules changed and PARSER_DIGEST did not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

# Every edgelet module edgelet.podconfig.manifest imports, directly or not (a unit test keeps this complete).
PARSER_MODULES = (
    "edgelet._yaml",  # its source, edgelet/_yaml.pyx
    "edgelet._yaml_py",
    "edgelet.api",
    "edgelet.api.kubetime",
    "edgelet.api.limits",
    "edgelet.api.podutil",
    "edgelet.api.quantity",
    "edgelet.podconfig.defaults",
    "edgelet.podconfig.manifest",
    "edgelet.podconfig.schema",
    "edgelet.podconfig.validation",
    "edgelet.util.errors",
    "edgelet.yamlload",
)
PARSER_DIGEST = "sha256:08c5629c1c318862ea60e4e53efbd8211a543e5d1614771fecfeab867e73f87f"


def source_digest(sources: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over (module name, source) pairs, in name order, each part NUL-terminated."""
    digest = hashlib.sha256()
    for name, source in sorted(sources):
        digest.update(name.encode() + b"\0" + source + b"\0")
    return "sha256:" + digest.hexdigest()
