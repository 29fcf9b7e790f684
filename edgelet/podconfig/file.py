"""The static-pod file source: a manifest directory (or one file) watched with inotify and rescanned periodically."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import orjson

from edgelet import yamlload
from edgelet.api import podutil
from edgelet.podconfig import inotify
from edgelet.podconfig.config import SourceHandle
from edgelet.podconfig.defaults import now_rfc3339nano
from edgelet.podconfig.manifest import MAX_MANIFEST_BYTES, ManifestObjects, parse_manifest, publish_objects
from edgelet.podconfig.parserversion import PARSER_DIGEST
from edgelet.util.checkpoint import CheckpointStore
from edgelet.util.errors import ConfigError

log = logging.getLogger(__name__)

_WATCH_MASK = (
    inotify.IN_CLOSE_WRITE | inotify.IN_MOVED_TO | inotify.IN_MOVED_FROM | inotify.IN_DELETE | inotify.IN_CREATE
    | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF | inotify.IN_ONLYDIR
)
_WATCH_GONE = inotify.IN_IGNORED | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF | inotify.IN_UNMOUNT
# A change this long after the previous scan is scanned without waiting for more to follow.
QUIET_SPELL = 0.1
# How long the manifests stay unchanged before what a scan parsed is recorded for the next start (an fsynced
# write of every manifest's objects): the pods just handed on start without it competing for the disk, the
# thread pool and the interpreter, and a stream of new manifests is recorded once it ends, not once each.
RECORD_QUIET = 2.0
_EDITOR_SUFFIXES = ("~", ".swp", ".swx", ".swo", ".tmp", ".bak", ".dpkg-new", ".dpkg-old", ".dpkg-dist")


def is_manifest_name(name: str) -> bool:
    """Dot-files (the kubelet's rule), editor backups and swap files, and package-manager leftovers are not pods."""
    return bool(name) and not name.startswith(".") and not name.startswith("#") and not name.endswith(_EDITOR_SUFFIXES)


def _event_matters(name: str) -> bool:
    # "..data" style names are the atomic symlink swaps of a mounted ConfigMap: the files change through them.
    return name.startswith("..") or is_manifest_name(name)


# A file whose timestamps fall within this long of the moment it was read may be written again within the same
# tick of a coarse file-system clock (FAT's is 2 s), leaving its stat as it was: it is read again at the next
# scan rather than taken on its stat's word (git's rule for racily clean index entries).
RACY_NS = 2_000_000_000


@dataclass(slots=True)
class _Cached:
    digest: bytes
    objects: ManifestObjects | None
    error: ConfigError | None
    # (device, inode, size, mtime, ctime) of the file as read, once they are old enough to vouch for its bytes:
    # a rescan that finds the same stat does not read the file again. None: read it at every scan.
    signature: tuple[int, int, int, int, int] | None = None


def _signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


PARSED_KIND = "manifests"
_PARSED_KEY = "parsed"
_PARSED_FORMAT = 1


class ParsedManifests:
    """What the manifests parsed to, kept across restarts (under root_dir/state/manifests).

    Parsing and validating YAML is most of the file source's start-up (about 20 ms for 110 pods, on the way to
    adopting them), and what it yields depends on nothing but the file's bytes, its path, the node name and the
    parser: the source of the modules a parse runs (PARSER_DIGEST) and the YAML library's version. So a start
    reuses what the last run parsed for every file whose bytes are the same. The record also keeps each file's
    stat signature once it vouches for the bytes (see RACY_NS), so a start that finds the same stat does not even
    read the file: 110 unchanged manifests cost 110 stat calls, not 110 reads (from an SD card at boot, or
    competing with the start-up for the interpreter). The record is rewritten only when a manifest's content or
    signature changed: no writes while nothing does, and a freshly written file is recorded once more, at the
    first scan after it settled. A record from another parser or node name is not used; a damaged one is set
    aside by the store with one warning. Either way the manifests are then parsed as they always are. Broken
    files are not recorded: their error is reported again at each start. Blocking I/O, called from the scan's
    thread.
    """

    def __init__(self, directory: str, node_name: str):
        self.directory = directory
        self._store: CheckpointStore | None = None
        self._stamp = {"format": _PARSED_FORMAT, "parser": PARSER_DIGEST, "yaml": yamlload.LIBRARY,
                       "node": node_name}
        # path -> (digest, signature), as the record on disk has them
        self._written: dict[str, tuple[bytes, tuple[int, ...] | None]] = {}

    def load(self) -> dict[str, _Cached]:
        try:
            self._store = CheckpointStore(self.directory, kind=PARSED_KIND, mode=0o600)
        except OSError as exc:
            log.warning("recording the parsed manifests under %s failed: %s", self.directory, exc)
            return {}
        payload = self._store.read(_PARSED_KEY)
        if payload is None:
            return {}
        try:
            record = orjson.loads(payload)
            if record["stamp"] != self._stamp:
                return {}  # another parser or node name: parsed anew, and rewritten after the first scan
            seen = now_rfc3339nano()  # when this run read the pods, as a parse would have stamped them
            loaded = {entry["path"]: _Cached(bytes.fromhex(entry["digest"]), _objects(entry, seen), None,
                                             _recorded_signature(entry))
                      for entry in record["entries"]}
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            self._store.set_aside(_PARSED_KEY, f"not a record of parsed manifests ({exc!r})")
            return {}
        self._written = _recorded(loaded)
        return loaded

    def pending(self, cache: dict[str, _Cached]) -> bool:
        """Whether `save(cache)` would write: a manifest that parses was added, changed or removed since, or its
        signature changed."""
        return self._store is not None and _recorded(cache) != self._written

    def save(self, cache: dict[str, _Cached]) -> None:
        current = _recorded(cache)
        if current == self._written or self._store is None:
            return
        entries = [{"path": path, "digest": cached.digest.hex(),
                    "signature": None if cached.signature is None else list(cached.signature),
                    "pods": cached.objects.pods,
                    "configmaps": cached.objects.configmaps, "secrets": cached.objects.secrets}
                   for path, cached in cache.items() if cached.objects is not None]
        try:
            self._store.write(_PARSED_KEY, orjson.dumps({"stamp": self._stamp, "entries": entries}))
        except OSError as exc:  # the next start parses again; nothing else depends on the record
            log.warning("recording the parsed manifests under %s failed: %s", self.directory, exc)
            return
        self._written = current


def _recorded(cache: dict[str, _Cached]) -> dict[str, tuple[bytes, tuple[int, ...] | None]]:
    """What the record keeps of each manifest that parses: its digest and signature."""
    return {path: (cached.digest, cached.signature) for path, cached in cache.items() if cached.objects is not None}


def _recorded_signature(entry: dict[str, Any]) -> tuple[int, int, int, int, int] | None:
    """An entry's signature (absent in a record written before signatures were kept: the file is read again)."""
    signature = entry.get("signature")
    if signature is None:
        return None
    if not (isinstance(signature, list) and len(signature) == 5
            and all(type(part) is int for part in signature)):
        raise TypeError(f"signature {signature!r} is not five whole numbers")
    return tuple(signature)


def _objects(entry: dict[str, Any], seen: str) -> ManifestObjects:
    parts = tuple(tuple(entry[kind]) for kind in ("pods", "configmaps", "secrets"))
    if not all(isinstance(item, dict) for part in parts for item in part):
        raise TypeError("an object that is not a JSON object")
    for pod in parts[0]:
        pod["metadata"]["annotations"][podutil.CONFIG_SEEN_ANNOTATION] = seen
    return ManifestObjects(*parts)


@dataclass(slots=True)
class ScanResult:
    objects: ManifestObjects | None  # None: the path could not be listed; keep the pods already known
    missing: bool = False  # the manifest path does not exist (yet)
    new_errors: list[ConfigError] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)


class ManifestScanner:
    """Loads every manifest under a path, re-parsing only files whose bytes changed, so an unchanged broken
    file is reported once and an unchanged good one is not parsed again on every rescan. A file whose stat is
    what it was when it was last read (and old enough to vouch for it, see RACY_NS) is not even read: an idle
    rescan of 110 manifests costs 110 stat calls. Told which entries changed (inotify's names), a read looks at
    those alone, as the kubelet's file source handles each event's file: a new manifest among 110 costs one stat,
    not 110. Blocking I/O."""

    def __init__(self, manifest_path: str, node_name: str, *,
                 incumbent_uids: Callable[[], Collection[str]] = frozenset, parsed: ParsedManifests | None = None,
                 clock: Callable[[], int] = time.time_ns):
        self.manifest_path = manifest_path
        self.node_name = node_name
        self._clock = clock  # wall-clock nanoseconds, the file system's timestamps' clock
        self._cache: dict[str, _Cached] = {}
        self._parsed = parsed  # what an earlier run parsed, read at the first scan
        self._parsed_loaded = parsed is None
        self._listing_error = ""
        self._incumbent_uids = incumbent_uids  # pods the agent ran before it started: they keep their name
        self._owners: dict[str, str] = {}  # pod namespace/name -> the file that defines it
        self._reported: set[str] = set()  # messages about special files and duplicate names already given
        # The directory's last listing: each manifest file's stat, and the entries skipped (by path, in name order);
        # None until a directory was listed whole (and when the path is missing, or a single file).
        self._listing: tuple[dict[str, os.stat_result], dict[str, ConfigError]] | None = None

    def _paths(self) -> tuple[dict[str, os.stat_result] | None, dict[str, ConfigError]]:
        """The manifest files and their stat (None when the path does not exist; a single file is its own
        list), and what in the directory is not a manifest file although its name says it would be."""
        self._listing = None
        try:
            if not os.path.isdir(self.manifest_path):
                single = _stat_regular_file(self.manifest_path)
                return ({self.manifest_path: single} if isinstance(single, os.stat_result) else None), {}
            with os.scandir(self.manifest_path) as entries:
                names = sorted(entry.name for entry in entries if is_manifest_name(entry.name))
        except FileNotFoundError:
            return None, {}
        paths: dict[str, os.stat_result] = {}
        skipped: dict[str, ConfigError] = {}
        for path in (os.path.join(self.manifest_path, name) for name in names):
            self._list_entry(path, paths, skipped)
        self._listing = paths, skipped
        return paths, skipped

    def _relist(self, listing: tuple[dict[str, os.stat_result], dict[str, ConfigError]],
                named: Collection[str]) -> tuple[dict[str, os.stat_result], dict[str, ConfigError]]:
        """`listing` (the last one) with the entries at the paths in `named` looked at again."""
        paths, skipped = dict(listing[0]), dict(listing[1])
        for path in named:
            paths.pop(path, None)
            skipped.pop(path, None)
            self._list_entry(path, paths, skipped)
        # In name order, as a whole listing has them: the first file by name keeps a duplicated pod name.
        self._listing = dict(sorted(paths.items())), dict(sorted(skipped.items()))
        return self._listing

    @staticmethod
    def _list_entry(path: str, paths: dict[str, os.stat_result], skipped: dict[str, ConfigError]) -> None:
        # Symlinks are followed; subdirectories are not recursed into, as with the kubelet.
        found = _stat_regular_file(path)
        if isinstance(found, os.stat_result):
            paths[path] = found
        elif found:
            skipped[path] = ConfigError(path, "", f"not a manifest file: {found}; skipped")

    def scan(self) -> ScanResult:
        """`read`, then `record`."""
        result = self.read()
        self.record(result)
        return result

    def record_pending(self, result: ScanResult) -> bool:
        """Whether `record(result)` would write anything."""
        return self._parsed is not None and result.objects is not None and self._parsed.pending(self._cache)

    def record(self, result: ScanResult) -> None:
        """Keeps what `result`'s read parsed for the next start (written only when a manifest changed)."""
        if self._parsed is not None and result.objects is not None:
            self._parsed.save(self._cache)

    def read(self, changed: Collection[str] | None = None) -> ScanResult:
        """The manifests as they are now (re-reading and re-parsing only what changed).

        `changed` names the entries of the manifest directory that changed since the last read (as inotify told
        them): only those are looked at again, and read whatever their stat says; every other entry is taken as
        the last read left it. Without it (and before a first whole listing of the directory) every entry is
        listed and looked at."""
        if not self._parsed_loaded:
            self._parsed_loaded = True
            if self._parsed is not None:
                self._cache = self._parsed.load()
        paths: dict[str, os.stat_result] | None  # None: the manifest path does not exist
        try:
            if changed is not None and self._listing is not None:
                named = {os.path.join(self.manifest_path, name) for name in changed if is_manifest_name(name)}
                paths, skipped = self._relist(self._listing, named)
            else:
                (paths, skipped), named = self._paths(), set()
        except OSError as exc:
            error = ConfigError(self.manifest_path, "", f"cannot list manifests: {exc.strerror or exc}")
            is_new = str(error) != self._listing_error
            self._listing_error = str(error)
            return ScanResult(None, new_errors=[error] if is_new else [])
        self._listing_error = ""
        if paths is None:
            self._cache.clear()
            return ScanResult(ManifestObjects(), missing=True)
        results: list[tuple[str, ManifestObjects]] = []
        new_errors: list[ConfigError] = []
        recovered: list[str] = []
        for path, st in paths.items():
            previous = self._cache.get(path)
            current = self._load(path, previous, st, trust_stat=path not in named)
            if current is None:
                continue  # removed between listing and reading; its deletion event rescans
            self._cache[path] = current
            if current.error is not None:
                if previous is None or previous.digest != current.digest or str(previous.error) != str(current.error):
                    new_errors.append(current.error)  # new content or a new problem: say it once
            elif previous is not None and previous.error is not None:
                recovered.append(path)
            if current.objects is not None:
                results.append((path, current.objects))
        for gone in set(self._cache) - set(paths):
            del self._cache[gone]
        broken = {path for path in paths if (cached := self._cache.get(path)) is not None and cached.error}
        notes = [*skipped.values(), *self._drop_duplicate_names(results, broken)]
        reported = {str(note) for note in notes}
        new_errors.extend(note for note in notes if str(note) not in self._reported)
        self._reported = reported
        return ScanResult(ManifestObjects.merge(objects for _, objects in results), False, new_errors, recovered)

    def _drop_duplicate_names(self, results: list[tuple[str, ManifestObjects]], broken: set[str]) -> list[ConfigError]:
        """One pod per namespace/name: the file that defined it before keeps it (also when edited, even into
        an invalid state), else one whose pod the agent already ran, else the first file by name. The others'
        pods are left out, in place; never does a second definition replace a running pod."""
        candidates: dict[str, list[tuple[str, str]]] = {}  # name -> [(path, uid)] in file order
        for path, objects in results:
            for pod in objects.pods:
                candidates.setdefault(_pod_key(pod), []).append((path, podutil.uid(pod)))
        owners = {key: path for key, path in self._owners.items() if path in broken}
        incumbents: Collection[str] | None = None
        for key, found in candidates.items():
            if key in owners:
                continue  # its file is being edited (invalid for now): it keeps the name
            paths = [path for path, _ in found]
            owner = self._owners.get(key)
            if owner not in paths and len(found) > 1:
                incumbents = self._incumbent_uids() if incumbents is None else incumbents
                owner = next((path for path, uid in found if uid in incumbents), None)
            owners[key] = owner if owner in paths else paths[0]
        self._owners = owners
        notes = []
        for index, (path, objects) in enumerate(results):
            losers = [pod for pod in objects.pods if owners[_pod_key(pod)] != path]
            if not losers:
                continue
            for pod in losers:
                key = _pod_key(pod)
                notes.append(ConfigError(path, "metadata.name", f"pod {key} is already defined in {owners[key]}; "
                                                                "this one is ignored"))
            kept = tuple(pod for pod in objects.pods if owners[_pod_key(pod)] == path)
            results[index] = (path, dataclasses.replace(objects, pods=kept))
        return notes

    def _load(self, path: str, previous: _Cached | None, st: os.stat_result, *,
              trust_stat: bool = True) -> _Cached | None:
        """The file as cached when its stat vouches for it (and `trust_stat`), else read (and parsed only when its
        bytes changed). The stat was taken before the read, so a change between the two is caught at the next
        scan."""
        signature: tuple[int, int, int, int, int] | None = _signature(st)
        if trust_stat and previous is not None and previous.signature == signature:
            return previous
        # Taken before the read: a write the read missed is at least this recent.
        read_at = self._clock()
        if read_at - max(st.st_mtime_ns, st.st_ctime_ns) <= RACY_NS:
            signature = None
        try:
            with open(path, "rb") as file:
                data = file.read(MAX_MANIFEST_BYTES + 1)  # parse_manifest refuses anything longer
        except FileNotFoundError:
            return None
        except OSError as exc:
            return _Cached(b"", None, ConfigError(path, "", f"cannot read manifest: {exc.strerror or exc}"))
        digest = hashlib.blake2b(data, digest_size=16).digest()
        if previous is not None and previous.digest == digest:
            previous.signature = signature
            return previous
        try:
            return _Cached(digest, parse_manifest(data, path, self.node_name), None, signature)
        except ConfigError as exc:
            return _Cached(digest, None, exc, signature)
        except Exception as exc:  # a bug must cost one file, never the whole source
            log.exception("unexpected error loading manifest %s", path)
            return _Cached(digest, None, ConfigError(path, "", f"unexpected error: {exc!r}"), signature)


def _pod_key(pod: dict[str, Any]) -> str:
    return f"{podutil.namespace(pod)}/{podutil.name(pod)}"


def _stat_regular_file(path: str) -> os.stat_result | str:
    """The stat of a regular file (or of what a symlink leads to), or why `path` cannot be a manifest ("" for
    a vanished entry)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a dangling symlink" if os.path.islink(path) else ""
    except OSError as exc:  # ELOOP for a symlink loop, EACCES, ...
        return exc.strerror or str(exc)
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return st
    kinds = {stat.S_ISDIR: "a directory (subdirectories are not read)", stat.S_ISFIFO: "a FIFO",
             stat.S_ISSOCK: "a socket", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}
    return next((kind for test, kind in kinds.items() if test(mode)), "not a regular file")


class FileSource:
    """Feeds the pods of a manifest directory into a `SourceHandle`.

    The ConfigMaps and Secrets beside them are in `objects`, and go to `on_objects` (as one list) whenever they
    change, before the pods that may use them are published. `on_error` hears of each broken manifest once.
    """

    def __init__(self, manifest_dir: str, node_name: str, handle: SourceHandle, *, check_frequency: float = 20.0,
                 on_error: Callable[[ConfigError], None] | None = None,
                 on_objects: Callable[[list[dict[str, Any]]], None] | None = None, debounce: float = 0.005,
                 use_inotify: bool = True, incumbent_uids: Callable[[], Collection[str]] = frozenset,
                 parsed_dir: str = "", record_quiet: float = RECORD_QUIET):
        self.manifest_dir = os.path.abspath(manifest_dir)
        self.handle = handle
        self.check_frequency = check_frequency
        self.debounce = debounce
        self.record_quiet = record_quiet
        self.scan_count = 0
        parsed = ParsedManifests(parsed_dir, node_name) if parsed_dir else None
        self._scanner = ManifestScanner(self.manifest_dir, node_name, incumbent_uids=incumbent_uids, parsed=parsed)
        self._on_error = on_error
        self._on_objects = on_objects
        self._use_inotify = use_inotify
        self._objects: ManifestObjects | None = None
        self._changed = asyncio.Event()
        self._inotify: inotify.Inotify | None = None
        self._watch: tuple[str, str | None] | None = None  # (watched directory, entry name to filter on)
        self._wd = -1
        # The manifest directory's entries inotify named since the last scan, which looks at those alone; None when
        # some change named none (an overflow, a watch replaced, a directory, a ConfigMap's swap of `..data`), and
        # empty when nothing did (the periodic rescan): every entry is looked at then.
        self._changed_names: set[str] | None = None
        self._missing_reported = False

    @property
    def objects(self) -> ManifestObjects:
        return self._objects if self._objects is not None else ManifestObjects()

    async def run(self) -> None:
        self._open_inotify()
        unrecorded: ScanResult | None = None
        try:
            while True:
                self._changed.clear()
                self._ensure_watch()
                changed, self._changed_names = self._changed_names, set()
                result = await asyncio.to_thread(self._scanner.read, changed or None)
                scanned_at = asyncio.get_running_loop().time()
                self._publish(result)
                # Only the next start gains from the record: it waits until the manifests are quiet (RECORD_QUIET).
                unrecorded = result if self._scanner.record_pending(result) else None
                if unrecorded is not None and not await self._changed_before(
                        scanned_at + min(self.record_quiet, self.check_frequency)):
                    await asyncio.to_thread(self._scanner.record, unrecorded)
                    unrecorded = None
                await self._wait_for_change(scanned_at)
        finally:
            if self._inotify is not None:
                self._inotify.close()
                self._inotify = None
            if unrecorded is not None and self._scanner.record_pending(unrecorded):
                # Stopped before the manifests were quiet for long enough: the next start still finds the record.
                self._scanner.record(unrecorded)

    async def _changed_before(self, deadline: float) -> bool:
        """Whether a change comes (or came) before `deadline`, loop time; it is left set for the next wait."""
        try:
            async with asyncio.timeout_at(deadline):
                await self._changed.wait()
        except TimeoutError:
            return False
        return True

    def _publish(self, result: ScanResult) -> None:
        self.scan_count += 1
        if result.missing and not self._missing_reported:
            log.info("manifest path %s does not exist yet; waiting for it", self.manifest_dir)
        elif not result.missing and self._missing_reported:
            log.info("manifest path %s appeared", self.manifest_dir)
        self._missing_reported = result.missing
        for error in result.new_errors:
            log.warning("skipping manifest: %s", error)
            if self._on_error is not None:
                self._on_error(error)
        for path in result.recovered:
            log.info("manifest %s is valid again", path)
        if result.objects is None:
            return  # the directory could not be listed: keep the pods already running
        publish_objects(result.objects, self._objects, self._on_objects)
        self._objects = result.objects
        self.handle.set(result.objects.pods)
        self.handle.mark_ready()

    async def _wait_for_change(self, scanned_at: float) -> None:
        """Sleep until the next periodic rescan (`check_frequency` after the scan that ended at `scanned_at`, loop
        time) or a change; let a burst of changes settle into one scan.

        The first change after a quiet spell is scanned at once (a dropped manifest should cost no
        wait); changes that follow closely are settled for `debounce` first.
        """
        loop = asyncio.get_running_loop()
        if not await self._changed_before(scanned_at + self.check_frequency):
            return
        if loop.time() - scanned_at >= QUIET_SPELL:
            return
        # A few milliseconds of quiet are enough for a file copy or a burst of renames to land as one
        # scan, and short next to a pod start; a never-ending stream of events still gets scanned.
        settle_by = loop.time() + max(self.debounce * 20, 0.1)
        while loop.time() < settle_by:
            self._changed.clear()
            if not await self._changed_before(loop.time() + self.debounce):
                return

    def _open_inotify(self) -> None:
        if not self._use_inotify:
            return
        try:
            self._inotify = inotify.Inotify()
        except OSError as exc:
            log.warning("inotify unavailable (%s); rescanning %s every %gs", exc, self.manifest_dir,
                        self.check_frequency)
            return
        self._inotify.attach(asyncio.get_running_loop(), self._on_events)

    def _watch_target(self) -> tuple[str, str | None]:
        """The manifest directory itself, or the nearest existing ancestor and the name leading to the path."""
        if os.path.isdir(self.manifest_dir):
            return self.manifest_dir, None
        child, parent = self.manifest_dir, os.path.dirname(self.manifest_dir)
        while parent != child and not os.path.isdir(parent):
            child, parent = parent, os.path.dirname(parent)
        return parent, os.path.basename(child)

    def _ensure_watch(self) -> None:
        if self._inotify is None:
            return
        target = self._watch_target()
        if target == self._watch:
            return
        self._changed_names = None  # what happened before the new watch was named to no one
        if self._wd >= 0:
            self._inotify.rm_watch(self._wd)
            self._wd = -1
        try:
            self._wd = self._inotify.add_watch(target[0], _WATCH_MASK)
        except OSError as exc:  # vanished meanwhile or unreadable: the periodic rescan still covers it
            log.debug("cannot watch %s: %s", target[0], exc)
            self._watch = None
            return
        self._watch = target

    def _still_being_written(self, event: inotify.InotifyEvent) -> bool:
        """A regular file just created in the manifest directory (a symlink or directory is complete)."""
        if event.mask & inotify.IN_ISDIR or not event.mask & inotify.IN_CREATE:
            return False
        try:
            return not os.path.islink(os.path.join(self.manifest_dir, event.name))
        except OSError:
            return False

    def _on_events(self, events: list[inotify.InotifyEvent]) -> None:
        changed = False
        for event in events:
            if event.mask & inotify.IN_Q_OVERFLOW:
                changed, self._changed_names = True, None
            elif event.wd != self._wd:
                continue  # a watch already replaced
            elif event.mask & _WATCH_GONE:
                if self._inotify is not None and not event.mask & inotify.IN_IGNORED:
                    self._inotify.rm_watch(event.wd)  # moved away, not deleted: the kernel keeps watching it
                self._watch, self._wd = None, -1
                changed, self._changed_names = True, None
            elif self._watch is not None and self._watch[1] is not None:
                if event.name == self._watch[1]:
                    changed, self._changed_names = True, None
            elif self._still_being_written(event):
                continue  # its IN_CLOSE_WRITE follows; scanning now could read half a manifest
            elif _event_matters(event.name):
                changed = True
                if event.name.startswith("..") or event.mask & inotify.IN_ISDIR:
                    self._changed_names = None  # files may have changed through it unnamed
                elif self._changed_names is not None:
                    self._changed_names.add(event.name)
        if changed:
            self._changed.set()
