"""The field names of the core/v1 objects a manifest may hold, for kubectl-like strict decoding of local manifests.

A schema is a dict of field name -> the schema of its value: another dict (an object), a one-item list
(a list of such objects), MAP (free-form keys: labels, resource lists) or ANY (not looked into: status, or
structures edgelet accepts but does not act on, like affinity). Only local manifests are checked: pods from
the API server were validated there, and newer servers add fields we do not know.
"""

from __future__ import annotations

from typing import Any

ANY = "any"  # a value whose inside is not checked
MAP = "map"  # an object with free-form keys

Schema = Any

_NAME = {"name": ANY}
_KEY_TO_PATH = [{"key": ANY, "path": ANY, "mode": ANY}]
_OBJECT_FIELD_SELECTOR = {"apiVersion": ANY, "fieldPath": ANY}
_RESOURCE_FIELD_SELECTOR = {"containerName": ANY, "resource": ANY, "divisor": ANY}
_KEY_SELECTOR = {"name": ANY, "key": ANY, "optional": ANY}
_SE_LINUX = {"user": ANY, "role": ANY, "type": ANY, "level": ANY}
_PROFILE = {"type": ANY, "localhostProfile": ANY}

OBJECT_META = {
    "name": ANY, "generateName": ANY, "namespace": ANY, "selfLink": ANY, "uid": ANY, "resourceVersion": ANY,
    "generation": ANY, "creationTimestamp": ANY, "deletionTimestamp": ANY, "deletionGracePeriodSeconds": ANY,
    "labels": MAP, "annotations": MAP, "ownerReferences": ANY, "finalizers": ANY, "managedFields": ANY,
}

_HTTP_GET = {"path": ANY, "port": ANY, "host": ANY, "scheme": ANY, "httpHeaders": [{"name": ANY, "value": ANY}]}
_EXEC = {"command": ANY}
_TCP_SOCKET = {"port": ANY, "host": ANY}
_PROBE = {
    "exec": _EXEC, "httpGet": _HTTP_GET, "tcpSocket": _TCP_SOCKET, "grpc": {"port": ANY, "service": ANY},
    "initialDelaySeconds": ANY, "timeoutSeconds": ANY, "periodSeconds": ANY, "successThreshold": ANY,
    "failureThreshold": ANY, "terminationGracePeriodSeconds": ANY,
}
_HANDLER = {"exec": _EXEC, "httpGet": _HTTP_GET, "tcpSocket": _TCP_SOCKET, "sleep": {"seconds": ANY}}
_RESOURCES = {"limits": MAP, "requests": MAP, "claims": [{"name": ANY, "request": ANY}]}
_SECURITY_CONTEXT = {
    "capabilities": {"add": ANY, "drop": ANY}, "privileged": ANY, "seLinuxOptions": _SE_LINUX,
    "windowsOptions": ANY, "runAsUser": ANY, "runAsGroup": ANY, "runAsNonRoot": ANY,
    "readOnlyRootFilesystem": ANY, "allowPrivilegeEscalation": ANY, "procMount": ANY,
    "seccompProfile": _PROFILE, "appArmorProfile": _PROFILE,
}
CONTAINER = {
    "name": ANY, "image": ANY, "command": ANY, "args": ANY, "workingDir": ANY,
    "ports": [{"name": ANY, "hostPort": ANY, "containerPort": ANY, "protocol": ANY, "hostIP": ANY}],
    "envFrom": [{"prefix": ANY, "configMapRef": {"name": ANY, "optional": ANY},
                 "secretRef": {"name": ANY, "optional": ANY}}],
    "env": [{"name": ANY, "value": ANY, "valueFrom": {
        "fieldRef": _OBJECT_FIELD_SELECTOR, "resourceFieldRef": _RESOURCE_FIELD_SELECTOR,
        "configMapKeyRef": _KEY_SELECTOR, "secretKeyRef": _KEY_SELECTOR, "fileKeyRef": ANY}}],
    "resources": _RESOURCES,
    "resizePolicy": [{"resourceName": ANY, "restartPolicy": ANY}],
    "restartPolicy": ANY, "restartPolicyRules": ANY,
    "volumeMounts": [{"name": ANY, "readOnly": ANY, "recursiveReadOnly": ANY, "mountPath": ANY, "subPath": ANY,
                      "mountPropagation": ANY, "subPathExpr": ANY}],
    "volumeDevices": [{"name": ANY, "devicePath": ANY}],
    "livenessProbe": _PROBE, "readinessProbe": _PROBE, "startupProbe": _PROBE,
    "lifecycle": {"postStart": _HANDLER, "preStop": _HANDLER, "stopSignal": ANY},
    "terminationMessagePath": ANY, "terminationMessagePolicy": ANY, "imagePullPolicy": ANY,
    "securityContext": _SECURITY_CONTEXT, "stdin": ANY, "stdinOnce": ANY, "tty": ANY,
}
# An ephemeral container (kubectl debug) is a container with a target whose processes it may see.
EPHEMERAL_CONTAINER = {**CONTAINER, "targetContainerName": ANY}

_DOWNWARD_API_FILE = {"path": ANY, "fieldRef": _OBJECT_FIELD_SELECTOR, "resourceFieldRef": _RESOURCE_FIELD_SELECTOR,
                      "mode": ANY}
_PROJECTION = {
    "secret": {"name": ANY, "items": _KEY_TO_PATH, "optional": ANY},
    "configMap": {"name": ANY, "items": _KEY_TO_PATH, "optional": ANY},
    "downwardAPI": {"items": [_DOWNWARD_API_FILE]},
    "serviceAccountToken": {"audience": ANY, "expirationSeconds": ANY, "path": ANY},
    "clusterTrustBundle": ANY, "podCertificate": ANY,
}
# The sources edgelet mounts are spelled out; the others (network and cloud volumes) are known names only.
VOLUME = {
    "name": ANY,
    "hostPath": {"path": ANY, "type": ANY},
    "emptyDir": {"medium": ANY, "sizeLimit": ANY},
    "secret": {"secretName": ANY, "items": _KEY_TO_PATH, "defaultMode": ANY, "optional": ANY},
    "configMap": {"name": ANY, "items": _KEY_TO_PATH, "defaultMode": ANY, "optional": ANY},
    "downwardAPI": {"items": [_DOWNWARD_API_FILE], "defaultMode": ANY},
    "projected": {"sources": [_PROJECTION], "defaultMode": ANY},
    "persistentVolumeClaim": {"claimName": ANY, "readOnly": ANY},
    **{source: ANY for source in (
        "ephemeral", "image", "csi", "nfs", "iscsi", "glusterfs", "rbd", "flexVolume", "cinder", "cephfs",
        "flocker", "fc", "azureFile", "azureDisk", "vsphereVolume", "quobyte", "photonPersistentDisk",
        "portworxVolume", "scaleIO", "storageos", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo")},
}

POD_SPEC = {
    "volumes": [VOLUME], "initContainers": [CONTAINER], "containers": [CONTAINER],
    "ephemeralContainers": [EPHEMERAL_CONTAINER],
    "restartPolicy": ANY, "terminationGracePeriodSeconds": ANY, "activeDeadlineSeconds": ANY, "dnsPolicy": ANY,
    "nodeSelector": MAP, "serviceAccountName": ANY, "serviceAccount": ANY, "automountServiceAccountToken": ANY,
    "nodeName": ANY, "hostNetwork": ANY, "hostPID": ANY, "hostIPC": ANY, "shareProcessNamespace": ANY,
    "securityContext": {
        "seLinuxOptions": _SE_LINUX, "windowsOptions": ANY, "runAsUser": ANY, "runAsGroup": ANY,
        "runAsNonRoot": ANY, "supplementalGroups": ANY, "supplementalGroupsPolicy": ANY, "fsGroup": ANY,
        "sysctls": [{"name": ANY, "value": ANY}], "fsGroupChangePolicy": ANY, "seccompProfile": _PROFILE,
        "appArmorProfile": _PROFILE, "seLinuxChangePolicy": ANY,
    },
    "imagePullSecrets": [_NAME], "hostname": ANY, "subdomain": ANY, "affinity": ANY, "schedulerName": ANY,
    "tolerations": [{"key": ANY, "operator": ANY, "value": ANY, "effect": ANY, "tolerationSeconds": ANY}],
    "hostAliases": [{"ip": ANY, "hostnames": ANY}], "priorityClassName": ANY, "priority": ANY,
    "dnsConfig": {"nameservers": ANY, "searches": ANY, "options": [{"name": ANY, "value": ANY}]},
    "readinessGates": [{"conditionType": ANY}], "runtimeClassName": ANY, "enableServiceLinks": ANY,
    "preemptionPolicy": ANY, "overhead": MAP, "topologySpreadConstraints": ANY, "setHostnameAsFQDN": ANY,
    "os": _NAME, "hostUsers": ANY, "schedulingGates": [_NAME], "resourceClaims": ANY, "resources": _RESOURCES,
    "hostnameOverride": ANY,
}

_TYPE_META = {"apiVersion": ANY, "kind": ANY}
OBJECTS: dict[str, Schema] = {
    "Pod": {**_TYPE_META, "metadata": OBJECT_META, "spec": POD_SPEC, "status": ANY},
    "ConfigMap": {**_TYPE_META, "metadata": OBJECT_META, "data": MAP, "binaryData": MAP, "immutable": ANY},
    "Secret": {**_TYPE_META, "metadata": OBJECT_META, "data": MAP, "stringData": MAP, "type": ANY,
               "immutable": ANY},
}
LIST = {**_TYPE_META, "metadata": ANY, "items": ANY}


def unknown_fields(value: Any, schema: Schema, path: str = "") -> list[tuple[str, str]]:
    """(field path, message) for every field the schema does not know, with a "did you mean" when one is close.

    Values of the wrong type are left to validation, which reports them with their expected type.
    """
    problems: list[tuple[str, str]] = []
    _walk(value, schema, path, problems)
    return problems


def _walk(value: Any, schema: Schema, path: str, problems: list[tuple[str, str]]) -> None:
    if isinstance(schema, list):
        if isinstance(value, list):
            for index, item in enumerate(value):
                _walk(item, schema[0], f"{path}[{index}]", problems)
        return
    if not isinstance(schema, dict) or not isinstance(value, dict):
        return
    for key, item in value.items():
        field_path = f"{path}.{key}" if path else str(key)
        if key in schema:
            _walk(item, schema[key], field_path, problems)
        else:
            problems.append((field_path, unknown_field_message(str(key), schema)))


def unknown_field_message(key: str, known: Any) -> str:
    import difflib  # only a manifest with a typo needs it, so a start does not load it

    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    if not close:  # a case slip (`hostpath`) is too far for difflib's ratio on short names
        close = [name for name in known if name.lower() == key.lower()][:1]
    return f'unknown field "{key}"' + (f' (did you mean "{close[0]}"?)' if close else "")
