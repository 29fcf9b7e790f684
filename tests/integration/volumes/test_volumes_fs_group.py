"""fsGroup on the file-backed volumes as the kubelet applies it (SetVolumeOwnership over the whole volume, read-only
masks), what a non-root container of the real containerd then reads, and a projected volume combining a
ConfigMap, a Secret and the downward API.
"""

from __future__ import annotations

import os
import stat

import pytest

from tests.integration.volumes.harness import UID, remove_pod, sandbox_config_for, secret_object, volume_pod

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")

FS_GROUP = 1001
USER = 1000


def _config_map(name, **data):
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": data}


def _volumes():
    return [
        {"name": "cm", "configMap": {"name": "cfg", "defaultMode": 0o440}},
        {"name": "cm-items", "configMap": {"name": "cfg", "items": [{"key": "data-2", "path": "path/to/data-2",
                                                                     "mode": 0o600}]}},
        {"name": "sec", "secret": {"secretName": "creds", "defaultMode": 0o400}},
        {"name": "all", "projected": {"defaultMode": 0o440, "sources": [
            {"downwardAPI": {"items": [{"path": "podname", "fieldRef": {"apiVersion": "v1",
                                                                         "fieldPath": "metadata.name"}}]}},
            {"secret": {"name": "creds"}},
            {"configMap": {"name": "cfg"}}]}},
    ]


@pytest.fixture
def objects(store):
    store.put(_config_map("cfg", **{"data-1": "value-1", "data-2": "value-2"}))
    store.put(secret_object("creds", **{"secret-data": b"secret-value-1"}))
    return store


def _mode_and_group(path):
    info = os.stat(path)
    return stat.S_IMODE(info.st_mode), info.st_gid


async def test_fs_group_owns_the_whole_volume_with_read_only_masks(manager, objects):
    """Files: their mode with the group's read bits added; the volume directory itself: the group, setgid and
    group traversal, as SetVolumeOwnership walks it."""
    pod = volume_pod(_volumes(), securityContext={"fsGroup": FS_GROUP, "runAsUser": USER})
    paths = await manager.setup_pod(pod)
    assert _mode_and_group(os.path.join(paths["cm"], "data-1")) == (0o440, FS_GROUP)
    assert _mode_and_group(os.path.join(paths["cm-items"], "path", "to", "data-2")) == (0o640, FS_GROUP)
    assert _mode_and_group(os.path.join(paths["sec"], "secret-data")) == (0o440, FS_GROUP)
    for name in ("podname", "secret-data", "data-1"):
        assert _mode_and_group(os.path.join(paths["all"], name)) == (0o440, FS_GROUP), name
    for volume in ("cm", "sec", "all"):
        mode, group = _mode_and_group(paths[volume])
        assert group == FS_GROUP and mode & stat.S_ISGID and mode & 0o050 == 0o050, (volume, oct(mode))
    # An update keeps the ownership on the new files.
    objects.put(_config_map("cfg", **{"data-1": "value-1b", "data-2": "value-2"}))
    await manager.setup_pod(pod)
    assert _mode_and_group(os.path.join(paths["cm"], "data-1")) == (0o440, FS_GROUP)
    await manager.teardown_pod(UID)


async def test_without_fs_group_modes_are_exactly_as_asked(manager, objects):
    paths = await manager.setup_pod(volume_pod(_volumes()))
    assert _mode_and_group(os.path.join(paths["cm"], "data-1")) == (0o440, 0)
    assert _mode_and_group(os.path.join(paths["cm-items"], "path", "to", "data-2")) == (0o600, 0)
    assert _mode_and_group(os.path.join(paths["sec"], "secret-data")) == (0o400, 0)
    assert _mode_and_group(paths["cm"]) == (0o755, 0)
    await manager.teardown_pod(UID)


@pytest.mark.containerd
@pytest.mark.usefixtures("clean_runtime")
async def test_a_non_root_container_in_the_fs_group_reads_every_volume(manager, objects, cri, containerd):
    """uid 1000 with fsGroup 1001 in its groups (what the kubelet's security context adds): it reads the 0440
    files, sees their modes, and the combined projection shows the pod name, the Secret and the ConfigMap."""
    from edgelet.cri import runtime_v1_pb2 as pb

    mount_paths = {"cm": "/etc/cm", "cm-items": "/etc/cm-items", "sec": "/etc/sec", "all": "/all"}
    container = {"name": "main", "image": containerd.image,
                 "volumeMounts": [{"name": n, "mountPath": p} for n, p in mount_paths.items()]}
    pod = volume_pod(_volumes(), [container], securityContext={"fsGroup": FS_GROUP, "runAsUser": USER})
    paths = await manager.setup_pod(pod)
    sandbox_config = sandbox_config_for(manager)
    sandbox_id = await cri.run_pod_sandbox(sandbox_config)
    mounts = manager.mounts_for(pod, container, paths)
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="main"), image=pb.ImageSpec(image=containerd.image),
        command=["sleep", "3600"], mounts=[pb.Mount(**m) for m in mounts], log_path="main/0.log",
        linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
            run_as_user=pb.Int64Value(value=USER), supplemental_groups=[FS_GROUP],
            namespace_options=pb.NamespaceOption(network=pb.POD))))
    os.makedirs(os.path.join(sandbox_config.log_directory, "main"), exist_ok=True)
    container_id = await cri.create_container(sandbox_id, config, sandbox_config)
    await cri.start_container(container_id)

    async def run(script):
        code, out, err = await cri.exec_sync(container_id, ["sh", "-c", script], 10)
        return code, out.decode().strip(), err.decode().strip()

    try:
        assert await run("id -u") == (0, str(USER), "")
        assert await run("cat /etc/cm/data-1; stat -L -c ' %A %g' /etc/cm/data-1") == (
            0, f"value-1 -r--r----- {FS_GROUP}", "")
        assert await run("cat /etc/cm-items/path/to/data-2; stat -L -c ' %A' /etc/cm-items/path/to/data-2") == (
            0, "value-2 -rw-r-----", "")
        assert await run("cat /etc/sec/secret-data; stat -L -c ' %A' /etc/sec/secret-data") == (
            0, "secret-value-1 -r--r-----", "")
        assert await run("cat /all/podname; echo; cat /all/secret-data; echo; cat /all/data-1") == (
            0, "web\nsecret-value-1\nvalue-1", "")
        assert (await run("echo x > /etc/cm/new"))[0] != 0  # read-only, whatever the user
    finally:
        await remove_pod(cri, manager, sandbox_id, container_id)
