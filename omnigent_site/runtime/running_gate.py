"""How many request calls run their sync code at once (``OMNIGENT_REQUEST_THREADS_RUNNING``).

Having a thread is not the same as running on it. Every thread that runs Python
competes for the one GIL, and each SQLite call or socket write hands the GIL to
another thread. With twenty snapshot pollers, twenty request threads took turns at it
and a poll cost about twice its CPU alone; with two running at once (the others wait
on a semaphore, holding no GIL) the poller benchmark went from 16–36 to 34–46 turns/s
at a third less server CPU per turn (``docs/performance.md``).

A call keeps its place while it waits on a lock (the SQLite write lock): lending the
place to a queued call for that time was measured and let more threads contend again
(pollers got a quarter less done). The gate is a throughput measure, never a reason
to stall: a call that has waited ``wait_s`` for a place runs anyway (counted in
``overflows``, logged at most once a minute).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

# How long a call waits for a place among the running ones before it runs anyway.
GATE_WAIT_S = 1.0
# At most one warning about calls that ran over the limit per this many seconds.
GATE_WARNING_INTERVAL_S = 60.0


class _Holding(threading.local):
    """What the current thread holds: the gate it runs under, and whether it has a place
    (False after an overflow)."""

    gate: RunningGate | None = None
    has_place = False


_holding = _Holding()


class RunningGate:
    """At most ``limit`` request calls run their sync code at once (``0``: no limit).

    A call made inside a running call (on the same thread) does not wait again.
    """

    def __init__(self, *, limit: int, wait_s: float = GATE_WAIT_S) -> None:
        self.limit = max(0, limit)
        self.wait_s = wait_s
        self._semaphore = threading.BoundedSemaphore(self.limit) if self.limit else None
        self._lock = threading.Lock()
        self.overflows = 0
        self._warned_at = -GATE_WARNING_INTERVAL_S

    @contextmanager
    def running(self) -> Iterator[None]:
        if self._semaphore is None or _holding.gate is not None:
            yield
            return
        _holding.gate = self
        _holding.has_place = self._take_place()
        try:
            yield
        finally:
            if _holding.has_place:
                self._semaphore.release()
            _holding.gate, _holding.has_place = None, False

    def _take_place(self) -> bool:
        assert self._semaphore is not None
        if self._semaphore.acquire(timeout=self.wait_s):
            return True
        self._overflowed()
        return False

    def _overflowed(self) -> None:
        now = time.monotonic()
        with self._lock:
            self.overflows += 1
            warn = now - self._warned_at >= GATE_WARNING_INTERVAL_S
            if warn:
                self._warned_at = now
            count = self.overflows
        if warn:
            log.warning(
                "a request call waited %.1f s for one of the %d running places and ran "
                "anyway (%d so far): calls are slow to finish (a slow query, a held "
                "lock?); OMNIGENT_REQUEST_THREADS_RUNNING sets the limit",
                self.wait_s,
                self.limit,
                count,
            )
