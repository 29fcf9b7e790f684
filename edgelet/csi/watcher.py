"""The kubelet's plugin watcher: sockets that plugins put into the plugins_registry directory are registered through
pluginregistration v1 (GetInfo, then NotifyRegistrationStatus with the outcome) with the handler of their type, and
deregistered when they go. inotify wakes it; a rescan every `resync` seconds catches what a lost event would miss. A
directory that does not exist (no plugin was ever installed) is looked for again at each rescan, never created.

Light: the gRPC client loads with the first socket."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from typing import Protocol

from edgelet.podconfig.inotify import IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO, Inotify, InotifyUnavailable

log = logging.getLogger(__name__)

RESYNC = 10.0


class PluginHandler(Protocol):
    """Registers plugins of one type (the kubelet's PluginHandler)."""

    async def register(self, name: str, endpoint: str, versions: list[str], socket_path: str) -> None:
        """Validates and registers; raises an exception whose text goes back to the plugin."""

    async def deregister(self, name: str) -> None: ...


def plugin_sockets(directory: str) -> set[str]:
    """The sockets in `directory` (names starting with "." are ignored, as the kubelet does)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return set()
    found = set()
    for entry in entries:
        try:
            if not entry.name.startswith(".") and stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                found.add(entry.path)
        except OSError:
            continue
    return found


class PluginWatcher:
    def __init__(self, directory: str, handlers: dict[str, PluginHandler], *, resync: float = RESYNC):
        self.directory = directory
        self.handlers = handlers
        self.resync = resync
        self._registered: dict[str, tuple[str, str]] = {}  # socket -> (type, plugin name)
        self._failed: set[str] = set()  # sockets whose registration failed: tried again only when they change
        self._wake = asyncio.Event()
        self.scanned = asyncio.Event()  # set after the first pass: the plugins present at start are registered

    async def run(self) -> None:
        inotify = None
        try:
            while True:
                if inotify is None and os.path.isdir(self.directory):
                    inotify = self._watch()
                await self.reconcile()
                self.scanned.set()
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.resync)
                except TimeoutError:
                    pass
        finally:
            if inotify is not None:
                inotify.close()

    def _watch(self) -> Inotify | None:
        try:
            inotify = Inotify()
            inotify.add_watch(self.directory, IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM)
        except (InotifyUnavailable, OSError) as e:
            log.info("plugin registry %s: no inotify (%s); rescanning every %.0fs", self.directory, e, self.resync)
            return None
        inotify.attach(asyncio.get_running_loop(), lambda events: self._wake.set())
        return inotify

    async def reconcile(self) -> None:
        present = plugin_sockets(self.directory)
        self._failed &= present
        for socket_path in sorted(set(self._registered) - present):
            await self._deregister(socket_path)
        for socket_path in sorted(present - set(self._registered) - self._failed):
            await self._register(socket_path)

    async def _register(self, socket_path: str) -> None:
        from .client import notify_registration, plugin_info

        try:
            info = await plugin_info(socket_path)
        except Exception as e:  # noqa: BLE001 - not (yet) serving: tried again at the next rescan
            log.info("plugin socket %s: GetInfo failed: %s", socket_path, e)
            return
        handler = self.handlers.get(info.type)
        error = ""
        if handler is None:
            error = f"no handler registered for plugin type: {info.type}"
        else:
            try:
                await handler.register(info.name, info.endpoint or socket_path, list(info.supported_versions),
                                       socket_path)
            except Exception as e:  # noqa: BLE001 - reported back to the plugin, as the kubelet's watcher does
                error = f"RegisterPlugin error -- plugin registration failed with err: {e}"
        try:
            await notify_registration(socket_path, not error, error)
        except Exception as e:  # noqa: BLE001 - the plugin may be gone already: logged, the watcher goes on
            log.warning("plugin %s: NotifyRegistrationStatus failed: %s", info.name, e)
        if error:
            log.warning("plugin %s (%s) at %s not registered: %s", info.name, info.type, socket_path, error)
            self._failed.add(socket_path)
            return
        log.info("registered %s plugin %s (socket %s)", info.type, info.name, socket_path)
        self._registered[socket_path] = (info.type, info.name)

    async def _deregister(self, socket_path: str) -> None:
        kind, name = self._registered.pop(socket_path)
        log.info("%s plugin %s deregistered: its socket %s is gone", kind, name, socket_path)
        try:
            await self.handlers[kind].deregister(name)
        except Exception as e:  # noqa: BLE001 - one plugin's failed deregistration is not the watcher's end
            log.warning("plugin %s: deregistration failed: %s", name, e)
