"""Volume usage for /stats/summary: measured once a period, and the VolumeStats entry of a pod's claim."""

from __future__ import annotations

import os

from edgelet.kubeletapi.stats import UsageCache, volume_stats


def test_usage_is_measured_again_only_after_the_period():
    now, walks = [0.0], []
    cache = UsageCache(60, clock=lambda: now[0], measure=lambda path: walks.append(path) or (len(walks), 1))
    assert cache.usage("/v") == (1, 1)
    now[0] = 59.9
    assert cache.usage("/v") == (1, 1)
    now[0] = 60.0
    assert cache.usage("/v") == (2, 1)
    cache.forget_except(set())
    assert cache.usage("/v") == (3, 1)


def test_volume_stats_of_a_claim():
    vfs = os.statvfs_result((4096, 4096, 1000, 400, 300, 100, 60, 50, 0, 255))
    assert volume_stats(2_000_000_000, "data", vfs, (8192, 3), ("apps", "queue-broker-0")) == {
        "time": "1970-01-01T00:00:02Z", "availableBytes": 300 * 4096, "capacityBytes": 1000 * 4096,
        "usedBytes": 8192, "inodesFree": 60, "inodes": 100, "inodesUsed": 3, "name": "data",
        "pvcRef": {"name": "queue-broker-0", "namespace": "apps"}}


async def test_a_csi_volume_reports_its_drivers_stats_and_a_directory_is_measured(tmp_path):
    from edgelet.kubeletapi.stats import SummaryProvider
    from edgelet.volumes.manager import ClaimedPath

    (tmp_path / "data").write_bytes(b"x" * 8192)
    asked = []

    async def driver_stats(target):
        asked.append(target)
        return {"availableBytes": 1, "capacityBytes": 3, "usedBytes": 2}

    provider = SummaryProvider(None, node_name="n", root_dir=str(tmp_path), logs_dir=str(tmp_path),
                               csi_volume_stats=driver_stats)
    volumes = await provider._pod_volume_stats([ClaimedPath("csi", "/pods/u/volumes/kubernetes.io~csi/pv/mount",
                                                            "apps", "c1", csi=True),
                                                ClaimedPath("dir", str(tmp_path), "apps", "c2")], 2_000_000_000)
    assert asked == ["/pods/u/volumes/kubernetes.io~csi/pv/mount"]
    assert volumes[0] == {"time": "1970-01-01T00:00:02Z", "availableBytes": 1, "capacityBytes": 3, "usedBytes": 2,
                          "name": "csi", "pvcRef": {"name": "c1", "namespace": "apps"}}
    assert volumes[1]["name"] == "dir" and volumes[1]["usedBytes"] >= 8192 and volumes[1]["pvcRef"]["name"] == "c2"
