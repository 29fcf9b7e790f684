"""Image garbage collection: when the image filesystem passes the high threshold, remove unused images,
least recently used first, until usage falls below the low threshold (the kubelet's defaults: 85 % / 80 %).

`select_images_to_remove` is the pure policy; `ImageGC` feeds it from CRI (ListImages,
ListContainers, ImageFsInfo) and statvfs of the image filesystem's mountpoint.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from edgelet.images import reference
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

DEFAULT_HIGH_THRESHOLD = 85
DEFAULT_LOW_THRESHOLD = 80
DEFAULT_MIN_AGE = 120.0  # seconds
DEFAULT_PERIOD = 300.0  # the kubelet's ImageGCPeriod


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the policy needs of one image: `first_seen` is when GC first detected it (clock seconds)."""

    id: str
    size: int
    pinned: bool = False
    first_seen: float = 0.0


def bytes_to_free(used: int, capacity: int, high: int, low: int) -> int:
    """Bytes to free to get from `used` below `low` percent, or 0 while usage is under `high` percent."""
    if capacity <= 0:
        return 0
    available = capacity - used
    # Integer percent as the kubelet computes it: 100 - floor(available * 100 / capacity).
    usage_percent = 100 - available * 100 // capacity
    if usage_percent < high:
        return 0
    return max(capacity * (100 - low) // 100 - available, 0)


def select_images_to_remove(
    images: Sequence[ImageInfo],
    in_use: Iterable[str],
    last_used: Mapping[str, float],
    usage: int,
    capacity: int,
    high: int,
    low: int,
    now: float,
    min_age: float,
) -> list[ImageInfo]:
    """The images to remove, in removal order; empty when usage is below `high` percent.

    Candidates are neither in use nor pinned and were first seen at least `min_age` seconds ago;
    they go least recently used first (never used counts as oldest), ties by first sight, until
    their sizes add up to what must be freed.
    """
    amount = bytes_to_free(usage, capacity, high, low)
    return take_until(removal_candidates(images, in_use, last_used, now, min_age), amount)


def removal_candidates(
    images: Sequence[ImageInfo], in_use: Iterable[str], last_used: Mapping[str, float], now: float, min_age: float
) -> list[ImageInfo]:
    """Images that may go, in removal order: not in use, not pinned, old enough; least recently used first
    (never used counts as oldest), ties by first sight."""
    busy = set(in_use)
    candidates = [
        image
        for image in images
        if image.id not in busy and not image.pinned and now - image.first_seen >= min_age
    ]
    candidates.sort(key=lambda image: (last_used.get(image.id, 0.0), image.first_seen, image.id))
    return candidates


def take_until(candidates: Sequence[ImageInfo], amount: int) -> list[ImageInfo]:
    """The shortest prefix of `candidates` whose sizes add up to `amount` (all of them if they don't)."""
    selected: list[ImageInfo] = []
    freed = 0
    for image in candidates:
        if freed >= amount:
            break
        selected.append(image)
        freed += image.size
    return selected


def validate_thresholds(high: int, low: int) -> None:
    if not 0 <= high <= 100:
        raise ValueError(f"image GC high threshold {high} must be within 0..100 percent")
    if not 0 <= low <= 100:
        raise ValueError(f"image GC low threshold {low} must be within 0..100 percent")
    if low > high:
        raise ValueError(f"image GC low threshold {low} must not exceed the high threshold {high}")


@dataclass(slots=True)
class GCResult:
    """What one pass saw and did."""

    capacity: int = 0
    used: int = 0
    to_free: int = 0
    removed: list[str] = field(default_factory=list)
    freed: int = 0
    errors: list[str] = field(default_factory=list)


class ImageGC:
    """Detects images and their use; removes unused ones when the image filesystem fills up.

    `pinned_images` names images never to remove (such as those of the air-gap directory): refs or
    ids, or a callable returning them at each pass. Images the runtime marks pinned and the
    runtime's sandbox image are kept too.
    """

    def __init__(
        self,
        runtime,
        *,
        high: int = DEFAULT_HIGH_THRESHOLD,
        low: int = DEFAULT_LOW_THRESHOLD,
        min_age: float = DEFAULT_MIN_AGE,
        pinned_images: Iterable[str] | Callable[[], Iterable[str]] = (),
        clock: Callable[[], float] = time.monotonic,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
        period: float = DEFAULT_PERIOD,
    ):
        validate_thresholds(high, low)
        self._runtime = runtime
        self.high = high
        self.low = low
        self.min_age = min_age
        self._pinned = pinned_images if callable(pinned_images) else frozenset(pinned_images)
        self._clock = clock
        self._statvfs = statvfs
        self.period = period
        self._first_seen: dict[str, float] = {}
        self._last_used: dict[str, float] = {}

    async def sandbox_image(self) -> str | None:
        """The runtime's sandbox (pause) image, from CRI Status(verbose) as containerd reports it.

        Runtimes before containerd 1.7 do not mark it pinned, and no container lists it as its
        image, so without this it would look unused. containerd 2.x names it no longer here (None) but
        pins it.
        """
        try:
            status = await self._runtime.status(verbose=True)
            config = orjson.loads(status.info.get("config") or "{}")
        except (EdgeletError, orjson.JSONDecodeError) as err:
            log.debug("image GC: no sandbox image from the runtime status: %s", err)
            return None
        image = config.get("sandboxImage") if isinstance(config, dict) else None
        return image if isinstance(image, str) and image else None

    async def _pinned_names(self) -> set[str]:
        names = list(self._pinned() if callable(self._pinned) else self._pinned)
        sandbox_image = await self.sandbox_image()
        if sandbox_image:
            names.append(sandbox_image)
        result = set()
        for name in names:
            result.add(name)
            if name.startswith("sha256:"):
                continue  # an image id, not a name
            try:
                result.add(reference.normalize(name))
            except reference.InvalidReference:
                log.warning("image GC: pinned image %r is not a valid image reference", name)
        return result

    async def detect(self) -> tuple[list[ImageInfo], set[str]]:
        """Lists images and containers; records first sight and last use. Returns (images, ids in use)."""
        now = self._clock()
        images = await self._runtime.list_images()
        containers = await self._runtime.list_containers()
        pinned_names = await self._pinned_names()
        by_name: dict[str, str] = {}
        for image in images:
            for name in (image.id, *image.repo_tags, *image.repo_digests):
                by_name[name] = image.id
        in_use: set[str] = set()
        for container in containers:
            for name in (container.image_ref, container.image_id, container.image.image):
                if name in by_name:
                    in_use.add(by_name[name])
        infos = []
        for image in images:
            self._first_seen.setdefault(image.id, now)
            if image.id in in_use:
                self._last_used[image.id] = now
            names = {image.id, *image.repo_tags, *image.repo_digests}
            pinned = image.pinned or not names.isdisjoint(pinned_names)
            infos.append(ImageInfo(image.id, image.size, pinned, self._first_seen[image.id]))
        present = {image.id for image in images}
        for forgotten in set(self._first_seen) - present:
            self._first_seen.pop(forgotten, None)
            self._last_used.pop(forgotten, None)
        return infos, in_use

    async def filesystem_usage(self) -> tuple[int, int]:
        """(used bytes, capacity bytes) of the filesystem holding the runtime's images."""
        info = await self._runtime.image_fs_info()
        if not info.image_filesystems:
            raise EdgeletError("image GC: the runtime reported no image filesystem (ImageFsInfo)")
        mountpoint = info.image_filesystems[0].fs_id.mountpoint
        try:
            stats = await asyncio.to_thread(self._statvfs, mountpoint)
        except OSError as err:
            raise EdgeletError(f"image GC: statvfs {mountpoint!r} of the image filesystem: {err}") from None
        capacity = stats.f_blocks * stats.f_frsize
        available = stats.f_bavail * stats.f_frsize
        return capacity - available, capacity

    async def collect(self) -> GCResult:
        """One pass: detect, decide with `select_images_to_remove`, remove. Removal errors are reported, not raised."""
        images, in_use = await self.detect()
        used, capacity = await self.filesystem_usage()
        result = GCResult(capacity=capacity, used=used, to_free=bytes_to_free(used, capacity, self.high, self.low))
        chosen = select_images_to_remove(
            images, in_use, self._last_used, used, capacity, self.high, self.low, self._clock(), self.min_age
        )
        await self._remove(chosen, result)
        if result.to_free and result.freed < result.to_free:
            log.warning(
                "image GC: wanted to free %d bytes, but only %d bytes of images could be removed",
                result.to_free,
                result.freed,
            )
        return result

    async def free_space(self, amount: int) -> int:
        """Removes unused images, least recently used first, until `amount` bytes are freed (for eviction's
        node-level reclaim). Returns the bytes freed."""
        images, in_use = await self.detect()
        chosen = take_until(removal_candidates(images, in_use, self._last_used, self._clock(), self.min_age), amount)
        result = GCResult(to_free=amount)
        await self._remove(chosen, result)
        return result.freed

    async def _remove(self, chosen: Sequence[ImageInfo], result: GCResult) -> None:
        for image in chosen:
            try:
                await self._runtime.remove_image(image.id)
            except EdgeletError as err:
                result.errors.append(f"{image.id}: {err}")
                log.warning("image GC: removing %s failed: %s", image.id, err)
                continue
            result.removed.append(image.id)
            result.freed += image.size
            self._first_seen.pop(image.id, None)
            self._last_used.pop(image.id, None)
            log.info("image GC: removed %s (%d bytes)", image.id, image.size)

    async def run(self) -> None:
        """Detects once at start (so first-seen times begin early), then collects every `period` seconds."""
        while True:
            try:
                await self.detect()
                break
            except EdgeletError as err:
                log.warning("image GC: detecting images failed: %s", err)
                await asyncio.sleep(self.period)
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.collect()
            except EdgeletError as err:
                log.warning("image GC: pass failed: %s", err)
