"""Makes sure a container's image is in the runtime before it is created, as the kubelet's image manager does:
imagePullPolicy, pull secrets, back-off per (pod, image), one pull per image at a time, serialized or a bounded
number in parallel, and no deadline: a pull is cancelled only when it stops making progress (`progress`).

Images provided by the air-gap directory (`edgelet.images.airgap`) are pulled from it instead of
their registry and count as present for IfNotPresent and Never.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from edgelet.api import podutil
from edgelet.cri import RuntimeUnavailable
from edgelet.cri import runtime_v1_pb2 as pb
from edgelet.events import NO_EVENTS, NORMAL, WARNING, Recorder, pod_ref
from edgelet.images import progress, reference
from edgelet.images.auth import credentials_for
from edgelet.util.errors import EdgeletError

log = logging.getLogger(__name__)

# Waiting reasons the kubelet reports for image trouble (container status .state.waiting.reason).
ERR_IMAGE_PULL = "ErrImagePull"
IMAGE_PULL_BACKOFF = "ImagePullBackOff"
ERR_IMAGE_NEVER_PULL = "ErrImageNeverPull"
INVALID_IMAGE_NAME = "InvalidImageName"

PULL_ALWAYS = "Always"
PULL_IF_NOT_PRESENT = "IfNotPresent"
PULL_NEVER = "Never"
PULL_POLICIES = (PULL_ALWAYS, PULL_IF_NOT_PRESENT, PULL_NEVER)


class ImageError(EdgeletError):
    """The container cannot start for an image reason; `reason` is the kubelet's waiting reason.

    `retry_after` (seconds) says when trying again can help: the back-off still to wait after a
    failed pull; None when only a changed spec can help.
    """

    def __init__(self, reason: str, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def pull_policy(container: Mapping[str, Any]) -> str:
    """The container's imagePullPolicy, defaulted as the API server does: Always for `:latest` or no tag."""
    policy = container.get("imagePullPolicy")
    if policy:
        return policy
    ref = reference.parse(container.get("image") or "")
    if ref.tag == reference.DEFAULT_TAG or (not ref.tag and not ref.digest):
        return PULL_ALWAYS
    return PULL_IF_NOT_PRESENT


# An image error's waiting reason -> the reason and type of the event the kubelet records for it.
_EVENT_OF_ERROR = {
    ERR_IMAGE_PULL: ("Failed", WARNING),
    IMAGE_PULL_BACKOFF: ("BackOff", NORMAL),
    ERR_IMAGE_NEVER_PULL: (ERR_IMAGE_NEVER_PULL, WARNING),
    INVALID_IMAGE_NAME: ("InspectFailed", WARNING),
}


def should_pull(policy: str, present: bool) -> bool:
    return policy == PULL_ALWAYS or (policy == PULL_IF_NOT_PRESENT and not present)


def backoff_key(pod: Mapping[str, Any], image: str) -> str:
    return f"{podutil.uid(pod)}_{image}"


class _KeyedLocks:
    """One asyncio.Lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]


class _PullFailed(Exception):
    pass


class ImageManager:
    """`ensure_image` gives the image reference to create a container with, or raises ImageError.

    `runtime` is an `edgelet.cri.client.RuntimeClient`; `pull_backoff` an `edgelet.util.backoff.Backoff`
    (the kubelet uses 10 s doubling to 300 s); `max_parallel_pulls` bounds the pulls in flight (1: the
    kubelet's serialized pulls; None: no bound); `progress_timeout` cancels a pull with no progress for that
    long where the runtime does not (`edgelet.images.progress`; 0: never); `airgap` an
    `edgelet.images.airgap.AirgapImages` or None; `recorder` gets the kubelet's image events (Pulling,
    Pulled, Failed, BackOff, ...); `node_keyring` (`edgelet.images.nodeauth.NodeKeyring`) gives the node's own
    credentials for an image, tried after the pod's pull secrets.
    """

    def __init__(
        self,
        runtime,
        *,
        pull_backoff,
        airgap=None,
        max_parallel_pulls: int | None = 1,
        progress_timeout: float = 300.0,
        node_keyring=None,
        recorder: Recorder = NO_EVENTS,
    ):
        self._runtime = runtime
        self._backoff = pull_backoff
        self._airgap = airgap
        self._pull_slots = asyncio.Semaphore(max_parallel_pulls) if max_parallel_pulls else None
        self._locks = _KeyedLocks()
        self._recorder = recorder
        self._progress_timeout = progress_timeout
        self._judge: progress.Judge | None = None
        self._node_keyring = node_keyring

    async def image_status(self, image: str) -> pb.Image | None:
        """The runtime's record of `image` (as a pod names it), air-gap images included; None when absent."""
        if self._airgap is not None:
            try:
                key = reference.normalize(image)
            except reference.InvalidReference:
                return None
            if self._airgap.provides(key):
                image_id = self._airgap.image_id(key)
                return await self._runtime.image_status(image_id) if image_id else None
        return await self._runtime.image_status(image)

    async def ensure_image(
        self,
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        pull_secrets: Sequence[Mapping[str, Any]] = (),
        sandbox_config: pb.PodSandboxConfig | None = None,
    ) -> str:
        """Pulls the container's image if its policy says so; returns the image id to create it from.

        Raises ImageError with reason InvalidImageName, ErrImageNeverPull, ImagePullBackOff or
        ErrImagePull, and RuntimeUnavailable when the runtime cannot be asked at all.
        """
        spec_image = container.get("image") or ""
        ref = pod_ref(pod, container.get("name", ""))
        try:
            return await self._ensure(pod, container, spec_image, ref, pull_secrets, sandbox_config)
        except ImageError as err:
            reason, event_type = _EVENT_OF_ERROR[err.reason]
            self._recorder.event(ref, event_type, reason, err.message)
            raise

    async def _ensure(self, pod: Mapping[str, Any], container: Mapping[str, Any], spec_image: str, ref: dict,
                      pull_secrets: Sequence[Mapping[str, Any]], sandbox_config: pb.PodSandboxConfig | None) -> str:
        try:
            image = reference.with_default_tag(spec_image)
            key = reference.normalize(spec_image)
            policy = pull_policy(container)
        except reference.InvalidReference as err:
            raise ImageError(INVALID_IMAGE_NAME, f'Failed to apply default image tag "{spec_image}": {err}') from None
        if policy not in PULL_POLICIES:
            choices = ", ".join(PULL_POLICIES)
            message = f'imagePullPolicy "{policy}" of image "{spec_image}" is not one of {choices}'
            raise ImageError(ERR_IMAGE_PULL, message)

        present = await self.image_status(image)
        if not should_pull(policy, present is not None):
            if present is not None:
                self._recorder.event(ref, NORMAL, "Pulled",
                                     f'Container image "{spec_image}" already present on machine')
                return present.id
            raise ImageError(
                ERR_IMAGE_NEVER_PULL, f'Container image "{spec_image}" is not present with pull policy of Never'
            )

        backoff = backoff_key(pod, spec_image)
        if self._backoff.in_backoff(backoff):
            message = f'Back-off pulling image "{spec_image}"'
            raise ImageError(IMAGE_PULL_BACKOFF, message, retry_after=self._backoff.remaining(backoff))
        self._recorder.event(ref, NORMAL, "Pulling", f'Pulling image "{spec_image}"')
        started = time.monotonic()
        try:
            image_ref = await self._pull_serialized(key, image, policy, pull_secrets, sandbox_config)
        except _PullFailed as err:
            self._backoff.next(backoff)
            message = f'Failed to pull image "{spec_image}": {err}'
            raise ImageError(ERR_IMAGE_PULL, message, retry_after=self._backoff.remaining(backoff)) from None
        self._backoff.reset(backoff)
        self._backoff.gc()  # forget the back-off of pods long gone, as the kubelet does after a pull
        self._recorder.event(ref, NORMAL, "Pulled",
                             f'Successfully pulled image "{spec_image}" in {time.monotonic() - started:.3f}s')
        return image_ref

    async def _pull_serialized(
        self,
        key: str,
        image: str,
        policy: str,
        pull_secrets: Sequence[Mapping[str, Any]],
        sandbox_config: pb.PodSandboxConfig | None,
    ) -> str:
        async with self._locks.hold(key):
            if policy == PULL_IF_NOT_PRESENT:
                # Another pod may have pulled it while this one waited for the lock.
                present = await self.image_status(image)
                if present is not None:
                    return present.id
            async with self._pull_slots or contextlib.nullcontext():
                started = time.monotonic()
                log.info("pulling image %s", image)
                if self._airgap is not None and self._airgap.provides(key):
                    image_ref = await self._pull_airgap(key)
                else:
                    image_ref = await self._pull_with_credentials(image, pull_secrets, sandbox_config)
                log.info("pulled image %s as %s in %.3fs", image, image_ref, time.monotonic() - started)
                return image_ref

    async def _attempt(self, awaitable) -> str:
        """One pull, with no deadline: cancelled only for lack of progress, by the judge `_judge_pulls` picks."""
        judge = await self._judge_pulls()
        if not judge.agent_timeout:
            return await awaitable
        try:
            return await progress.guarded(awaitable, timeout=judge.agent_timeout, sample=self._image_fs_sample)
        except progress.PullStalled as err:
            raise _PullFailed(str(err)) from None

    async def _judge_pulls(self) -> progress.Judge:
        """Who cancels a stalled pull, decided once from the runtime's CRI Version and Status (verbose) replies."""
        if self._judge is not None:
            return self._judge
        try:
            version = await self._runtime.version()
            status = await self._runtime.status(verbose=True)
        except EdgeletError as err:  # not kept: asked again at the next pull
            log.info("cannot ask the runtime whether it cancels stalled pulls (%s): the agent guards this one", err)
            return progress.choose_judge(self._progress_timeout, progress.NO_RUNTIME_GUARD, "the runtime")
        guard = progress.runtime_guard(version.runtime_name, version.runtime_version, status.info)
        label = f"{version.runtime_name} {version.runtime_version}"
        self._judge = progress.choose_judge(self._progress_timeout, guard, label)
        (log.warning if self._judge.warn else log.info)("image pulls: %s", self._judge.summary)
        return self._judge

    async def _image_fs_sample(self) -> tuple[int, int]:
        return progress.fs_sample(await self._runtime.image_fs_info())

    async def _pull_airgap(self, key: str) -> str:
        try:
            return await self._attempt(self._airgap.pull(key))
        except EdgeletError as err:
            raise _PullFailed(f"from the air-gap images directory: {err}") from None

    async def _pull_with_credentials(
        self, image: str, pull_secrets: Iterable[Mapping[str, Any]], sandbox_config: pb.PodSandboxConfig | None
    ) -> str:
        """Tries the pod's credentials, then the node's, then anonymously (the kubelet's order); the error names
        every attempt's failure, never a secret."""
        credentials = credentials_for(image, pull_secrets)
        if self._node_keyring is not None:
            credentials += [c for c in await self._node_keyring.lookup(image) if c not in credentials]
        attempts: list[pb.AuthConfig | None] = [pb.AuthConfig(**c) for c in credentials]
        attempts.append(None)
        failures = []
        for auth in attempts:
            try:
                return await self._attempt(self._runtime.pull_image(image, auth=auth, sandbox_config=sandbox_config))
            except RuntimeUnavailable as err:
                raise _PullFailed(str(err)) from None
            except _PullFailed:  # cancelled for lack of progress: the link, not the credential, is at fault
                raise
            except EdgeletError as err:
                message = getattr(err, "details", "") or str(err)
                if self._judge is not None and self._judge.stalled(message):
                    raise _PullFailed(self._judge.explain(message)) from None
                failures.append((auth, message))
        if len(failures) == 1:
            raise _PullFailed(failures[0][1])
        raise _PullFailed("; ".join(f"{_who(auth)}: {message}" for auth, message in failures))


def _who(auth: pb.AuthConfig | None) -> str:
    if auth is None:
        return "anonymously"
    return f"as {auth.username}" if auth.username else "with a token"
