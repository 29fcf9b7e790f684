"""Pod sources (manifest files, an HTTP URL, the API server) merged into one stream of pod updates.

The sources live in submodules (`file`, `http`) so that importing the merger does not import httpx.
"""

from edgelet.podconfig.config import Op, PodConfig, PodUpdate, SourceHandle, merge_source
from edgelet.podconfig.manifest import ManifestObjects, load_manifest_file, parse_manifest

__all__ = [
    "ManifestObjects",
    "Op",
    "PodConfig",
    "PodUpdate",
    "SourceHandle",
    "load_manifest_file",
    "merge_source",
    "parse_manifest",
]
