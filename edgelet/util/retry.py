"""The one retry helper of the loops that talk to the API server: jittered backoff (full jitter, or the
reflector's for the watches), the first failure of a streak logged once, the recovery logged once."""

from __future__ import annotations

import logging
import random

from edgelet.util.backoff import JitteredBackoff
from edgelet.util.errors import CredentialsRefused

log = logging.getLogger(__name__)

# client-go retries every error on one schedule (the reflector: 0.8 s doubling to 30 s). Refused credentials are
# the one answer that no retry soon can fix (a revoked token or certificate waits for an operator), and a fleet
# sharing a bad credential should not hammer the server: a 401 lifts the ceiling to this many times `initial`.
# Doubling goes on from there whatever comes next, and only a success starts over. A 403 gets no such rule: from
# the Node authorizer it is often transient (its graph lags a new pod binding by a moment).
AUTH_SLOWDOWN = 10


class Retrier:
    """One loop's retry state: `failed(error)` returns the delay before the next attempt, `succeeded()` ends the
    streak. `what` names the loop in the log lines ("API pod source", "renewing the node lease")."""

    def __init__(self, what: str, *, initial: float = 0.8, maximum: float = 30.0, rng: random.Random | None = None,
                 logger: logging.Logger = log, level: int = logging.WARNING, spread: str = "full"):
        self.what = what
        # Loops cap the delay by their own period (the Lease's renew interval), which may be below `initial`.
        # `spread`: see JitteredBackoff ("reflector" for the watches, as client-go's reflector retries).
        self._backoff = JitteredBackoff(initial, max(maximum, initial), rng=rng, spread=spread)
        self._log = logger
        self._level = level  # of the streak's first line: events are best effort and say it at INFO
        self._kinds_reported: set[str] = set()  # in the current streak: see failed(kind=)
        self.failures = 0  # in the current streak

    def failed(self, error: BaseException | str, consequence: str = "", *, level: int | None = None,
               traceback: bool = False, kind: str | None = None) -> float:
        """Counts a failure and returns how long to wait; `consequence` tells what the failure means meanwhile
        ("keeping 3 known pods"); `level`, when given, is that of this streak's first line instead of the loop's;
        `traceback` adds the error's traceback to that line (a bug, not a failure of the world). `kind` names a
        diagnosis an operator acts on ("client certificate"): its first failure in a streak gets a line of its
        own even when other failures came first, as refused credentials do."""
        self.failures += 1
        refused = isinstance(error, CredentialsRefused)  # the API client's Unauthorized
        delay = self._backoff.next(at_least=self._backoff.initial * AUTH_SLOWDOWN if refused else 0.0)
        then = f"{consequence}, retrying in {delay:.1f}s" if consequence else f"retrying in {delay:.1f}s"
        if refused:
            kind = "credentials"
        new_kind = kind is not None and kind not in self._kinds_reported
        if kind is not None:
            self._kinds_reported.add(kind)
        if isinstance(error, CredentialsRefused) and new_kind:
            self._log.error("%s: the API server refused edgelet's credentials (%s %s: %s); check the kubeconfig "
                            "user or the client certificate; %s", self.what, error.status, error.reason,
                            error.message, then)
        elif self.failures == 1 or new_kind:
            self._log.log(self._level if level is None else level, "%s: %s; %s", self.what, error, then,
                          exc_info=error if traceback and isinstance(error, BaseException) else None)
        else:
            self._log.debug("%s: still failing (%s); next try in %.1fs", self.what, error, delay)
        return delay

    def succeeded(self) -> bool:
        """Ends a failure streak (logged once); True when there was one."""
        if not self.failures:
            return False
        self._log.info("%s: working again after %d failed attempts", self.what, self.failures)
        self.failures = 0
        self._kinds_reported.clear()
        self._backoff.reset()
        return True
