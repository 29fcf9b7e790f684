"""The air-gap images directory: image archives dropped into it are imported into the runtime at start and
when added, so a device without any registry can run pods.

edgelet speaks to the runtime only through CRI, which has no import call. So the archives are served
read-only as a registry on loopback (`edgelet.images.registry`) and pulled with CRI PullImage: the
image a pod names `example.local/app:1.0` is pulled as `127.0.0.1:PORT/example.local/app:1.0`.
The runtime knows it under that name only, so the image id each archive name was pulled as is
checkpointed per archive under the state directory; the image manager answers presence checks for
the pod's name with it and creates containers by image id.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from edgelet.cri import RuntimeUnavailable
from edgelet.images import reference
from edgelet.podconfig.inotify import (
    IN_CLOSE_WRITE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    Inotify,
)
from edgelet.util.checkpoint import CheckpointStore
from edgelet.util.errors import EdgeletError, PermanentError, TemporaryError
from edgelet.util.tasks import wait_set

if TYPE_CHECKING:  # the archive reader and the registry load only once an archive shows up
    from edgelet.images.archive import ArchiveIndex, ArchiveSource, Blob
    from edgelet.images.registry import Opener, RegistryServer

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 5.0
# While inotify watches the directory, or the directory does not exist (no air-gap images on this node), a pass every
# this many seconds is the safety net, as the manifest directory's rescan is; `poll_interval` is for a directory
# that exists with no watch on it. A pass that finds the directory made since watches it from then on.
WATCHED_POLL_INTERVAL = 20.0
# A file that changed within this many seconds may still be being copied in; it waits.
DEFAULT_SETTLE = 2.0
CHECKPOINT_KIND = "airgap-archive"
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst")
_WATCH_MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF


def is_archive_name(name: str) -> bool:
    """Files the directory imports: tars, plain or compressed; dot-files are in-progress copies."""
    return not name.startswith(".") and name.endswith(ARCHIVE_SUFFIXES)


class AirgapError(PermanentError):
    """The air-gap directory does not provide the image, or its archive cannot be used."""


@dataclass(slots=True)
class _Record:
    """What is checkpointed per archive: the file it was read from and the image id of each name."""

    signature: tuple[int, int]  # (size, mtime_ns)
    images: dict[str, str] = field(default_factory=dict)  # normalized name -> image id ("" until pulled)

    def encode(self) -> bytes:
        return orjson.dumps({"signature": list(self.signature), "images": self.images})

    @classmethod
    def decode(cls, payload: bytes) -> _Record:
        """Raises ValueError (InvalidReference is one), AttributeError, KeyError or TypeError on a malformed record."""
        data = orjson.loads(payload)
        size, mtime_ns = data["signature"]
        images = {str(key): str(image_id) for key, image_id in data["images"].items()}
        for key in images:
            reference.parse(key)
        return cls((int(size), int(mtime_ns)), images)


def mirror_repository(ref: reference.ImageReference) -> str:
    """The repository path under the loopback registry: the original domain becomes the first component."""
    domain = re.sub(r"[^a-z0-9.-]+", "_", ref.domain.lower()).strip("_.-") or "registry"
    return f"{domain}/{ref.path}"


class AirgapImages:
    """Imports the archives of `directory` into the runtime and pulls their images on demand.

    `state_dir` holds the per-archive checkpoints and, briefly, decompressed copies of compressed
    archives. The loopback registry listens on `host:port` (port 0 picks one at start; a fixed port
    keeps the runtime's image names stable across restarts).
    """

    def __init__(
        self,
        runtime,
        directory: str,
        state_dir: str,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        settle: float = DEFAULT_SETTLE,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._runtime = runtime
        self.directory = directory
        self._cache_dir = os.path.join(state_dir, "cache")
        self._checkpoints = CheckpointStore(os.path.join(state_dir, "archives"), kind=CHECKPOINT_KIND)
        self.poll_interval = poll_interval
        self._settle = settle
        self._clock = clock
        self._host, self._port = host, port
        self._server: RegistryServer | None = None
        self._records: dict[str, _Record] = {}  # archive file name -> record
        self._sources: dict[str, ArchiveSource] = {}  # archive file name -> source, once read
        self._source_signatures: dict[str, tuple[int, int]] = {}  # of the file each source was read from
        self._providers: dict[str, str] = {}  # normalized image name -> archive file name
        self._mirrors: dict[str, str] = {}  # mirror repository -> original repository
        self._verified: set[str] = set()  # archives whose images were seen in the runtime since start
        self._failed: dict[str, tuple[int, int]] = {}  # archive -> signature whose import failed for good
        self._lock = asyncio.Lock()
        self._started = False
        self._wake = asyncio.Event()  # set by inotify when the directory changes
        self._unsettled = False  # the last scan skipped a file that may still be being written
        self._sightings: dict[str, tuple[tuple[int, int], float]] = {}  # name -> (signature, first seen)
        self._first_scan_done = False

    @property
    def registry_address(self) -> str:
        """The loopback registry's "host:port" (once started)."""
        if self._server is None:
            raise RuntimeError("the air-gap registry has not served an archive yet")
        return self._server.address

    # -- what the image manager and image GC ask ------------------------------------------------

    def provides(self, key: str) -> bool:
        """Whether the directory holds the image `key` (a normalized name, see reference.normalize)."""
        return key in self._providers

    def image_id(self, key: str) -> str | None:
        """The image id `key` was last pulled as, or None."""
        name = self._providers.get(key)
        return (self._records[name].images.get(key) or None) if name else None

    def image_ids(self) -> set[str]:
        """Ids of every image the directory provides: keep them from image GC."""
        ids = (self._records[name].images.get(key) for key, name in self._providers.items())
        return {image_id for image_id in ids if image_id}

    async def pull(self, key: str) -> str:
        """Makes sure the runtime has `key` from its archive; returns the image id.

        An image already pulled from an unchanged archive is not pulled again: the archive is its
        only source, and its content is what was pulled.
        """
        async with self._lock:
            name = self._providers.get(key)
            if name is None:
                raise AirgapError(f"image {key} is not in the air-gap directory {self.directory}")
            image_id = self._records[name].images.get(key)
            if image_id and await self._runtime.image_status(image_id) is not None:
                return image_id
            source, _ = await self._load(name)
            try:
                return await self._pull_one(name, source, key)
            finally:
                await asyncio.to_thread(source.release)

    # -- registry content (called by the loopback server) ---------------------------------------

    def manifest(self, repository: str, ref: str) -> tuple[str, Blob, Opener] | None:
        original = self._mirrors.get(repository)
        if original is None:
            return None
        if ":" in ref:  # a digest (tags cannot hold a colon)
            found = self._find_blob(ref)
            return (ref, *found) if found is not None and found[0].media_type else None
        key = f"{original}:{ref}"
        name = self._providers.get(key)
        source = self._sources.get(name) if name else None
        if source is None or source.index is None or key not in source.index.images:
            return None
        digest = source.index.images[key]
        return digest, source.index.blobs[digest], source.opener()

    def blob(self, repository: str, digest: str) -> tuple[Blob, Opener] | None:
        return self._find_blob(digest) if repository in self._mirrors else None

    def _find_blob(self, digest: str) -> tuple[Blob, Opener] | None:
        # Content is addressed by digest: any archive read since start may serve it.
        for source in self._sources.values():
            blob = source.index.blobs.get(digest) if source.index is not None else None
            if blob is not None:
                return blob, source.opener()
        return None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Loads the checkpoints (so pods can start from imported images at once) and starts the registry.

        Call it, and ideally one `scan`, before pods are started; `run` starts it when that was not done.
        """
        if self._started:
            return
        self._started = True
        payloads = await asyncio.to_thread(self._checkpoints.load_all)
        for name, payload in payloads.items():
            try:
                record = _Record.decode(payload)
            except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as err:
                log.warning("air-gap: checkpoint of %s is unreadable (%s); the archive is imported again", name, err)
                continue
            if os.path.exists(os.path.join(self.directory, name)):
                self._adopt(name, record)

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()
        self._started = False

    async def _registry(self) -> str:
        """The loopback registry's address, starting it on first need (an empty directory costs nothing)."""
        if self._server is None:
            from edgelet.images.registry import RegistryServer

            self._server = RegistryServer(self, host=self._host, port=self._port)
        return await self._server.start()

    async def run(self) -> None:
        """Imports new and changed archives: at once when inotify reports a change, and every
        `poll_interval` seconds in any case (inotify can be unavailable or overflow; WATCHED_POLL_INTERVAL while it
        watches or the directory is absent)."""
        await self.start()
        watcher, absent = self._watch()
        try:
            while True:
                self._wake.clear()
                if absent and os.path.isdir(self.directory):
                    watcher, absent = self._watch()
                try:
                    await self.scan()
                except EdgeletError as err:
                    log.warning("air-gap: scan of %s failed: %s", self.directory, err)
                interval = self.poll_interval
                if watcher is not None or absent:
                    interval = max(interval, WATCHED_POLL_INTERVAL)
                # A file too young to import is looked at again as soon as it has settled.
                delay = min(self._settle, interval) if self._unsettled else interval
                await wait_set(self._wake, delay)
        finally:
            if watcher is not None:
                watcher.close()
            await self.close()

    def _watch(self) -> tuple[Inotify | None, bool]:
        """An inotify watch on the directory, or None; and whether the directory is absent (looked for again)."""
        try:
            watcher = Inotify()
        except OSError as err:
            log.info("air-gap: polling %s every %gs (no inotify: %s)", self.directory, self.poll_interval, err)
            return None, False
        try:
            watcher.add_watch(self.directory, _WATCH_MASK)
        except OSError as err:
            watcher.close()
            if err.errno == errno.ENOENT:  # no images directory: the feature is not in use, nothing to say
                log.debug("air-gap: %s does not exist; looked for every %gs", self.directory, WATCHED_POLL_INTERVAL)
                return None, True
            log.info("air-gap: polling %s every %gs (%s)", self.directory, self.poll_interval, err.strerror)
            return None, False
        watcher.attach(asyncio.get_running_loop(), lambda events: self._wake.set())
        return watcher, False

    async def scan(self) -> list[str]:
        """One pass over the directory; returns the names of the archives imported in it."""
        files = await asyncio.to_thread(self._list_archives)
        imported = []
        async with self._lock:
            for name in [name for name in self._sightings if name not in files]:
                del self._sightings[name]
            for name in [name for name in self._records if name not in files]:
                self._forget(name)
                await asyncio.to_thread(self._checkpoints.delete, name)
                log.info("air-gap: %s was removed; its images are no longer provided", name)
            for name in [name for name in self._failed if name not in files]:
                del self._failed[name]
            self._unsettled = False
            for name, signature in sorted(files.items()):
                if not self._settled(name, signature):
                    self._unsettled = True
                    continue
                if self._failed.get(name) == signature:
                    continue
                record = self._records.get(name)
                if record is not None and record.signature == signature:
                    if name in self._verified or await self._all_present(record):
                        self._verified.add(name)
                        continue
                if await self._import(name, signature):
                    imported.append(name)
            self._first_scan_done = True
        return imported

    def _settled(self, name: str, signature: tuple[int, int]) -> bool:
        """Whether the file kept its size and mtime for `settle` seconds (by this process's clock, since a
        device may boot with a wrong wall clock). At start every file is taken as it is: one still being
        written fails to import and is imported again once it changes."""
        now = self._clock()
        seen = self._sightings.get(name)
        if seen is None or seen[0] != signature:
            seen = self._sightings[name] = (signature, now)
        return not self._first_scan_done or now - seen[1] >= self._settle

    # -- internals --------------------------------------------------------------------------------

    def _list_archives(self) -> dict[str, tuple[int, int]]:
        """Archive file name -> (size, mtime_ns)."""
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return {}
        result = {}
        for entry in entries:
            try:
                if is_archive_name(entry.name) and entry.is_file():
                    stat = entry.stat()
                    result[entry.name] = (stat.st_size, stat.st_mtime_ns)
            except OSError:
                continue  # removed while we looked
        return result

    def _adopt(self, name: str, record: _Record) -> None:
        self._records[name] = record
        for key in record.images:
            self._providers[key] = name
            ref = reference.parse(key)
            self._mirrors[mirror_repository(ref)] = ref.repository

    def _forget(self, name: str) -> None:
        self._records.pop(name, None)
        self._sources.pop(name, None)
        self._source_signatures.pop(name, None)
        self._verified.discard(name)
        self._drop_providers(name)

    def _drop_providers(self, name: str) -> None:
        for key in [key for key, provider in self._providers.items() if provider == name]:
            del self._providers[key]

    async def _all_present(self, record: _Record) -> bool:
        for image_id in record.images.values():
            if not image_id or await self._runtime.image_status(image_id) is None:
                return False
        return True

    async def _load(self, name: str) -> tuple[ArchiveSource, ArchiveIndex]:
        """The archive and its index (decompressed for serving); read again if the file changed since."""
        from edgelet.images.archive import ArchiveError, ArchiveSource

        path = os.path.join(self.directory, name)
        try:
            stat = await asyncio.to_thread(os.stat, path)
        except OSError as err:
            raise ArchiveError(f"{path}: {err.strerror}") from None
        signature = (stat.st_size, stat.st_mtime_ns)
        source = self._sources.get(name)
        if source is None or self._source_signatures.get(name) != signature:
            source = self._sources[name] = ArchiveSource(path, self._cache_dir)
            self._source_signatures[name] = signature
        return source, await asyncio.to_thread(source.load)

    async def _import(self, name: str, signature: tuple[int, int]) -> bool:
        """Reads the archive and pulls each of its images; True when all made it into the runtime."""
        from edgelet.images.archive import ArchiveError

        try:
            source, index = await self._load(name)
        except ArchiveError as err:
            self._forget(name)
            self._failed[name] = signature
            log.warning("air-gap: cannot import %s", err)
            return False
        self._failed.pop(name, None)
        if not index.images:
            log.warning("air-gap: %s names no image (no io.containerd.image.name, ref name or RepoTags)", source.path)
        # Swap the names in one step, so the image manager never sees the archive's images missing.
        self._drop_providers(name)
        self._adopt(name, _Record(signature, {key: "" for key in index.images}))
        started = time.monotonic()
        pulled = 0
        try:
            for key in index.images:
                try:
                    await self._pull_one(name, source, key)
                    pulled += 1
                except TemporaryError as err:
                    log.warning("air-gap: importing %s from %s must wait for the runtime: %s", key, name, err)
                    return False
                except EdgeletError as err:
                    # Not retried until the file changes: the same bytes would fail the same way.
                    self._failed[name] = signature
                    log.warning("air-gap: importing %s from %s failed: %s", key, name, err)
        finally:
            await asyncio.to_thread(source.release)
        log.info("air-gap: imported %d of %d images of %s in %.3fs", pulled, len(index.images), name,
                 time.monotonic() - started)
        if pulled == len(index.images):
            self._verified.add(name)
            return True
        return False

    async def _pull_one(self, name: str, source: ArchiveSource, key: str) -> str:
        ref = reference.parse(key)
        suffix = f"@{ref.digest}" if ref.digest else f":{ref.tag}"
        mirror = f"{await self._registry()}/{mirror_repository(ref)}{suffix}"
        try:
            image_id = await self._runtime.pull_image(mirror)
        except RuntimeUnavailable:
            raise
        except EdgeletError as err:
            raise AirgapError(f"pulling {key} (as {mirror}) from {source.path}: {err}") from None
        record = self._records[name]
        record.images[key] = image_id
        await asyncio.to_thread(self._checkpoints.write, name, record.encode())
        return image_id
