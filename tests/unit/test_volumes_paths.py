"""Pure path rules of the volume manager: subPath and key path validation, subPathExpr, hostPath, mountinfo."""

from __future__ import annotations

import pytest

from edgelet.volumes.atomic_writer import FileProjection, clean_payload, path_error
from edgelet.volumes.errors import VolumeError
from edgelet.volumes.mountutil import MountInfo, mounts_under, parse_mountinfo
from edgelet.volumes.plugins import host_path_error
from edgelet.volumes.subpath import expand_subpath_expr, is_within, subpath_error


@pytest.mark.parametrize(
    ("subpath", "error"),
    [
        ("data", None),
        ("a/b/c", None),
        ("a/..b/c", None),
        ("./a", None),
        ("...", None),
        ("/etc", "error SubPath `/etc` must not be an absolute path"),
        ("..", "unable to provision SubPath `..`: must not contain '..'"),
        ("a/../../etc", "unable to provision SubPath `a/../../etc`: must not contain '..'"),
        ("a/..", "unable to provision SubPath `a/..`: must not contain '..'"),
    ],
)
def test_subpath_validation(subpath, error):
    assert subpath_error(subpath) == error


@pytest.mark.parametrize(
    ("expression", "env", "expected"),
    [
        ("$(POD_NAME)", {"POD_NAME": "web-0"}, "web-0"),
        ("logs/$(POD_NAME)/$(NS)", {"POD_NAME": "web-0", "NS": "prod"}, "logs/web-0/prod"),
        ("$$(POD_NAME)", {}, "$(POD_NAME)"),
        ("static", {}, "static"),
    ],
)
def test_subpath_expr_expansion(expression, env, expected):
    assert expand_subpath_expr(expression, env) == expected


def test_subpath_expr_needs_every_variable_set():
    with pytest.raises(VolumeError, match="missing value for EMPTY, NOPE"):
        expand_subpath_expr("$(NOPE)/$(EMPTY)/$(OK)", {"EMPTY": "", "OK": "x"})


@pytest.mark.parametrize(
    ("path", "base", "inside"),
    [("/v", "/v", True), ("/v/a", "/v", True), ("/vx", "/v", False), ("/", "/v", False), ("/v/a", "/", True)],
)
def test_is_within(path, base, inside):
    assert is_within(path, base) is inside


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("key", None),
        ("dir/key", None),
        ("..key", "invalid path: must not start with '..': ..key"),
        ("..", "invalid path: must not contain '..': .."),
        ("a/../b", "invalid path: must not contain '..': a/../b"),
        ("a/..b", None),
        ("/abs", "invalid path: must be relative path: /abs"),
        ("", "invalid path: must not be empty"),
        ("x" * 256, "invalid path: filenames must be less than or equal to 255 characters"),
        ("a/" * 2049, "invalid path: must be less than or equal to 4096 characters"),
    ],
)
def test_payload_path_validation(path, error):
    assert path_error(path) == error


def test_payload_paths_are_normalized_and_may_not_nest_inside_a_file():
    data = FileProjection(b"")
    assert set(clean_payload({"./a//b": data, "c/": data})) == {"a/b", "c"}
    with pytest.raises(VolumeError, match="a/b is inside a, which is a file"):
        clean_payload({"a": data, "a/b": data})
    with pytest.raises(VolumeError, match="names the volume itself"):
        clean_payload({"./": data})


@pytest.mark.parametrize(
    ("path", "error"),
    [("/data", None), ("/var/run/app.sock", None), ("data", "must be absolute"), (None, "must be absolute"),
     ("/data/../etc", "must not contain '..'")],
)
def test_host_path_validation(path, error):
    problem = host_path_error(path)
    assert (problem is None) if error is None else (error in problem)


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /var/lib/edgelet/pods/u1/volumes/kubernetes.io~empty-dir/cache rw,relatime - tmpfs tmpfs rw,size=1024k
41 22 0:36 / /var/lib/edgelet/pods/u1/volumes/kubernetes.io~secret/my\\040secret rw - tmpfs tmpfs rw,mode=755
42 22 8:1 /data/x /var/lib/edgelet/pods/u1/volume-subpaths/data/app/0 rw shared:1 master:2 - ext4 /dev/sda1 rw
43 22 0:37 / /var/lib/edgelet/pods/u10/volumes/kubernetes.io~empty-dir/c rw - tmpfs tmpfs rw
garbage line
"""


def test_mountinfo_parsing_unescapes_paths():
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 5
    assert mounts[2] == MountInfo("/var/lib/edgelet/pods/u1/volumes/kubernetes.io~secret/my secret", "tmpfs",
                                  "tmpfs", "rw,mode=755")
    assert mounts[3].fstype == "ext4" and mounts[3].source == "/dev/sda1"


def test_mounts_under_a_pod_are_listed_deepest_first_and_exclude_lookalike_prefixes():
    under = mounts_under("/var/lib/edgelet/pods/u1", parse_mountinfo(MOUNTINFO))
    assert [m.mount_point.rsplit("/pods/", 1)[1] for m in under] == [
        "u1/volume-subpaths/data/app/0",
        "u1/volumes/kubernetes.io~empty-dir/cache",
        "u1/volumes/kubernetes.io~secret/my secret",
    ]
