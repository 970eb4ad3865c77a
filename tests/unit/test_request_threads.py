"""The pooled request threads of ``omnigent_site.runtime.handler`` (no database, no server)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, reset_queries

from omnigent_site.runtime import handler as handler_module
from omnigent_site.runtime.handler import (
    PooledThreadsASGIHandler,
    RequestThread,
    RequestThreadPool,
)
from omnigent_site.runtime.running_gate import Place, RunningGate


def thread_of(executor: object) -> int:
    return executor.submit(threading.get_ident).result(timeout=10)  # type: ignore[attr-defined]


def test_a_released_thread_serves_the_next_request() -> None:
    pool = RequestThreadPool(max_idle=2)
    first = pool.acquire()
    ident = thread_of(first)
    pool.release(first)
    again = pool.acquire()
    assert again is first
    assert thread_of(again) == ident
    pool.release(again)
    assert pool.idle == 1


def test_concurrent_requests_get_threads_of_their_own() -> None:
    pool = RequestThreadPool(max_idle=4)
    one, two = pool.acquire(), pool.acquire()
    assert one is not two
    assert thread_of(one) != thread_of(two)
    pool.release(one)
    pool.release(two)
    # Most recently released first.
    assert pool.acquire() is two


def test_threads_beyond_the_idle_limit_are_stopped() -> None:
    pool = RequestThreadPool(max_idle=1)
    kept, extra = pool.acquire(), pool.acquire()
    extra_thread = extra.submit(threading.current_thread).result(timeout=10)
    pool.release(kept)
    pool.release(extra)
    assert pool.idle == 1
    extra_thread.join(timeout=10)
    assert not extra_thread.is_alive()
    assert pool.acquire() is kept


def recording_tidy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Replace the end-of-call tidy with a recorder of (what ran, in which thread)."""
    log: list[tuple[str, int]] = []
    monkeypatch.setattr(
        handler_module, "close_old_connections", lambda: log.append(("tidy", threading.get_ident()))
    )
    return log


def test_a_request_keeps_one_thread_for_all_its_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    recording_tidy(monkeypatch)
    pool = RequestThreadPool(max_idle=2)
    request = RequestThread(pool)
    assert not request.leased
    idents = {request.submit(threading.get_ident).result(timeout=10) for _ in range(3)}
    assert len(idents) == 1 and threading.get_ident() not in idents
    assert request.leased and pool.idle == 0
    request.close()
    assert not request.leased and pool.idle == 1


def test_every_call_ends_with_the_connection_tidy_in_its_own_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = recording_tidy(monkeypatch)
    request = RequestThread(RequestThreadPool(max_idle=1))

    def work() -> int:
        log.append(("work", threading.get_ident()))
        return 7

    def broken() -> None:
        log.append(("broken", threading.get_ident()))
        raise RuntimeError("database went away")

    assert request.submit(work).result(timeout=10) == 7
    with pytest.raises(RuntimeError):
        request.submit(broken).result(timeout=10)
    request.close()
    assert [what for what, _ in log] == ["work", "tidy", "broken", "tidy"]
    assert len({ident for _, ident in log}) == 1


def test_a_cancelled_request_returns_its_thread_only_when_its_call_is_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recording_tidy(monkeypatch)
    pool = RequestThreadPool(max_idle=1)
    request = RequestThread(pool)
    gate = threading.Event()
    running = request.submit(gate.wait, 10)
    request.close()  # the request was cancelled; its call is still running
    assert pool.idle == 0
    gate.set()
    handed_back(running)
    assert pool.idle == 1 and not request.leased


def test_after_detach_each_call_borrows_a_thread_while_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recording_tidy(monkeypatch)
    pool = RequestThreadPool(max_idle=4)
    request = RequestThread(pool)
    request.submit(threading.get_ident).result(timeout=10)
    request.detach()
    assert pool.idle == 1 and not request.leased

    # Another request may now use that thread while the streaming one waits.
    other = RequestThread(pool)
    other_ident = other.submit(threading.get_ident).result(timeout=10)
    gate = threading.Event()
    other_busy = other.submit(gate.wait, 10)
    # The streaming request's next call gets a thread of its own meanwhile; calls
    # that overlap stay on one thread, one after another.
    first = request.submit(lambda: (gate.wait(10), threading.get_ident())[1])
    second = request.submit(threading.get_ident)
    assert request.leased
    gate.set()
    assert first.result(timeout=10) == second.result(timeout=10) != other_ident
    handed_back(second)
    assert not request.leased
    handed_back(other_busy)
    other.close()
    assert pool.idle == 2


def handed_back(future: Future[Any]) -> None:
    """Wait until the thread of ``future``'s call has been dealt with: a call's place and
    thread are handed back before its future is done."""
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    assert done.wait(10)


def receivers(signal: signals.Signal, sender: type) -> list[object]:
    # ``send_robust`` returns (receiver, response or error) for every receiver that got
    # the signal; an error (no database in a unit test) does not matter here.
    return [receiver for receiver, _ in signal.send_robust(sender=sender)]


def test_pooled_requests_keep_django_start_of_request_housekeeping() -> None:
    for handler in (PooledThreadsASGIHandler, WSGIHandler, ASGIHandler):
        started = receivers(signals.request_started, handler)
        assert close_old_connections in started
        assert reset_queries in started


class Occupancy:
    """Counts how many calls run at once, and lets them finish when told."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.now = 0
        self.most = 0
        self.release = threading.Event()

    def call(self) -> int:
        with self.changed:
            self.now += 1
            self.most = max(self.most, self.now)
            self.changed.notify_all()
        try:
            self.release.wait(10)
        finally:
            with self.changed:
                self.now -= 1
        return threading.get_ident()

    def wait_for(self, running: int) -> None:
        """Until ``running`` calls have run at the same time (10 s at most)."""
        with self.changed:
            assert self.changed.wait_for(lambda: self.most >= running, timeout=10)


def requests_running(
    pool: RequestThreadPool, calls: int, occupancy: Occupancy
) -> list[Future[int]]:
    return [RequestThread(pool).submit(occupancy.call) for _ in range(calls)]


def test_at_most_the_running_limit_of_requests_run_sync_code_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recording_tidy(monkeypatch)
    pool = RequestThreadPool(max_idle=8, max_running=2)
    pool.gate.slow_s = 60.0  # held until released: no place is lent meanwhile
    occupancy = Occupancy()
    futures = requests_running(pool, 6, occupancy)
    # Two run, each on its request's thread; four wait for a place, holding no thread.
    occupancy.wait_for(2)
    time.sleep(0.1)  # a negative: had the gate let a third in, it would be counted by now
    assert occupancy.now == 2
    assert pool.created == 2 and pool.gate.waiting == 4
    occupancy.release.set()
    for future in futures:
        future.result(timeout=10)
    # Each request got its thread when its call started (none of them ended, so none
    # could hand a thread on to the next).
    assert pool.created == 6
    assert occupancy.most == 2
    assert pool.gate.overflows == 0


def test_no_running_limit_lets_every_request_run(monkeypatch: pytest.MonkeyPatch) -> None:
    recording_tidy(monkeypatch)
    pool = RequestThreadPool(max_idle=8, max_running=0)
    occupancy = Occupancy()
    futures = requests_running(pool, 5, occupancy)
    occupancy.wait_for(5)
    occupancy.release.set()
    for future in futures:
        future.result(timeout=10)
    assert occupancy.most == 5


def test_a_call_that_waited_too_long_runs_anyway_and_is_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Calls stuck in a slow query must not hold the others up for good."""
    recording_tidy(monkeypatch)
    pool = RequestThreadPool(max_idle=4, max_running=1)
    pool.gate.wait_s = 0.05
    pool.gate.slow_s = 60.0  # the place is never lent: the waiting calls overflow
    stuck = Occupancy()
    blocking = RequestThread(pool).submit(stuck.call)
    with caplog.at_level(logging.WARNING, logger="omnigent_site.runtime.running_gate"):
        assert RequestThread(pool).submit(lambda: "ran").result(timeout=10) == "ran"
        assert RequestThread(pool).submit(lambda: "ran too").result(timeout=10) == "ran too"
    assert pool.gate.overflows == 2
    # One warning per minute at most, naming the setting.
    assert sum("OMNIGENT_REQUEST_THREADS_RUNNING" in r.getMessage() for r in caplog.records) == 1
    stuck.release.set()
    blocking.result(timeout=10)
    # The stuck call gave its place back: the next one takes it without waiting.
    assert RequestThread(pool).submit(lambda: "next").result(timeout=10) == "next"
    assert pool.gate.overflows == 2


def one_place_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[RequestThreadPool, Occupancy, Future[int]]:
    """A pool with one running place, held by a call that runs until released."""
    recording_tidy(monkeypatch)
    pool = RequestThreadPool(max_idle=4, max_running=1)
    pool.gate.slow_s = 60.0
    occupancy = Occupancy()
    blocking = RequestThread(pool).submit(occupancy.call)
    occupancy.wait_for(1)
    return pool, occupancy, blocking


def test_waiting_calls_start_in_arrival_order_each_on_its_request_s_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, occupancy, blocking = one_place_taken(monkeypatch)
    order: list[int] = []
    request = RequestThread(pool)
    waiting = [request.submit(order.append, n) for n in range(5)]
    others = [RequestThread(pool).submit(order.append, n) for n in range(5, 8)]
    assert pool.gate.waiting == 8 and not request.leased
    occupancy.release.set()
    blocking.result(timeout=10)
    for future in waiting + others:
        future.result(timeout=10)
    assert order == list(range(8))
    assert len({request.submit(threading.get_ident).result(timeout=10) for _ in range(3)}) == 1
    assert pool.gate.overflows == 0


def test_a_call_cancelled_while_it_waits_never_runs_and_takes_no_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request that goes away (its client disconnected) while its call waits for a
    place: the call is dropped, and the request leaves no thread behind."""
    pool, occupancy, blocking = one_place_taken(monkeypatch)
    ran: list[str] = []
    request = RequestThread(pool)
    waiting = request.submit(ran.append, "cancelled call")
    assert waiting.cancel()
    request.close()
    occupancy.release.set()
    blocking.result(timeout=10)
    # The place went on to the next call: this one does not wait (no overflow).
    assert RequestThread(pool).submit(lambda: "next").result(timeout=10) == "next"
    assert ran == [] and not request.leased
    assert pool.gate.waiting == 0 and pool.gate.overflows == 0
    assert pool.created == 2  # the blocking request's thread, and the last one's


def test_a_call_that_holds_its_place_too_long_lends_it_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One slow call (an upload, a query behind a lock) delays the queue by ``slow_s``
    at most; it runs on without a place, and the limit still holds afterwards."""
    recording_tidy(monkeypatch)
    pool = RequestThreadPool(max_idle=4, max_running=1)
    pool.gate.wait_s = 60.0
    pool.gate.slow_s = 0.05
    slow = Occupancy()
    slow_call = RequestThread(pool).submit(slow.call)
    slow.wait_for(1)
    # The next calls run while the slow one still does: its place was lent, not added.
    assert RequestThread(pool).submit(lambda: "lent").result(timeout=10) == "lent"
    assert RequestThread(pool).submit(lambda: "next").result(timeout=10) == "next"
    assert slow.now == 1 and pool.gate.lent == 1 and pool.gate.overflows == 0
    # The slow call's end hands nothing on (its place is gone), and one place remains.
    slow.release.set()
    slow_call.result(timeout=10)
    pool.gate.slow_s = 60.0
    held = Occupancy()
    futures = requests_running(pool, 2, held)
    held.wait_for(1)
    time.sleep(0.1)  # a negative: a second place would have let the other call in
    assert held.now == 1 and pool.gate.waiting == 1
    held.release.set()
    for future in futures:
        future.result(timeout=10)
    assert held.most == 1 and pool.gate.lent == 1 and pool.gate.overflows == 0


def test_a_call_that_waits_while_the_watchdog_sleeps_to_a_deadline_is_still_lent_a_place() -> None:
    """The watchdog is woken only from its sleep without a deadline. Here it sleeps to the
    deadline of a call that has started since; the next waiting call is not announced
    to it, and still gets the place of the call that holds it too long."""
    gate = RunningGate(limit=1, wait_s=60.0, slow_s=0.3)
    started: dict[str, threading.Event] = {name: threading.Event() for name in "ABC"}
    places: dict[str, Place | None] = {}

    def start(name: str) -> Callable[[Place | None], None]:
        def run(place: Place | None) -> None:
            places[name] = place
            started[name].set()

        return run

    gate.enter(start("A"))
    gate.enter(start("B"))  # waits: the watchdog starts, with A's deadline
    gate.leave(places["A"])  # B starts with A's place
    assert started["B"].is_set()
    gate.enter(start("C"))  # waits behind B, which holds its place past slow_s
    assert started["C"].wait(10)
    assert gate.lent == 1 and gate.overflows == 0 and places["C"] is not None
    gate.leave(places["C"])
    gate.leave(places["B"])  # lent: hands nothing on
    assert gate.waiting == 0


def test_a_queue_that_empties_and_fills_does_not_wake_the_watchdog_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under load the queue of waiting calls empties and fills hundreds of times a
    second; the watchdog, asleep to a deadline, is not woken for each new call."""
    gate = RunningGate(limit=1, wait_s=60.0, slow_s=60.0)
    wakes: list[int] = []
    real_notify = gate._changed.notify

    def notify(n: int = 1) -> None:
        wakes.append(n)
        real_notify(n)

    monkeypatch.setattr(gate._changed, "notify", notify)
    holder: list[Place | None] = []
    gate.enter(holder.append)
    for _ in range(200):
        gate.enter(holder.append)  # waits for the place
        gate.leave(holder.pop(0))  # and gets it at once: the queue is empty again
    assert gate.waiting == 0 and gate.overflows == 0 and len(holder) == 1
    assert len(wakes) < 20  # each new call woke it before: 199 here


def test_a_failing_call_gives_its_place_and_thread_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recording_tidy(monkeypatch)
    pool = RequestThreadPool(max_idle=4, max_running=1)
    request = RequestThread(pool)

    def broken() -> None:
        raise KeyError("gone")

    with pytest.raises(KeyError):
        request.submit(broken).result(timeout=10)
    request.close()
    assert pool.idle == 1 and not request.leased
    assert RequestThread(pool).submit(lambda: 1).result(timeout=10) == 1
    assert pool.gate.overflows == 0


def test_the_server_handler_takes_the_limit_from_the_settings(
    settings: Any,
) -> None:
    settings.OMNIGENT_REQUEST_THREADS_RUNNING = 3
    settings.OMNIGENT_REQUEST_THREADS_IDLE = 5
    app = handler_module.get_pooled_asgi_application()
    assert app.threads.gate.limit == 3 and app.threads.max_idle == 5


class Starts:
    """Records which calls a gate started, with their places."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.places: dict[str, Place | None] = {}
        self.events: dict[str, threading.Event] = {}

    def start(self, name: str) -> Callable[[Place | None], None]:
        self.events[name] = threading.Event()

        def run(place: Place | None) -> None:
            self.order.append(name)
            self.places[name] = place
            self.events[name].set()

        return run


def the_writer_waiting_behind(running: str) -> tuple[RunningGate, Starts]:
    """A gate of one place held by ``running``, a request waiting, then the event writer
    entered ahead (slow_s 50 ms)."""
    gate = RunningGate(limit=1, wait_s=60.0, slow_s=0.05)
    starts = Starts()
    gate.enter(starts.start(running))
    gate.enter(starts.start("request"))
    gate.enter(starts.start("runner events"), ahead=True)
    return gate, starts


def test_a_call_entered_ahead_starts_before_the_waiting_calls_and_is_never_lent() -> None:
    gate, starts = the_writer_waiting_behind("request A")
    gate.leave(starts.places["request A"])
    assert starts.order == ["request A", "runner events"]
    # Held far past slow_s, the writer's place is not lent to the waiting request.
    time.sleep(0.3)  # a negative: six times slow_s, the watchdog would have lent it
    assert starts.order == ["request A", "runner events"] and gate.lent == 0
    gate.leave(starts.places["runner events"])
    assert starts.order == ["request A", "runner events", "request"]
    gate.leave(starts.places["request"])
    assert gate.waiting == 0


def test_a_slow_request_lends_its_place_to_a_call_waiting_ahead_first() -> None:
    gate, starts = the_writer_waiting_behind("slow request")
    assert starts.events["runner events"].wait(10)
    assert starts.order == ["slow request", "runner events"] and gate.lent == 1
    assert starts.places["runner events"] is not None
    gate.leave(starts.places["runner events"])
    assert starts.order[-1] == "request"


def test_a_call_waiting_ahead_has_the_gates_deadline_too() -> None:
    gate = RunningGate(limit=1, wait_s=0.1, slow_s=60.0)
    starts = Starts()
    gate.enter(starts.start("runner events"), ahead=True)
    gate.enter(starts.start("more runner events"), ahead=True)  # the place is never lent
    assert starts.events["more runner events"].wait(10)
    assert starts.places["more runner events"] is None and gate.overflows == 1


@pytest.mark.timeout(30)
@pytest.mark.django_db  # the call closes stale connections of the thread, as Channels' calls do
def test_run_ahead_of_requests_runs_before_the_waiting_request_calls() -> None:
    import asyncio

    from omnigent_site.runtime.running_gate import run_ahead_of_requests, use_request_gate

    gate = RunningGate(limit=1, wait_s=60.0, slow_s=60.0)
    starts = Starts()
    order: list[str] = []

    def store() -> str:
        order.append("runner events")
        return "stored"

    async def scenario() -> None:
        gate.enter(starts.start("request A"))
        gate.enter(starts.start("request B"))
        writer = asyncio.ensure_future(run_ahead_of_requests(store))
        await asyncio.sleep(0)  # it enters the gate before its first wait
        assert gate.waiting == 2 and not writer.done()
        gate.leave(starts.places["request A"])
        assert await asyncio.wait_for(writer, 10) == "stored"
        # Its place went back and on to the request that waited.
        assert starts.order == ["request A", "request B"]

    use_request_gate(gate)
    try:
        asyncio.run(scenario())
    finally:
        use_request_gate(None)
    assert order == ["runner events"]
    gate.leave(starts.places["request B"])
    assert gate.waiting == 0


@pytest.mark.timeout(30)
@pytest.mark.django_db
def test_a_call_ahead_cancelled_while_it_waits_gives_the_place_it_gets_back() -> None:
    import asyncio

    from omnigent_site.runtime.running_gate import run_ahead_of_requests, use_request_gate

    gate = RunningGate(limit=1, wait_s=60.0, slow_s=60.0)
    starts = Starts()

    async def scenario() -> None:
        gate.enter(starts.start("request A"))
        writer = asyncio.ensure_future(run_ahead_of_requests(lambda: None))
        await asyncio.sleep(0)  # it enters the gate before its first wait
        assert gate.waiting == 1
        writer.cancel()
        gate.enter(starts.start("request B"))
        gate.leave(starts.places["request A"])  # to the cancelled call, which hands it on
        await asyncio.sleep(0)  # the hand-over runs on the loop, in its next round

    use_request_gate(gate)
    try:
        asyncio.run(scenario())
    finally:
        use_request_gate(None)
    assert starts.order == ["request A", "request B"]
