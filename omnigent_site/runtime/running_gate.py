"""How many request calls run their sync code at once (``OMNIGENT_REQUEST_THREADS_RUNNING``).

Having a thread is not the same as running on it: every thread that runs Python
competes for the one GIL, and twenty request threads taking turns at it made a poll
cost about twice its CPU alone. So few run at once: one on SQLite, whose work is CPU
in the process, two on PostgreSQL, whose calls wait on a socket (``settings.py``; the
gain is in ``docs/performance.md``, overrides).

A call that finds no place waits in a queue, not on a thread: it gets its request's
thread only when it starts. So twenty requests queued behind the running ones hold
one or two threads, not twenty, and the idle threads the pool keeps (each with its
database connection and the row plans of ``rawsql``) are enough; with a thread per
waiting call the pool overflowed under pollers, and every overflow started a thread
and opened a database connection (a tenth of the CPU of a poll under load).

Few places must not mean that one slow call (a large upload, a fork, a query behind a
lock) holds every other request up. A call that has held its place for ``slow_s``
(``GATE_SLOW_S``, 50 ms: a hundred times a poll's) lends it to the longest-waiting
call and runs on without one, so a slow call delays the queue by that much at most,
and the short calls that make up the load still run one at a time. A call also keeps
its place while it waits on a lock (the SQLite write lock) for less than that:
lending the place for such waits was measured and let more threads contend again
(pollers got a quarter less done).

The gate is a throughput measure, never a reason to stall: a call that has waited
``wait_s`` for a place (the queue is longer than the server can serve) starts anyway
(counted in ``overflows``, logged at most once a minute). A watchdog thread, started
on the first wait, lends the places and starts such calls; it sleeps while nothing
waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# How long a call waits for a place among the running ones before it runs anyway.
GATE_WAIT_S = 1.0
# How long a call holds its place before it lends it to the next waiting call.
GATE_SLOW_S = 0.05
# At most one warning about calls that ran over the limit per this many seconds.
GATE_WARNING_INTERVAL_S = 60.0


@dataclass(slots=True, eq=False)
class Place:
    """A running call's place: counted against the limit while ``held``."""

    since: float
    held: bool = True


# Starts a call: with a place among the running ones, or over the limit (None). The
# call hands the place back with ``RunningGate.leave`` when it is over.
Start = Callable[[Place | None], None]


@dataclass(slots=True)
class _Waiting:
    start: Start
    since: float


class RunningGate:
    """At most ``limit`` request calls run their sync code at once (``0``: no limit);
    the others wait in arrival order."""

    def __init__(
        self, *, limit: int, wait_s: float = GATE_WAIT_S, slow_s: float = GATE_SLOW_S
    ) -> None:
        self.limit = max(0, limit)
        self.wait_s = wait_s
        self.slow_s = slow_s
        self.overflows = 0
        self.lent = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._held: deque[Place] = deque()  # the places counted now, oldest first
        self._waiting: deque[_Waiting] = deque()
        self._watchdog: threading.Thread | None = None
        self._watchdog_idle = False  # asleep until a call waits (no deadline)
        self._warned_at = -GATE_WARNING_INTERVAL_S

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def enter(self, start: Start) -> None:
        """Start a call now if a place is free; otherwise when one is, or after ``wait_s``."""
        if not self.limit:
            start(None)
            return
        with self._lock:
            if len(self._held) < self.limit:
                place = self._hold()
            else:
                self._waiting.append(_Waiting(start, time.monotonic()))
                if self._watchdog is None:
                    self._watchdog = threading.Thread(
                        target=self._watch, name="request-gate-watchdog", daemon=True
                    )
                    self._watchdog.start()
                elif self._watchdog_idle:
                    # Woken only from its sleep without a deadline: in a timed sleep it
                    # wakes by the earliest deadline the new call can have. Under load
                    # the queue empties and fills hundreds of times a second, and
                    # waking a thread each time cost the event loop as much as a poll.
                    self._watchdog_idle = False
                    self._changed.notify()
                return
        start(place)

    def leave(self, place: Place | None) -> None:
        """A call is over: its place (unless already lent) goes to the longest-waiting
        call, if any."""
        if place is None:
            return
        with self._lock:
            if not place.held:
                return
            place.held = False
            self._held.remove(place)
            if not self._waiting:
                return
            successor = self._waiting.popleft()
            handed = self._hold()
        successor.start(handed)

    def _hold(self) -> Place:
        """A new place, counted (with the lock held)."""
        place = Place(time.monotonic())
        self._held.append(place)
        return place

    def _watch(self) -> None:
        """Lend the places of calls that have run ``slow_s``, and start calls that have
        waited ``wait_s``, while calls wait."""
        while True:
            with self._lock:
                while not self._waiting:
                    self._watchdog_idle = True
                    self._changed.wait()
                self._watchdog_idle = False
                now = time.monotonic()
                starts: list[tuple[_Waiting, Place | None]] = []
                while self._waiting and self._held and now - self._held[0].since >= self.slow_s:
                    slow = self._held.popleft()
                    slow.held = False  # it runs on without a place
                    self.lent += 1
                    starts.append((self._waiting.popleft(), self._hold()))
                overflowed = bool(self._waiting) and now - self._waiting[0].since >= self.wait_s
                if overflowed:
                    starts.append((self._waiting.popleft(), None))
                    self.overflows += 1
                    count = self.overflows
                    warn = now - self._warned_at >= GATE_WARNING_INTERVAL_S
                    if warn:
                        self._warned_at = now
                if not starts:
                    deadlines = [self._waiting[0].since + self.wait_s]
                    if self._held:
                        deadlines.append(self._held[0].since + self.slow_s)
                    self._changed.wait(min(deadlines) - now)
                    continue
            if overflowed and warn:
                log.warning(
                    "a request call waited %.1f s for one of the %d running places and ran "
                    "anyway (%d so far): more requests arrive than the process serves; "
                    "OMNIGENT_REQUEST_THREADS_RUNNING sets the limit",
                    self.wait_s,
                    self.limit,
                    count,
                )
            for waiting, place in starts:
                try:
                    waiting.start(place)
                except Exception:
                    log.exception("could not start a request call that waited for a place")
