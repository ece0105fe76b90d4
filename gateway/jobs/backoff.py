"""When summary jobs may call the summary model: per-session backoff, per-model breakers.

A failed summary job must not be followed by a fresh one on every turn (a failing summary model
would be called on every round). Two layers decide, both in memory and bounded:

- ``SessionBackoff``: after a failed job a session waits ``base * 2**(n-1)`` seconds (capped,
  with jitter so sessions that failed together do not retry together), and never less than an
  upstream ``Retry-After``. It also counts consecutive *rejected* summaries (the model answered,
  but not in the required format): past a threshold the session is "degraded" and its jobs write
  a deterministic checkpoint instead of waiting (see ``policies.summary.render_state_summary``).
- ``Breaker``: one per summary model (and base URL). ``failures`` failed calls in a row, across
  sessions, open it; while open no session calls the model; after the cool-down one job probes
  it (half-open); the probe's outcome closes it or opens it again for twice as long. A 429's
  ``Retry-After`` holds every call back until it expires.

Clocks and randomness are injected, so tests can drive them.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Mapping

# A hostile or broken upstream must not park summaries for days with one header.
RETRY_AFTER_CAP_S = 3600.0
SESSIONS_TRACKED = 10_000

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


def retry_after_seconds(headers: Mapping[str, str], now_epoch: float | None = None) -> float | None:
    """Seconds an upstream asks to wait: ``retry-after-ms``, else ``Retry-After`` as seconds or
    an HTTP date; None when absent or unreadable. Capped at ``RETRY_AFTER_CAP_S``."""
    value = headers.get("retry-after-ms")
    seconds = None
    if value is not None:
        try:
            seconds = float(value) / 1000
        except ValueError:
            seconds = None
    if seconds is None and (value := headers.get("retry-after")) is not None:
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return None
            if when is None:
                return None
            seconds = when.timestamp() - (time.time() if now_epoch is None else now_epoch)
    if seconds is None or seconds != seconds:
        return None
    return min(max(0.0, seconds), RETRY_AFTER_CAP_S)


@dataclass(slots=True)
class SessionFailures:
    failures: int = 0  # failed jobs in a row
    rejections: int = 0  # rejected summaries in a row (the model answered off-format)
    retry_at: float = 0.0  # monotonic time before which no job calls the model


class SessionBackoff:
    def __init__(self, *, base_s: float, max_s: float, jitter: float, degrade_after: int,
                 clock: Callable[[], float] = time.monotonic, rand: Callable[[], float] = random.random) -> None:
        self.base_s, self.max_s, self.jitter, self.degrade_after = base_s, max_s, jitter, degrade_after
        self.clock, self.rand = clock, rand
        self._sessions: OrderedDict[str, SessionFailures] = OrderedDict()

    def get(self, key: str) -> SessionFailures | None:
        return self._sessions.get(key)

    def waiting(self, key: str) -> bool:
        state = self._sessions.get(key)
        return state is not None and self.clock() < state.retry_at

    def degraded(self, key: str) -> bool:
        state = self._sessions.get(key)
        return state is not None and state.rejections >= self.degrade_after

    def delay(self, failures: int) -> float:
        exact = min(self.max_s, self.base_s * 2 ** max(0, failures - 1))
        return exact * (1 - self.jitter * self.rand())

    def rejected(self, key: str) -> int:
        """Count one rejected summary; returns the session's rejections in a row."""
        state = self._state(key)
        state.rejections += 1
        return state.rejections

    def failed(self, key: str, retry_after: float | None = None) -> float:
        """Count one failed job; returns the seconds the session now waits."""
        state = self._state(key)
        state.failures += 1
        wait = max(self.delay(state.failures), retry_after or 0.0)
        state.retry_at = self.clock() + wait
        return wait

    def succeeded(self, key: str) -> None:
        self._sessions.pop(key, None)

    def _state(self, key: str) -> SessionFailures:
        state = self._sessions.get(key)
        if state is None:
            state = self._sessions[key] = SessionFailures()
            if len(self._sessions) > SESSIONS_TRACKED:
                self._sessions.popitem(last=False)  # the oldest failure is the least informative
        else:
            self._sessions.move_to_end(key)
        return state

    def __len__(self) -> int:
        return len(self._sessions)


class Breaker:
    """Circuit breaker of one summary model."""

    def __init__(self, *, failures: int, cooldown_s: float, max_s: float, jitter: float,
                 clock: Callable[[], float] = time.monotonic, rand: Callable[[], float] = random.random) -> None:
        self.failures_to_open, self.cooldown_s, self.max_s, self.jitter = failures, cooldown_s, max_s, jitter
        self.clock, self.rand = clock, rand
        self.state = CLOSED
        self.consecutive = 0
        self.opened = 0  # times opened in a row (the cool-down doubles)
        self.until = 0.0  # open: when the half-open probe may go
        self.hold_until = 0.0  # Retry-After: no call at all before this
        self.cause = ""  # "rejected" or "unavailable": why the last failure happened
        self.probing = False

    def admit(self) -> str:
        """'call', 'probe' (the half-open trial: the caller must report or release it),
        'retry_after' or 'open'."""
        now = self.clock()
        if now < self.hold_until:
            return "retry_after"
        if self.state == CLOSED:
            return "call"
        if self.state == OPEN and now >= self.until:
            self.state = HALF_OPEN
        if self.state == HALF_OPEN and not self.probing:
            self.probing = True
            return "probe"
        return "open"

    def release(self) -> None:
        """A probe that made no call gives its turn back."""
        self.probing = False

    def record(self, ok: bool, *, cause: str = "unavailable", retry_after: float | None = None) -> str | None:
        """One call's outcome; returns the transition it caused ('open', 'close') if any."""
        now = self.clock()
        if retry_after:
            self.hold_until = max(self.hold_until, now + retry_after)
        if ok:
            self.consecutive = 0
            self.opened = 0
            self.probing = False
            if self.state != CLOSED:
                self.state = CLOSED
                return "close"
            return None
        self.consecutive += 1
        self.cause = cause
        if self.state == HALF_OPEN or (self.state == CLOSED and self.consecutive >= self.failures_to_open):
            self.opened += 1
            cooldown = min(self.max_s, self.cooldown_s * 2 ** (self.opened - 1)) * (1 - self.jitter * self.rand())
            self.until = max(now + cooldown, self.hold_until)
            self.state = OPEN
            self.probing = False
            return "open"
        return None
