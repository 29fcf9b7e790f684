"""What the real API server refuses a node's credentials (user system:node:<name>): the NodeRestriction
admission plugin, the write rules of the Node authorizer, and (from 1.32) its rule that a node lists and watches
only the pods bound to it. Every refusal is a 403."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.kubeapi_double.store import StatusError

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
LEASE_NAMESPACE = "kube-node-lease"


def forbidden(resource: str, name: str, message: str) -> StatusError:
    return StatusError(403, "Forbidden", f'{resource} "{name}" is forbidden: {message}')


def check_node_pod_list(node: str, verb: str, namespace: str | None, field_selector: str) -> None:
    """Raise the 403 a 1.32+ server answers node `node` listing or watching pods without selecting its own."""
    wanted = {f"spec.nodeName={node}", f"spec.nodeName=={node}"}
    if wanted & {part.strip() for part in field_selector.split(",")}:
        return
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    raise StatusError(403, "Forbidden", f'pods is forbidden: User "system:node:{node}" cannot {verb} resource "pods" '
                                        f'in API group "" {scope}: can only list/watch pods with spec.nodeName field '
                                        "selector")


def check_node_write(node: str, method: str, resource: str, namespace: str | None, name: str | None,
                     subresource: str, body: Any, get: Callable[[str, str | None, str], dict[str, Any]]) -> None:
    """Raise the 403 the real server answers to node `node` for this write; `get(resource, ns, name)`
    reads the stored objects (raising StatusError 404)."""
    if resource == "pods":
        if method == "POST":
            _check_mirror_pod(node, body if isinstance(body, dict) else {}, get)
        elif name is not None and subresource != "status" and method != "DELETE":
            raise forbidden("pods", name, f'unexpected operation, node "{node}" can only create and delete mirror pods')
        elif name is not None and _bound_node(get, namespace, name) != node:
            what = "update pod status" if subresource == "status" else "delete pods"
            raise forbidden("pods", name, f'node "{node}" can only {what} for pods with spec.nodeName set to itself')
    elif resource == "nodes":
        target = name or ((body or {}).get("metadata") or {}).get("name", "")
        if target != node:
            raise forbidden("nodes", target, f'node "{node}" is not allowed to modify node "{target}"')
    elif resource == "leases":
        target = name or ((body or {}).get("metadata") or {}).get("name", "")
        if namespace != LEASE_NAMESPACE or target != node:
            raise forbidden("leases.coordination.k8s.io", target,
                            "can only access node lease with the same name as the requesting node")


def _bound_node(get: Callable[..., dict[str, Any]], namespace: str | None, name: str) -> str:
    try:
        return (get("pods", namespace, name).get("spec") or {}).get("nodeName") or ""
    except StatusError as e:
        if e.code == 404:
            return ""
        raise


def _check_mirror_pod(node: str, pod: dict[str, Any], get: Callable[..., dict[str, Any]]) -> None:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    name = meta.get("name") or ""
    if MIRROR_ANNOTATION not in (meta.get("annotations") or {}):
        raise forbidden("pods", name,
                        f'pod does not have "{MIRROR_ANNOTATION}" annotation, '
                        f'node "{node}" can only create mirror pods')
    if spec.get("nodeName") != node:
        raise forbidden("pods", name, f'node "{node}" can only create pods with spec.nodeName set to itself')
    owners = meta.get("ownerReferences") or []
    if len(owners) > 1:
        raise forbidden("pods", name, f'node "{node}" can only create pods with a single owner reference set to itself')
    if owners:
        owner = owners[0]
        if owner.get("apiVersion") != "v1" or owner.get("kind") != "Node" or owner.get("name") != node:
            raise forbidden("pods", name, f'node "{node}" can only create pods with an owner reference set to itself')
        if not owner.get("uid"):
            raise forbidden("pods", name, f'node "{node}" can only create pods with an owner reference set to itself')
        uid = (get("nodes", None, node).get("metadata") or {}).get("uid")
        if owner["uid"] != uid:
            raise forbidden("pods", name, f"node {node} UID mismatch")
    if spec.get("serviceAccountName"):
        raise forbidden("pods", name, f'node "{node}" can not create pods that reference a service account')
    kinds = _references(spec)
    for kind in ("secrets", "configmaps", "persistentvolumeclaims"):  # the plugin's order of checks
        if kind in kinds:
            raise forbidden("pods", name, f'node "{node}" can not create pods that reference {kind}')


def _references(spec: dict[str, Any]) -> list[str]:
    """The kinds of API objects a pod spec references (secrets, configmaps, persistentvolumeclaims)."""
    kinds: list[str] = []
    for volume in spec.get("volumes") or []:
        if "secret" in volume:
            kinds.append("secrets")
        if "configMap" in volume:
            kinds.append("configmaps")
        if "persistentVolumeClaim" in volume:
            kinds.append("persistentvolumeclaims")
        for source in (volume.get("projected") or {}).get("sources") or []:
            kinds += [k for key, k in (("secret", "secrets"), ("configMap", "configmaps")) if key in source]
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for env in container.get("env") or []:
            ref = env.get("valueFrom") or {}
            kinds += [k for key, k in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")) if key in ref]
        for source in container.get("envFrom") or []:
            kinds += [k for key, k in (("secretRef", "secrets"), ("configMapRef", "configmaps")) if key in source]
    for secret in spec.get("imagePullSecrets") or []:
        if secret:
            kinds.append("secrets")
    return kinds
