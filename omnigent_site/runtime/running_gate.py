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

The tunnel's event writer, storing what runners report about turns already running,
takes its place here too (``run_ahead_of_requests``), ahead of every waiting request
call, and its place is never lent. When 200 messages were posted at once, the writer
had competed with the burst's request calls for the GIL and the write lock, and every
running turn's stream stood still until the burst was stored (up to 2.7 s); now the
burst waits for the writer's batch instead (``docs/performance.md``, 200 sessions).

The gate is a throughput measure, never a reason to stall: a call that has waited
``wait_s`` for a place (the queue is longer than the server can serve) starts anyway
(counted in ``overflows``, logged at most once a minute). A watchdog thread, started
on the first wait, lends the places and starts such calls; it sleeps while nothing
waits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from channels.db import database_sync_to_async

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a call waits for a place among the running ones before it runs anyway.
GATE_WAIT_S = 1.0
# How long a call holds its place before it lends it to the next waiting call.
GATE_SLOW_S = 0.05
# At most one warning about calls that ran over the limit per this many seconds.
GATE_WARNING_INTERVAL_S = 60.0


@dataclass(slots=True, eq=False)
class Place:
    """A running call's place: counted against the limit while ``held``; a place taken
    ``ahead`` (``RunningGate.enter``) is never lent."""

    since: float
    held: bool = True
    lendable: bool = True


# Starts a call: with a place among the running ones, or over the limit (None). The
# call hands the place back with ``RunningGate.leave`` when it is over.
Start = Callable[[Place | None], None]


@dataclass(slots=True)
class _Waiting:
    start: Start
    since: float
    ahead: bool = False


class RunningGate:
    """At most ``limit`` request calls run their sync code at once (``0``: no limit);
    the others wait in arrival order, behind the calls entered ``ahead``."""

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
        self._ahead: deque[_Waiting] = deque()
        self._waiting: deque[_Waiting] = deque()
        self._watchdog: threading.Thread | None = None
        self._watchdog_idle = False  # asleep until a call waits (no deadline)
        self._warned_at = -GATE_WARNING_INTERVAL_S

    @property
    def waiting(self) -> int:
        return len(self._ahead) + len(self._waiting)

    def enter(self, start: Start, *, ahead: bool = False) -> None:
        """Start a call now if a place is free; otherwise when one is, or after ``wait_s``.

        A call entered ``ahead`` gets the next free place before every other waiting
        call, and keeps it until it is over (it is not lent when slow): the tunnel's
        writer storing what runners report, so turns already running reach their
        watchers while a burst of new requests waits (``run_ahead_of_requests``).
        """
        if not self.limit:
            start(None)
            return
        with self._lock:
            if len(self._held) < self.limit:
                place = self._hold(lendable=not ahead)
            else:
                waiting = _Waiting(start, time.monotonic(), ahead)
                (self._ahead if ahead else self._waiting).append(waiting)
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
        """A call is over: its place (unless already lent) goes to the next waiting call,
        if any."""
        if place is None:
            return
        with self._lock:
            if not place.held:
                return
            place.held = False
            self._held.remove(place)
            if not (self._ahead or self._waiting):
                return
            successor = self._next()
            handed = self._hold(lendable=not successor.ahead)
        successor.start(handed)

    def _next(self) -> _Waiting:
        """The next waiting call, taken from its queue (with the lock held)."""
        return self._ahead.popleft() if self._ahead else self._waiting.popleft()

    def _oldest_queue(self) -> deque[_Waiting]:
        """The queue whose first call has waited longest (one is not empty)."""
        if not self._waiting or (self._ahead and self._ahead[0].since <= self._waiting[0].since):
            return self._ahead
        return self._waiting

    def _oldest_waiting_since(self) -> float:
        return self._oldest_queue()[0].since

    def _hold(self, *, lendable: bool = True) -> Place:
        """A new place, counted (with the lock held)."""
        place = Place(time.monotonic(), lendable=lendable)
        self._held.append(place)
        return place

    def _slowest_lendable(self) -> Place | None:
        """The longest-held place that may be lent (with the lock held)."""
        return next((place for place in self._held if place.lendable), None)

    def _watch(self) -> None:
        """Lend the places of calls that have run ``slow_s``, and start calls that have
        waited ``wait_s``, while calls wait."""
        while True:
            with self._lock:
                while not (self._ahead or self._waiting):
                    self._watchdog_idle = True
                    self._changed.wait()
                self._watchdog_idle = False
                now = time.monotonic()
                starts: list[tuple[_Waiting, Place | None]] = []
                while self._ahead or self._waiting:
                    slow = self._slowest_lendable()
                    if slow is None or now - slow.since < self.slow_s:
                        break
                    self._held.remove(slow)
                    slow.held = False  # it runs on without a place
                    self.lent += 1
                    successor = self._next()
                    starts.append((successor, self._hold(lendable=not successor.ahead)))
                overflowed = bool(self._ahead or self._waiting) and (
                    now - self._oldest_waiting_since() >= self.wait_s
                )
                if overflowed:
                    starts.append((self._oldest_queue().popleft(), None))
                    self.overflows += 1
                    count = self.overflows
                    warn = now - self._warned_at >= GATE_WARNING_INTERVAL_S
                    if warn:
                        self._warned_at = now
                if not starts:
                    deadlines = [self._oldest_waiting_since() + self.wait_s]
                    slow = self._slowest_lendable()
                    if slow is not None:
                        deadlines.append(slow.since + self.slow_s)
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


# The gate of this process's request calls, set when the pooled handler is made.
_request_gate: RunningGate | None = None


def use_request_gate(gate: RunningGate | None) -> None:
    """Make ``gate`` the one ``run_ahead_of_requests`` takes its places from."""
    global _request_gate
    _request_gate = gate


async def run_ahead_of_requests(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Run ``fn(**kwargs)`` as ``database_sync_to_async`` does, once it has a running place
    taken ahead of every request call waiting for one (or without one when the process
    serves no requests through the gate). The wait has the gate's deadline."""
    gate = _request_gate
    call = database_sync_to_async(fn)
    if gate is None or not gate.limit:
        return await call(**kwargs)
    loop = asyncio.get_running_loop()
    placed: asyncio.Future[Place | None] = loop.create_future()

    def hand(place: Place | None) -> None:
        if placed.cancelled():
            gate.leave(place)
        else:
            placed.set_result(place)

    def start(place: Place | None) -> None:
        # Called by whichever thread frees a place: the result is set on the loop.
        loop.call_soon_threadsafe(hand, place)

    gate.enter(start, ahead=True)
    place = await placed
    try:
        return await call(**kwargs)
    finally:
        gate.leave(place)
