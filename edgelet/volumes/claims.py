"""PersistentVolumeClaims of a pod resolved to what the node mounts (pure): the claim and its bound volume read from
the object store, checked the kubelet's way (bound, not being deleted, the volume bound back to the claim, Filesystem
mode, a `local` volume's nodeAffinity against this node's labels), and turned into a hostPath or `local` directory.

The messages are the kubelet's (desired_state_of_world_populator and the operation generator), so a user who knows
them finds them in `kubectl describe pod`.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edgelet.api.objectstore import CLAIM, VOLUME, bound_volume, claim_name
from edgelet.nodestatus.facts import goarch

from .errors import VolumeError
from .plugins import host_path_error

# The volume sources of a PersistentVolume this node mounts; other sources are refused naming them.
PV_SOURCES = ("hostPath", "local", "csi")
FILESYSTEM = "Filesystem"
BLOCK = "Block"

Lookup = Callable[[str, str, str], "dict[str, Any] | None"]  # (kind, namespace, name) -> object or None


@dataclass(frozen=True, slots=True)
class CsiSource:
    """A CSI volume as the node stages and publishes it: a PV's `csi` source, or an inline (ephemeral) one."""

    driver: str
    volume_handle: str  # "" for an inline volume: made per pod and volume
    read_only: bool = False
    fs_type: str = ""
    attributes: tuple[tuple[str, str], ...] = ()  # volumeAttributes, the CSI volume_context
    access_modes: tuple[str, ...] = ()
    mount_options: tuple[str, ...] = ()
    stage_secret: tuple[str, str] | None = None  # (namespace, name) of nodeStageSecretRef
    publish_secret: tuple[str, str] | None = None  # of nodePublishSecretRef
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class ClaimedVolume:
    """A claim resolved to a directory on this node, or to a CSI volume to stage and publish."""

    claim: str  # namespace/name
    volume: str  # the PersistentVolume's name
    kind: str  # "hostPath", "local" or "csi"
    path: str  # the directory (or file) on the node; "" for csi
    host_path_type: str | None  # the hostPath `type` to check; None for `local`
    read_only: bool  # the pod's persistentVolumeClaim.readOnly
    csi: CsiSource | None = None


class ClaimError(VolumeError):
    """The claim cannot be used (yet): not found, Pending, bound elsewhere, of a kind or mode this node cannot mount."""


def _processing(claim: str, message: str) -> ClaimError:
    return ClaimError(f"error processing PVC {claim}: {message}")


def resolve_claim(
    pod_name: str,
    pod_namespace: str,
    pod_uid: str,
    volume: Mapping[str, Any],
    lookup: Lookup,
    *,
    node_name: str,
    node_labels: Mapping[str, str],
    mounted: Iterable[str] = (),
    devices: Iterable[str] = (),
) -> ClaimedVolume:
    """The directory behind a pod's `persistentVolumeClaim` (or generic `ephemeral`) volume; ClaimError otherwise.

    `mounted` and `devices` are the volume names the pod's containers name in volumeMounts and volumeDevices."""
    volume_name = volume.get("name")
    name = claim_name({"metadata": {"name": pod_name}}, dict(volume))
    if name is None:
        raise ClaimError(f"volume {volume_name}: persistentVolumeClaim.claimName is required")
    claim_ref = f"{pod_namespace}/{name}"
    claim = lookup(CLAIM, pod_namespace, name)
    if claim is None:
        raise _processing(claim_ref, f'failed to fetch PVC from API server: persistentvolumeclaims "{name}" not found')
    meta = claim.get("metadata") or {}
    if volume.get("ephemeral") is not None and not _owned_by(meta, pod_uid):
        raise _processing(claim_ref, f"PVC {claim_ref} was not created for pod {pod_namespace}/{pod_name} "
                                     "(pod is not owner)")
    if meta.get("deletionTimestamp"):
        raise _processing(claim_ref, f"can't start pod because PVC {claim_ref} is being deleted")
    pv_name = bound_volume(claim)
    if pv_name is None:
        phase = (claim.get("status") or {}).get("phase") or ""
        raise _processing(claim_ref, f'PVC {claim_ref} has non-bound phase ("{phase}") or empty '
                                     f'pvc.Spec.VolumeName ("{(claim.get("spec") or {}).get("volumeName") or ""}")')
    pv = lookup(VOLUME, "", pv_name)
    if pv is None:
        raise _processing(claim_ref, f'failed to fetch PV {pv_name} from API server: persistentvolumes "{pv_name}" '
                                     "not found")
    spec = pv.get("spec") or {}
    claim_of_pv = spec.get("claimRef") or {}
    if not claim_of_pv.get("name"):
        raise _processing(claim_ref, f"found PV object {pv_name} but it has a nil or empty spec.claimRef indicating "
                                     "it is either unbound or has been bound to a different claim")
    claim_uid = meta.get("uid") or ""
    if claim_of_pv.get("uid") != claim_uid:
        raise _processing(claim_ref, f"found PV object {pv_name} but its spec.claimRef.UID ({claim_of_pv.get('uid')})"
                                     f" does not point to claim.UID ({claim_uid})")
    mode = spec.get("volumeMode") or FILESYSTEM
    if volume_name in set(mounted) and mode != FILESYSTEM:
        raise ClaimError(f"volume {volume_name} has volumeMode {mode}, but is specified in volumeMounts")
    if volume_name in set(devices):
        if mode != BLOCK:
            raise ClaimError(f"volume {volume_name} has volumeMode {mode}, but is specified in volumeDevices")
        raise ClaimError(f"volume {volume_name}: raw block volumes (volumeMode Block, volumeDevices) are not "
                         "supported by edgelet")
    read_only = bool((volume.get("persistentVolumeClaim") or {}).get("readOnly"))
    return _directory(claim_ref, pv_name, spec, read_only, node_name, node_labels)


def _owned_by(meta: Mapping[str, Any], pod_uid: str) -> bool:
    return any(isinstance(owner, dict) and owner.get("controller") and owner.get("kind") == "Pod"
               and owner.get("uid") == pod_uid for owner in meta.get("ownerReferences") or [])


def _directory(claim: str, pv_name: str, spec: Mapping[str, Any], read_only: bool, node_name: str,
               node_labels: Mapping[str, str]) -> ClaimedVolume:
    sources = [key for key in spec if isinstance(spec.get(key), dict) and key not in _NOT_SOURCES]
    if "hostPath" in spec:
        source = spec.get("hostPath") or {}
        if (problem := host_path_error(source.get("path"))) is not None:
            raise ClaimError(f"PersistentVolume {pv_name}: {problem}")
        return ClaimedVolume(claim, pv_name, "hostPath", source["path"], source.get("type") or "", read_only)
    if "local" in spec:
        source = spec.get("local") or {}
        path = source.get("path")
        if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
            raise ClaimError(f"PersistentVolume {pv_name}: local.path must be an absolute path, got {path!r}")
        required = ((spec.get("nodeAffinity") or {}).get("required") or {}).get("nodeSelectorTerms")
        if required is not None and not node_selector_matches(required, node_labels, node_name):
            raise ClaimError(f'MountVolume.NodeAffinity check failed for volume "{pv_name}" : '
                             "no matching NodeSelectorTerms")
        return ClaimedVolume(claim, pv_name, "local", path, None, read_only)
    if "csi" in spec:
        return ClaimedVolume(claim, pv_name, "csi", "", None, read_only, _pv_csi(pv_name, spec, read_only))
    kind = sources[0] if sources else "?"
    raise ClaimError(f"PersistentVolume {pv_name}: volume type {kind} is not supported on this node "
                     f"(edgelet mounts {', '.join(PV_SOURCES[:-1])} and {PV_SOURCES[-1]} volumes)")


def _pv_csi(pv_name: str, spec: Mapping[str, Any], read_only: bool) -> CsiSource:
    source = spec.get("csi") or {}
    driver, handle = source.get("driver"), source.get("volumeHandle")
    if not isinstance(driver, str) or not driver or not isinstance(handle, str) or not handle:
        raise ClaimError(f"PersistentVolume {pv_name}: csi.driver and csi.volumeHandle are required")
    return CsiSource(driver, handle, read_only=read_only or bool(source.get("readOnly")),
                     fs_type=str(source.get("fsType") or ""), attributes=_string_pairs(source.get("volumeAttributes")),
                     access_modes=tuple(spec.get("accessModes") or ()),
                     mount_options=tuple(spec.get("mountOptions") or ()),
                     stage_secret=_secret_ref(source.get("nodeStageSecretRef")),
                     publish_secret=_secret_ref(source.get("nodePublishSecretRef")))


def inline_csi(volume: Mapping[str, Any], pod_namespace: str) -> CsiSource:
    """A pod's inline `csi` volume (the ephemeral lifecycle mode): its handle is made per pod, its secret is in the
    pod's namespace."""
    source = volume.get("csi") or {}
    driver = source.get("driver")
    if not isinstance(driver, str) or not driver:
        raise VolumeError(f"volume {volume.get('name')}: csi.driver is required")
    ref = source.get("nodePublishSecretRef") or {}
    return CsiSource(driver, "", read_only=bool(source.get("readOnly")), fs_type=str(source.get("fsType") or ""),
                     attributes=_string_pairs(source.get("volumeAttributes")),
                     publish_secret=(pod_namespace, ref["name"]) if isinstance(ref.get("name"), str) else None,
                     ephemeral=True)


def _string_pairs(value: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in value.items())) if isinstance(value, dict) else ()


def _secret_ref(ref: Any) -> tuple[str, str] | None:
    if isinstance(ref, dict) and isinstance(ref.get("name"), str):
        return (str(ref.get("namespace") or "default"), ref["name"])
    return None


# Fields of a PersistentVolumeSpec that are objects but not volume sources.
_NOT_SOURCES = frozenset({"capacity", "claimRef", "nodeAffinity", "mountOptions"})


def node_labels(node_name: str, configured: Mapping[str, str], machine: str | None = None) -> dict[str, str]:
    """The labels this agent gives its Node (configured ones and the well-known ones, as the node status sets them):
    what a `local` volume's nodeAffinity is matched with, offline too. Labels added to the Node by others are not
    seen (the agent keeps no watch on its Node)."""
    # The well-known label names (API constants; nodestatus.setters, cluster mode only, sets them on the Node).
    return {**configured, "kubernetes.io/hostname": node_name.lower(), "kubernetes.io/os": "linux",
            "kubernetes.io/arch": goarch(machine or platform.machine())}


# -- node selectors (the scheduler's and the kubelet's NodeSelector semantics) ---------------------------------


def node_selector_matches(terms: Any, labels: Mapping[str, str], node_name: str) -> bool:
    """Whether any term matches (terms are ORed, a term's requirements ANDed; an empty term matches nothing)."""
    if not isinstance(terms, list):
        return False
    return any(_term_matches(term, labels, node_name) for term in terms if isinstance(term, dict))


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], node_name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    return (all(_requirement_matches(requirement, labels) for requirement in expressions)
            and all(_requirement_matches(requirement, {"metadata.name": node_name}) for requirement in fields))


def _requirement_matches(requirement: Any, labels: Mapping[str, str]) -> bool:
    if not isinstance(requirement, dict):
        return False
    key, operator, values = requirement.get("key"), requirement.get("operator"), requirement.get("values") or []
    if not isinstance(key, str):
        key = ""  # no label key is empty: nothing matches it
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False
