"""How many request calls run their sync code at once (``OMNIGENT_REQUEST_THREADS_RUNNING``).

Having a thread is not the same as running on it. Every thread that runs Python
competes for the one GIL, and each SQLite call or socket write hands the GIL to
another thread. With twenty snapshot pollers, twenty request threads took turns at it
and a poll cost about twice its CPU alone; with two running at once the poller
benchmark went from 16–36 to 34–46 turns/s at a third less server CPU per turn
(``docs/performance.md``).

A call that finds no place waits in a queue, not on a thread: it gets its request's
thread only when it starts. So twenty requests queued behind two running ones hold
two threads, not twenty, and the idle threads the pool keeps (each with its database
connection and the row plans of ``rawsql``) are enough; with a thread per waiting call
the pool overflowed under pollers, and every overflow started a thread and opened a
database connection (a tenth of the CPU of a poll under load).

A call keeps its place while it waits on a lock (the SQLite write lock): lending the
place to a queued call for that time was measured and let more threads contend again
(pollers got a quarter less done). The gate is a throughput measure, never a reason
to stall: a call that has waited ``wait_s`` for a place starts anyway (counted in
``overflows``, logged at most once a minute). A watchdog thread, started on the first
wait, starts such calls; it sleeps while nothing waits.
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
# At most one warning about calls that ran over the limit per this many seconds.
GATE_WARNING_INTERVAL_S = 60.0

# Starts a call: with a place among the running ones (True) or over the limit (False).
# The call hands the place back with ``RunningGate.leave`` when it is over.
Start = Callable[[bool], None]


@dataclass(slots=True)
class _Waiting:
    start: Start
    since: float


class RunningGate:
    """At most ``limit`` request calls run their sync code at once (``0``: no limit);
    the others wait in arrival order."""

    def __init__(self, *, limit: int, wait_s: float = GATE_WAIT_S) -> None:
        self.limit = max(0, limit)
        self.wait_s = wait_s
        self.overflows = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._running = 0
        self._waiting: deque[_Waiting] = deque()
        self._watchdog: threading.Thread | None = None
        self._warned_at = -GATE_WARNING_INTERVAL_S

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def enter(self, start: Start) -> None:
        """Start a call now if a place is free; otherwise when one is, or after ``wait_s``."""
        if not self.limit:
            start(False)
            return
        with self._lock:
            if self._running < self.limit:
                self._running += 1
            else:
                self._waiting.append(_Waiting(start, time.monotonic()))
                if self._watchdog is None:
                    self._watchdog = threading.Thread(
                        target=self._watch, name="request-gate-watchdog", daemon=True
                    )
                    self._watchdog.start()
                elif len(self._waiting) == 1:
                    self._changed.notify()  # the watchdog sleeps while nothing waits
                return
        start(True)

    def leave(self, place: bool) -> None:
        """A call is over: its place goes to the longest-waiting call, if any."""
        if not place:
            return
        with self._lock:
            if not self._waiting:
                self._running -= 1
                return
            successor = self._waiting.popleft()
        successor.start(True)

    def _watch(self) -> None:
        """Start calls that have waited ``wait_s`` without a place."""
        while True:
            with self._lock:
                while not self._waiting:
                    self._changed.wait()
                oldest = self._waiting[0]
                late = oldest.since + self.wait_s - time.monotonic()
                if late > 0:
                    self._changed.wait(late)
                    continue
                self._waiting.popleft()
                self.overflows += 1
                count = self.overflows
                now = time.monotonic()
                warn = now - self._warned_at >= GATE_WARNING_INTERVAL_S
                if warn:
                    self._warned_at = now
            if warn:
                log.warning(
                    "a request call waited %.1f s for one of the %d running places and ran "
                    "anyway (%d so far): calls are slow to finish (a slow query, a held "
                    "lock?); OMNIGENT_REQUEST_THREADS_RUNNING sets the limit",
                    self.wait_s,
                    self.limit,
                    count,
                )
            try:
                oldest.start(False)
            except Exception:
                log.exception("could not start a request call that waited for a place")
