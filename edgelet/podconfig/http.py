"""The static-pod HTTP source: a URL serving a Pod, a PodList or multi-document YAML, fetched periodically."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from typing import Any

import httpx

from edgelet.api import podutil
from edgelet.podconfig.config import SourceHandle
from edgelet.podconfig.manifest import MAX_MANIFEST_BYTES, ManifestObjects, parse_manifest, publish_objects
from edgelet.util.errors import ConfigError

log = logging.getLogger(__name__)


class HTTPSource:
    """Feeds the pods served at `url` into a `SourceHandle`. A failed fetch keeps the pods already known (as the
    kubelet does): an unreachable server must not stop running workloads."""

    def __init__(self, url: str, node_name: str, handle: SourceHandle, *, check_frequency: float = 20.0,
                 timeout: float = 10.0, client: httpx.AsyncClient | None = None,
                 on_objects: Callable[[list[dict[str, Any]]], None] | None = None):
        self.url = url
        self.node_name = node_name
        self.handle = handle
        self.check_frequency = check_frequency
        self.timeout = timeout
        self.fetch_count = 0
        self._client = client
        self._on_objects = on_objects
        self._objects: ManifestObjects | None = None
        self._digest = b""
        self._bad_digest = b""
        self._last_error = ""

    @property
    def objects(self) -> ManifestObjects:
        """The ConfigMaps and Secrets served with the pods (also handed to `on_objects` when they change)."""
        return self._objects if self._objects is not None else ManifestObjects()

    async def run(self) -> None:
        if self._client is not None:
            await self._poll(self._client)
            return
        async with httpx.AsyncClient(timeout=self.timeout, follow_redirects=True) as client:
            await self._poll(client)

    async def _poll(self, client: httpx.AsyncClient) -> None:
        while True:
            await self.fetch_once(client)
            await asyncio.sleep(self.check_frequency)

    async def fetch_once(self, client: httpx.AsyncClient) -> bool:
        """One fetch; True when the pods were (re)published. Never raises for network or content problems."""
        self.fetch_count += 1
        try:
            status, body = await self._get(client)
        except httpx.HTTPError as exc:
            self._report(ConfigError(self.url, "", f"fetching pod manifests failed: {exc!r}"))
            return False
        if status != 200:
            self._report(ConfigError(self.url, "", f"fetching pod manifests failed: HTTP {status}"))
            return False
        if not body:
            # The kubelet treats an empty answer as "no pods" but still reports it: it is usually a mistake.
            self._report(ConfigError(self.url, "", "zero-length data received; serving no pods"))
            self._publish(ManifestObjects(), b"")
            return True
        digest = hashlib.blake2b(body, digest_size=16).digest()
        if digest == self._digest:
            self._publish(self.objects, digest)
            return True
        if digest == self._bad_digest:
            return False  # the same broken content again: already reported
        try:
            objects = await asyncio.to_thread(
                parse_manifest, body, self.url, self.node_name, source=podutil.SOURCE_HTTP, location=self.url
            )
        except ConfigError as exc:
            self._bad_digest = digest
            self._report(exc)
            return False
        except Exception as exc:  # a bug must not end the source
            log.exception("unexpected error parsing pod manifests from %s", self.url)
            self._bad_digest = digest
            self._report(ConfigError(self.url, "", f"unexpected error: {exc!r}"))
            return False
        self._publish(objects, digest)
        return True

    async def _get(self, client: httpx.AsyncClient) -> tuple[int, bytes]:
        """(status, body); a body is read to one byte past MAX_MANIFEST_BYTES at most, so parse_manifest
        refuses it by size without a huge answer ever being held in memory."""
        async with client.stream("GET", self.url) as response:
            if response.status_code != 200:
                return response.status_code, b""
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_MANIFEST_BYTES:
                    break
            return response.status_code, bytes(body[:MAX_MANIFEST_BYTES + 1])

    def _publish(self, objects: ManifestObjects, digest: bytes) -> None:
        if self._last_error and digest:
            log.info("pod manifests from %s are valid again", self.url)
            self._last_error = ""
        publish_objects(objects, self._objects, self._on_objects)
        self._objects = objects
        self._digest = digest
        self.handle.set(objects.pods)
        self.handle.mark_ready()

    def _report(self, error: ConfigError) -> None:
        """Log an error once until it changes or the source recovers."""
        if str(error) != self._last_error:
            log.warning("http pod source: %s", error)
            self._last_error = str(error)
