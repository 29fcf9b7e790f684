"""The volume manager against the real kernel (root): tmpfs and bind mounts seen in /proc/self/mountinfo,
hostPath type checks on real files, sockets and devices, secret file modes, and safe teardown.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import stat

import pytest

from edgelet.volumes import VolumeError, VolumeManager, subpath
from edgelet.volumes.hosts import pod_hosts_file
from edgelet.volumes.mountutil import mounts_under, read_mounts, remove_tree
from edgelet.volumes.plugins import mount_tmpfs
from tests.integration.volumes.harness import UID, mount_at, remove_pod, sandbox_config_for, secret_object, volume_pod

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")


# -- the pod directory -----------------------------------------------------------------------------


async def test_a_pod_without_volumes_is_set_up_without_a_thread_hop(manager, monkeypatch):
    """Nothing to lay out: set-up returns at once, and the pod's directory comes with its first file."""
    def no_thread(*args, **kwargs):
        raise AssertionError("a pod without volumes must cost its sync no thread hop")

    monkeypatch.setattr(asyncio, "to_thread", no_thread)
    assert await manager.setup_pod(volume_pod([])) == {}
    assert not os.path.exists(manager.pod_dir(UID))


async def test_a_pod_gets_its_directories_again_after_a_teardown(manager):
    pod = volume_pod([{"name": "scratch", "emptyDir": {}}])
    scratch = manager.volume_dir(UID, "emptyDir", "scratch")
    for _ in range(2):
        assert await manager.setup_pod(pod) == {"scratch": scratch}
        assert os.path.isdir(scratch)
        await manager.teardown_pod(UID)
        assert not os.path.exists(manager.pod_dir(UID))
    assert await manager.setup_pod(pod) == {"scratch": scratch}
    assert os.path.isdir(scratch)


async def test_a_teardown_that_waited_for_a_set_up_is_not_forgotten(manager):
    """A teardown asked for while the pod's set-up runs goes after it; the next set-up then lays the pod out
    again rather than taking it for done."""
    pod = volume_pod([{"name": "scratch", "emptyDir": {}}])
    await asyncio.gather(manager.setup_pod(pod), manager.teardown_pod(UID))
    assert not os.path.exists(manager.pod_dir(UID))
    await manager.setup_pod(pod)
    assert os.path.isdir(manager.volume_dir(UID, "emptyDir", "scratch"))


# -- emptyDir --------------------------------------------------------------------------------------

async def test_memory_empty_dir_is_a_sized_tmpfs_until_teardown(manager):
    pod = volume_pod([{"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                     {"name": "scratch", "emptyDir": {}}])
    paths = await manager.setup_pod(pod)
    cache = paths["cache"]
    assert cache.endswith(f"/pods/{UID}/volumes/kubernetes.io~empty-dir/cache")
    entry = mount_at(cache)
    assert entry is not None and entry.fstype == "tmpfs" and "size=1024k" in entry.super_options
    with pytest.raises(OSError) as caught:
        with open(os.path.join(cache, "big"), "wb") as stream:
            stream.write(b"x" * (2 << 20))
    assert caught.value.errno == errno.ENOSPC
    assert stat.S_IMODE(os.stat(paths["scratch"]).st_mode) == 0o777 and mount_at(paths["scratch"]) is None

    await manager.setup_pod(pod)  # a second sync must not stack another tmpfs
    assert sum(m.mount_point == cache for m in read_mounts()) == 1

    await manager.teardown_pod(UID)
    assert mount_at(cache) is None
    assert not os.path.exists(manager.pod_dir(UID))


async def test_memory_size_defaults_to_the_pod_limit_then_node_allocatable(manager):
    pod = volume_pod([{"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
                    containers=[{"name": "app", "resources": {"limits": {"memory": "2Mi"}}}])
    paths = await manager.setup_pod(pod)
    assert "size=2048k" in mount_at(paths["cache"]).super_options
    await manager.teardown_pod(UID)
    paths = await manager.setup_pod(volume_pod([{"name": "cache", "emptyDir": {"medium": "Memory"}}]))
    assert "size=524288k" in mount_at(paths["cache"]).super_options
    await manager.teardown_pod(UID)


async def test_unsized_tmpfs_is_mounted_once_across_syncs(root):
    manager = VolumeManager(os.path.join(root, "pods"))  # no allocatable, no limits: kernel default size
    pod = volume_pod([{"name": "cache", "emptyDir": {"medium": "Memory"}}])
    for _ in range(3):
        paths = await manager.setup_pod(pod)
    assert sum(m.mount_point == paths["cache"] for m in read_mounts()) == 1
    await manager.teardown_pod(UID)
    assert not mounts_under(root)


# -- hostPath --------------------------------------------------------------------------------------

def _block_device():
    for entry in os.scandir("/dev"):
        if stat.S_ISBLK(entry.stat(follow_symlinks=False).st_mode):
            return entry.path
    return None


@pytest.fixture
def host_files(root):
    files = {"dir": os.path.join(root, "data"), "file": os.path.join(root, "data", "file.txt"),
             "socket": os.path.join(root, "app.sock"), "char": "/dev/null", "block": _block_device()}
    os.mkdir(files["dir"])
    with open(files["file"], "w") as stream:
        stream.write("host data")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(files["socket"])
    yield files
    listener.close()


@pytest.mark.parametrize(
    ("kind", "path_type", "problem"),
    [
        ("dir", "Directory", None), ("dir", "", None), ("file", "", None),
        ("file", "File", None), ("socket", "Socket", None), ("char", "CharDevice", None),
        ("block", "BlockDevice", None), ("dir", "DirectoryOrCreate", None), ("file", "FileOrCreate", None),
        ("file", "Directory", "is not a directory"), ("dir", "File", "is not a file"),
        ("dir", "Socket", "is not a socket file"), ("file", "CharDevice", "is not a character device"),
        ("char", "BlockDevice", "is not a block device"), ("socket", "File", "is not a file"),
        ("dir", "FileOrCreate", "is not a file"), ("file", "DirectoryOrCreate", "is not a directory"),
        ("dir", "Fancy", "Fancy is an invalid volume type"),
    ],
)
async def test_host_path_types(manager, host_files, kind, path_type, problem):
    path = host_files[kind]
    if path is None:
        pytest.skip("no block device on this machine")
    pod = volume_pod([{"name": "host", "hostPath": {"path": path, "type": path_type}}])
    if problem is None:
        assert await manager.setup_pod(pod) == {"host": path}
    else:
        with pytest.raises(VolumeError) as caught:
            await manager.setup_pod(pod)
        assert 'volume "host" : ' in caught.value.message
        assert problem in caught.value.message
        if "invalid" not in problem:
            assert f"hostPath type check failed: {path} {problem}" in caught.value.message


async def test_host_path_or_create_types_create_what_is_missing(manager, root):
    directory = os.path.join(root, "new", "deep")
    file = os.path.join(root, "made.txt")
    pod = volume_pod([{"name": "d", "hostPath": {"path": directory, "type": "DirectoryOrCreate"}},
                     {"name": "f", "hostPath": {"path": file, "type": "FileOrCreate"}},
                     {"name": "missing", "hostPath": {"path": os.path.join(root, "nope"), "type": "Directory"}},
                     {"name": "orphan",
                      "hostPath": {"path": os.path.join(root, "no", "parent"), "type": "FileOrCreate"}}])
    with pytest.raises(VolumeError) as caught:
        await manager.setup_pod(pod)
    assert os.path.isdir(directory) and os.path.isfile(file)
    assert f"{root}/nope is not a directory" in caught.value.message
    assert f"cannot create {root}/no/parent" in caught.value.message  # parents of a file are never created


# -- file-backed volumes ---------------------------------------------------------------------------

async def test_secret_files_modes_and_memory_backing(manager, store):
    store.put(secret_object("tls", **{"tls.key": b"KEY", "tls.crt": b"CRT"}))
    pod = volume_pod([{"name": "tls", "secret": {"secretName": "tls", "defaultMode": 0o400,
                                            "items": [{"key": "tls.key", "path": "private/key"},
                                                      {"key": "tls.crt", "path": "cert", "mode": 0o644}]}}])
    path = (await manager.setup_pod(pod))["tls"]
    assert path.endswith("/volumes/kubernetes.io~secret/tls")
    entry = mount_at(path)
    assert entry is not None and entry.fstype == "tmpfs"
    assert open(os.path.join(path, "private", "key"), "rb").read() == b"KEY"
    assert stat.S_IMODE(os.stat(os.path.join(path, "private", "key")).st_mode) == 0o400
    assert stat.S_IMODE(os.stat(os.path.join(path, "cert")).st_mode) == 0o644
    assert os.readlink(os.path.join(path, "cert")) == "..data/cert"
    await manager.teardown_pod(UID)
    assert mount_at(path) is None


async def test_secret_updates_are_published_on_the_next_sync(manager, store):
    store.put(secret_object("app", user=b"admin", password=b"one"))
    pod = volume_pod([{"name": "creds", "secret": {"secretName": "app"}}])
    path = (await manager.setup_pod(pod))["creds"]
    store.put(secret_object("app", password=b"two", token=b"t"))
    await manager.setup_pod(pod)
    assert sorted(n for n in os.listdir(path) if not n.startswith("..")) == ["password", "token"]
    assert open(os.path.join(path, "password"), "rb").read() == b"two"
    assert stat.S_IMODE(os.stat(os.path.join(path, "token")).st_mode) == 0o644
    assert len([n for n in os.listdir(path) if n.startswith("..2")]) == 1
    await manager.teardown_pod(UID)


async def test_fs_group_owns_the_files(manager, store):
    store.put(secret_object("app", key=b"k"))
    pod = volume_pod([{"name": "creds", "secret": {"secretName": "app", "defaultMode": 0o400}},
                     {"name": "work", "emptyDir": {}}], securityContext={"fsGroup": 2000})
    paths = await manager.setup_pod(pod)
    info = os.stat(os.path.join(paths["creds"], "key"))
    assert info.st_gid == 2000 and stat.S_IMODE(info.st_mode) == 0o440
    work = os.stat(paths["work"])
    assert work.st_gid == 2000 and work.st_mode & stat.S_ISGID
    await manager.teardown_pod(UID)


async def test_config_map_lives_on_disk_and_missing_sources_are_reported_per_volume(manager, store):
    store.put({"kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"app.conf": "x=1"}})
    pod = volume_pod([{"name": "cfg", "configMap": {"name": "cfg"}},
                     {"name": "gone", "configMap": {"name": "app-config"}},
                     {"name": "maybe", "secret": {"secretName": "nope", "optional": True}},
                     {"name": "labels", "downwardAPI": {"items": [{"path": "name",
                                                              "fieldRef": {"fieldPath": "metadata.name"}}]}},
                     {"name": "nfs", "nfs": {"server": "nas", "path": "/export"}}])
    with pytest.raises(VolumeError) as caught:
        await manager.setup_pod(pod)
    assert caught.value.message == (
        'MountVolume.SetUp failed for volume "gone" : configmap "app-config" not found; '
        'MountVolume.SetUp failed for volume "nfs" : volume type nfs is not supported on this node')
    cfg = manager.volume_dir(UID, "configMap", "cfg")
    assert open(os.path.join(cfg, "app.conf")).read() == "x=1" and mount_at(cfg) is None
    labels = manager.volume_dir(UID, "downwardAPI", "labels")
    assert open(os.path.join(labels, "name")).read() == "web" and mount_at(labels).fstype == "tmpfs"
    optional = os.listdir(manager.volume_dir(UID, "secret", "maybe"))
    assert "..data" in optional and all(name.startswith("..") for name in optional)  # present, empty
    await manager.teardown_pod(UID)
    assert not os.path.exists(manager.pod_dir(UID))


# -- container mounts ------------------------------------------------------------------------------

async def test_mounts_for_a_container(manager, store):
    store.put(secret_object("app", key=b"k"))
    container = {"name": "app", "terminationMessagePath": "/tmp/msg", "volumeMounts": [
        {"name": "work", "mountPath": "/work"},
        {"name": "creds", "mountPath": "/creds"},
        {"name": "work", "mountPath": "/logs", "readOnly": True, "mountPropagation": "HostToContainer"}]}
    pod = volume_pod([{"name": "work", "emptyDir": {}}, {"name": "creds", "secret": {"secretName": "app"}}],
                     [container])
    paths = await manager.setup_pod(pod)
    mounts = manager.mounts_for(pod, container, paths, pod_ips=["10.88.0.9"])
    pod_dir = manager.pod_dir(UID)
    assert mounts[:4] == [
        {"container_path": "/work", "host_path": paths["work"], "readonly": False, "propagation": 0,
         "selinux_relabel": False},
        {"container_path": "/creds", "host_path": paths["creds"], "readonly": True, "propagation": 0,
         "selinux_relabel": False},
        {"container_path": "/logs", "host_path": paths["work"], "readonly": True, "propagation": 1,
         "selinux_relabel": False},
        {"container_path": "/etc/hosts", "host_path": f"{pod_dir}/etc-hosts", "readonly": False,
         "propagation": 0, "selinux_relabel": False},
    ]
    assert "10.88.0.9\tweb\n" in open(f"{pod_dir}/etc-hosts").read()
    log_mount = mounts[4]
    assert log_mount["container_path"] == "/tmp/msg"
    assert os.path.dirname(log_mount["host_path"]) == f"{pod_dir}/containers/app"
    assert stat.S_IMODE(os.stat(log_mount["host_path"]).st_mode) == 0o666
    again = manager.mounts_for(pod, container, paths, pod_ips=["10.88.0.9"])
    assert again[4]["host_path"] != log_mount["host_path"]  # a restart gets a fresh file
    manager.prune_termination_logs(UID, "app", keep=[again[4]["host_path"]])
    assert os.listdir(f"{pod_dir}/containers/app") == [os.path.basename(again[4]["host_path"])]
    await manager.teardown_pod(UID)


async def test_containers_of_one_pod_prepared_at_once_each_get_the_whole_hosts_file(manager):
    """The runtime manager prepares each container's mounts in a thread, a pod's containers in parallel: their
    writes of the pod's one hosts file take turns, so none fails and none mounts half a file."""
    containers = [{"name": f"app{i}"} for i in range(6)]
    pod = volume_pod([], containers)
    paths = await manager.setup_pod(pod)
    hosts = os.path.join(manager.pod_dir(UID), "etc-hosts")
    for round_ in range(20):
        pod_ips = [f"10.88.{round_}.9"]  # a new address each round: every container finds the file to rewrite
        mounts = await asyncio.gather(*(asyncio.to_thread(manager.mounts_for, pod, c, paths, pod_ips=pod_ips)
                                        for c in containers))
        assert all(m[0]["host_path"] == hosts for m in mounts)
        assert open(hosts).read() == pod_hosts_file(pod, pod_ips, manager.cluster_domain, None)
    await manager.teardown_pod(UID)


async def test_no_hosts_mount_before_the_pod_has_an_ip_or_when_the_container_brings_its_own(manager):
    container = {"name": "app", "volumeMounts": [{"name": "work", "mountPath": "/etc/hosts", "subPath": "hosts"}]}
    pod = volume_pod([{"name": "work", "emptyDir": {}}], [container])
    paths = await manager.setup_pod(pod)
    assert [m["container_path"] for m in manager.mounts_for(pod, {"name": "app"}, paths)] == ["/dev/termination-log"]
    mounts = manager.mounts_for(pod, container, paths, pod_ips=["10.88.0.9"])
    assert [m["container_path"] for m in mounts] == ["/etc/hosts", "/dev/termination-log"]
    with pytest.raises(VolumeError, match='cannot find volume "ghost" to mount into container "app"'):
        manager.mounts_for(pod, {"name": "app", "volumeMounts": [{"name": "ghost", "mountPath": "/g"}]}, paths)
    await manager.teardown_pod(UID)


async def test_sub_paths_are_bind_mounted_and_cannot_escape(manager, root):
    container = {"name": "app", "volumeMounts": [
        {"name": "work", "mountPath": "/data", "subPath": "pods/$(ignored)"},
        {"name": "work", "mountPath": "/mine", "subPathExpr": "pods/$(POD_NAME)"}]}
    pod = volume_pod([{"name": "work", "emptyDir": {}}], [container])
    paths = await manager.setup_pod(pod)
    mounts = manager.mounts_for(pod, container, paths, env=[("POD_NAME", "web")])
    first, second = mounts[0]["host_path"], mounts[1]["host_path"]
    assert first == f"{manager.pod_dir(UID)}/volume-subpaths/work/app/0"
    assert mount_at(first) is not None and mount_at(second) is not None
    assert os.path.isdir(os.path.join(paths["work"], "pods", "web"))  # created with the volume's mode
    assert stat.S_IMODE(os.stat(os.path.join(paths["work"], "pods", "web")).st_mode) == 0o777
    with open(os.path.join(second, "seen"), "w") as stream:
        stream.write("through the bind mount")
    assert open(os.path.join(paths["work"], "pods", "web", "seen")).read() == "through the bind mount"
    manager.mounts_for(pod, container, paths, env=[("POD_NAME", "web")])  # a restart reuses the mounts
    assert sum(m.mount_point == first for m in read_mounts()) == 1

    secret_dir = os.path.join(root, "host-secret")
    os.mkdir(secret_dir)
    os.symlink(secret_dir, os.path.join(paths["work"], "escape"))
    os.symlink("pods", os.path.join(paths["work"], "inside"))
    inside = {"name": "other", "volumeMounts": [{"name": "work", "mountPath": "/i", "subPath": "inside/web"}]}
    through_link = manager.mounts_for(pod, inside, paths)[0]["host_path"]  # a symlink that stays inside is fine
    assert through_link.endswith("/volume-subpaths/work/other/0")
    assert open(os.path.join(through_link, "seen")).read() == "through the bind mount"
    for sub_path, message in [("escape", "leads outside its volume"), ("escape/new", "leads outside its volume"),
                              ("../../etc", "must not contain '..'"), ("/etc", "must not be an absolute path")]:
        bad = {"name": "bad", "volumeMounts": [{"name": "work", "mountPath": "/x", "subPath": sub_path}]}
        with pytest.raises(VolumeError, match=message):
            manager.mounts_for(pod, bad, paths)
    assert os.listdir(secret_dir) == []
    with pytest.raises(VolumeError, match="missing value for POD_NAME"):
        manager.mounts_for(pod, container, paths)

    await manager.teardown_pod(UID)
    assert not mounts_under(manager.pods_dir)
    assert os.path.isdir(secret_dir)


async def test_a_symlink_swapped_in_after_the_check_is_still_refused(manager, root, monkeypatch):
    """The race the bind mount closes: path checks pass, then a component becomes a symlink."""
    container = {"name": "app", "volumeMounts": [{"name": "work", "mountPath": "/x", "subPath": "escape"},
                                                 {"name": "work", "mountPath": "/y", "subPath": "escape/sub"}]}
    pod = volume_pod([{"name": "work", "emptyDir": {}}], [container])
    paths = await manager.setup_pod(pod)
    outside = os.path.join(root, "outside")
    os.makedirs(os.path.join(outside, "sub"))
    os.symlink(outside, os.path.join(paths["work"], "escape"))
    monkeypatch.setattr(subpath.os.path, "realpath", os.path.abspath)  # the check sees no symlink
    for index in range(2):
        single = {"name": "app", "volumeMounts": [container["volumeMounts"][index]]}
        with pytest.raises(VolumeError, match="cannot prepare subPath"):
            manager.mounts_for(pod, single, paths)
    assert not mounts_under(manager.pods_dir)
    monkeypatch.undo()
    await manager.teardown_pod(UID)


async def test_teardown_never_deletes_host_path_data(manager, host_files):
    container = {"name": "app", "volumeMounts": [{"name": "host", "mountPath": "/f", "subPath": "file.txt"},
                                                 {"name": "host", "mountPath": "/d", "subPath": "."}]}
    pod = volume_pod([{"name": "host", "hostPath": {"path": host_files["dir"], "type": "Directory"}}], [container])
    paths = await manager.setup_pod(pod)
    mounts = manager.mounts_for(pod, container, paths)
    assert open(mounts[0]["host_path"]).read() == "host data"
    await manager.teardown_pod(UID)
    assert open(host_files["file"]).read() == "host data"
    assert not os.path.exists(manager.pod_dir(UID))


def _bound_claim(store, name, pv_source, **pv_spec):
    store.put({"kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default", "uid": f"u-{name}"},
               "spec": {"volumeName": f"pv-{name}"}, "status": {"phase": "Bound"}})
    store.put({"kind": "PersistentVolume", "metadata": {"name": f"pv-{name}"},
               "spec": {**pv_source, **pv_spec,
                        "claimRef": {"namespace": "default", "name": name, "uid": f"u-{name}"}}})


async def test_a_local_claim_is_bind_mounted_with_its_fs_group_and_torn_down_without_its_data(manager, store, root):
    data = os.path.join(root, "disk")
    os.makedirs(os.path.join(data, "sub"))
    with open(os.path.join(data, "sub", "kept"), "w") as stream:
        stream.write("kept")
    _bound_claim(store, "data", {"local": {"path": data}})
    _bound_claim(store, "view", {"local": {"path": data}})
    pod = volume_pod([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "view", "persistentVolumeClaim": {"claimName": "view", "readOnly": True}}],
               [{"name": "app", "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                                 {"name": "view", "mountPath": "/view", "subPath": "sub"}]}],
               securityContext={"fsGroup": 3456, "fsGroupChangePolicy": "OnRootMismatch"})
    paths = await manager.setup_pod(pod)
    target = manager.volume_dir(UID, "local", "pv-data")
    assert paths["data"] == target and mount_at(target) is not None
    assert os.stat(os.path.join(data, "sub", "kept")).st_gid == 3456  # the first mount gave the group
    assert "ro" in _mount_options(manager.volume_dir(UID, "local", "pv-view"))
    mounts = manager.mounts_for(pod, pod["spec"]["containers"][0], paths)
    assert [(m["container_path"], m["readonly"]) for m in mounts[:2]] == [("/data", False), ("/view", True)]
    # Resolved once per pod: a claim deleted under a running pod leaves its mount in place.
    store.delete("PersistentVolumeClaim", "default", "data")
    os.chown(os.path.join(data, "sub", "kept"), -1, 0)
    assert await manager.setup_pod(pod) == paths
    assert os.stat(os.path.join(data, "sub", "kept")).st_gid == 0  # mounted already: no second ownership pass
    await manager.teardown_pod(UID)
    assert not mounts_under(manager.pods_dir)
    assert open(os.path.join(data, "sub", "kept")).read() == "kept"
    with pytest.raises(VolumeError, match='persistentvolumeclaims "data" not found'):
        await manager.setup_pod(pod)


def _mount_options(path):
    with open("/proc/self/mountinfo") as stream:
        for line in stream:
            fields = line.split()
            if fields[4] == path:
                return fields[5].split(",")
    return []


def test_remove_tree_refuses_to_cross_into_a_mount(root):
    victim = os.path.join(root, "victim")
    mounted = os.path.join(victim, "mnt")
    os.makedirs(mounted)
    mount_tmpfs(mounted, 1 << 20)
    with open(os.path.join(mounted, "precious"), "w") as stream:
        stream.write("keep me")
    with pytest.raises(VolumeError, match="another filesystem is mounted there"):
        remove_tree(victim)
    assert open(os.path.join(mounted, "precious")).read() == "keep me"


async def test_teardown_of_an_unknown_pod_is_a_no_op(manager):
    await manager.teardown_pod("never-seen")
    with pytest.raises(VolumeError, match="cannot be used as a directory name"):
        await manager.teardown_pod("../etc")


# -- what a container sees -------------------------------------------------------------------------

@pytest.mark.containerd
@pytest.mark.usefixtures("clean_runtime")
async def test_a_container_sees_env_mounts_and_resources_as_built(manager, store, cri, containerd):
    """The CRI fields built here, handed to the real containerd: what runs inside must match."""
    from edgelet.api.env import expand_command, resolve_env
    from edgelet.api.resources import linux_resources
    from edgelet.cri import runtime_v1_pb2 as pb

    store.put(secret_object("app", password=b"hunter2"))
    store.put({"kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"greeting": "hello", "motd": "welcome"}})
    container = {
        "name": "main", "image": containerd.image,
        "command": ["sh", "-c", "$(SCRIPT)"],
        "env": [{"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
                {"name": "SCRIPT", "value": "echo $(GREETING) > /work/started; exec sleep 3600"}],
        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}},
        "volumeMounts": [{"name": "work", "mountPath": "/work"},
                         {"name": "creds", "mountPath": "/creds"},
                         {"name": "cfg", "mountPath": "/etc/motd", "subPath": "motd"}],
    }
    pod = volume_pod([{"name": "work", "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}},
                     {"name": "creds", "secret": {"secretName": "app", "defaultMode": 0o440}},
                     {"name": "cfg", "configMap": {"name": "cfg"}}], [container])
    paths = await manager.setup_pod(pod)

    sandbox_config = sandbox_config_for(manager)
    sandbox_id = await cri.run_pod_sandbox(sandbox_config)
    pod_ip = (await cri.pod_sandbox_status(sandbox_id)).status.network.ip
    env = resolve_env(pod, container, store=store, pod_ip=pod_ip)
    command, args = expand_command(container, env)
    mounts = manager.mounts_for(pod, container, paths, env=env, pod_ips=[pod_ip])
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="main"), image=pb.ImageSpec(image=containerd.image),
        command=command, args=args, envs=[pb.KeyValue(key=k, value=v) for k, v in env],
        mounts=[pb.Mount(**m) for m in mounts], log_path="main/0.log",
        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(**linux_resources(pod, container))))
    os.makedirs(os.path.join(sandbox_config.log_directory, "main"), exist_ok=True)
    container_id = await cri.create_container(sandbox_id, config, sandbox_config)
    await cri.start_container(container_id)

    async def run(*cmd):
        code, out, err = await cri.exec_sync(container_id, ["sh", "-c", *cmd], 10)
        return code, out.decode().strip(), err.decode()

    try:
        assert await run("cat /work/started") == (0, "hello", "")
        assert await run("cat /creds/password") == (0, "hunter2", "")
        assert (await run("echo x > /creds/new"))[0] != 0  # secrets are mounted read-only
        assert await run("cat /etc/motd") == (0, "welcome", "")
        assert (await run("cat /etc/hosts"))[1].endswith(f"{pod_ip}\tweb")
        assert (await run("echo finished > /dev/termination-log"))[0] == 0
        assert open(mounts[-1]["host_path"]).read() == "finished\n"
        if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # cgroup v2
            expected = ("memory.max", "67108864"), ("cpu.max", "50000 100000"), ("memory.oom.group", "1")
        else:
            expected = (("memory/memory.limit_in_bytes", "67108864"), ("cpu/cpu.cfs_quota_us", "50000"),
                        ("cpu/cpu.cfs_period_us", "100000"), ("cpu/cpu.shares", "102"))
        for name, value in expected:
            assert await run(f"cat /sys/fs/cgroup/{name}") == (0, value, ""), name
        assert (await run("head -c 5M /dev/zero > /work/big"))[0] != 0  # the tmpfs holds 4 MiB
    finally:
        await remove_pod(cri, manager, sandbox_id, container_id)
