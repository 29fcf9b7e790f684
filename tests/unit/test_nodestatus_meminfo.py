"""/proc/meminfo as the agent reads it for the node's memory capacity."""

from __future__ import annotations

import pytest

from edgelet.nodestatus.facts import read_meminfo


@pytest.mark.parametrize(("text", "expected"), [
    ("MemTotal:       24683836 kB\nMemFree:  1 kB\nMemAvailable:   23791228 kB\n",
     (24683836 * 1024, 23791228 * 1024)),
    ("MemTotal: 1048576 kB\n", (1048576 * 1024, 0)),  # kernels before 3.14 have no MemAvailable
    ("MemTotal: 4096\nMemAvailable: 2048\n", (4096, 2048)),  # no unit: bytes
])
def test_read_meminfo(tmp_path, text, expected):
    path = tmp_path / "meminfo"
    path.write_text(text)
    assert read_meminfo(str(path)) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("", "no MemTotal line"),
    ("MemFree: 12 kB\n", "no MemTotal line"),
    ("MemTotal: lots kB\n", "MemTotal is not a number: 'lots'"),
])
def test_read_meminfo_names_the_file_when_it_says_no_size(tmp_path, text, message):
    path = tmp_path / "meminfo"
    path.write_text(text)
    with pytest.raises(ValueError) as raised:
        read_meminfo(str(path))
    assert str(raised.value) == f"{path}: {message}"


def test_read_meminfo_raises_oserror_naming_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError) as raised:
        read_meminfo(str(tmp_path / "absent"))
    assert raised.value.filename == str(tmp_path / "absent")
