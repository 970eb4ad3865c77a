"""Fair share of runners (usage.md): which waiting turns start, in what order.

A runner runs a session's turns one after the other, so the turns it runs at once are
its sessions that hold a **slot**: a session holds one while it has a dispatched turn
(``Turn.dispatched_at`` set, its ``turn.start`` sent) that has not ended. A runner
holds at most ``Runner.max_turns`` slots (declared in its ``hello``), a user at most
``OMNIGENT_MAX_RUNNING_TURNS_PER_USER`` across all runners. A message to a session that
holds a slot joins it and goes to the runner at once, as before; any other turn waits
``queued`` with ``dispatched_at`` unset until a slot frees. The queue is the ``Turn``
table, so it survives a restart.

Whoever may have freed a slot or added a turn calls :func:`claim`: a message's view
after storing it, the writer of a turn's end once that commits, a runner's ``hello``.
It plans in one transaction under one lock (PostgreSQL: a transaction-level advisory
lock; SQLite: the write lock every transaction takes), so two server processes never
start the same turn or go past a cap. The next free slot goes to the user with the
fewest slots, then to the one served the longest ago, then to the oldest turn:
round-robin between users, so one user's 50 turns cannot starve another's one. A
message's common case skips the claim: with nothing waiting and a slot free, its turn is
stored dispatched (:func:`starts_at_once`). ``Session.queued_turns`` lists a session's
waiting turns (written with a ``session.queue`` event when that changes); their places
are computed when read (``sessions.turn_queue``).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from omnigent_site.rawsql import quoted
from sessions.eventlog import record_event
from sessions.models import Session, Turn
from sessions.stream_events import session_queue_event
from sessions.turn_queue import (
    QueuedTurnOut,
    Waiting,
    last_started,
    later_than,
    positions,
    waiting_turns,
)

from .models import Runner

# The key of the advisory lock every claim takes on PostgreSQL (any constant the
# project uses for nothing else).
SCHEDULER_LOCK_KEY = 0x0F41_5C4E


@dataclass(slots=True)
class Slots:
    """Who holds slots now (``running_on``/``running_for`` count sessions);
    ``capacity`` has the online runners only."""

    capacity: dict[str, int]
    running_on: Counter[str] = field(default_factory=Counter)
    running_for: Counter[int | None] = field(default_factory=Counter)
    busy_sessions: set[str] = field(default_factory=set)
    user_cap: int = 0  # 0: none
    # When each user last got a slot (a timestamp; never: absent): the longest unserved
    # goes first among users holding as many slots.
    last_started: dict[int | None, float] = field(default_factory=dict)

    def order(self, turn: Waiting) -> tuple[int, float, int]:
        """Who takes a free slot first: the fewest slots held, then the longest since
        the user last got one, then the oldest turn."""
        user = turn.user_id
        return (self.running_for[user], self.last_started.get(user, -math.inf), turn.seq)

    def joins(self, turn: Waiting) -> bool:
        """The turn's session holds a slot: the runner runs it after the one before."""
        return turn.runner_id in self.capacity and turn.session_id in self.busy_sessions

    def can_start(self, turn: Waiting) -> bool:
        """A free slot on its runner, and its user under the cap."""
        runner = turn.runner_id
        if runner is None or runner not in self.capacity:
            return False
        if self.running_on[runner] >= self.capacity[runner]:
            return False
        return not (self.user_cap and self.running_for[turn.user_id] >= self.user_cap)

    def take(self, turn: Waiting) -> None:
        assert turn.runner_id is not None
        self.running_on[turn.runner_id] += 1
        self.running_for[turn.user_id] += 1
        self.busy_sessions.add(turn.session_id)
        self.last_started[turn.user_id] = later_than(self.last_started)


def plan(waiting: Sequence[Waiting], slots: Slots) -> list[Waiting]:
    """The waiting turns (oldest first) to start now, in the order they take slots.

    A turn whose session holds a slot starts with it. Each free slot goes to the
    startable turn whose user holds the fewest slots (counting those this plan gives),
    then whose user got one the longest ago, then the oldest (``Slots.order``); a
    session's turns start in order. ``slots`` is updated with what the plan starts.
    """
    remaining = list(waiting)
    started: list[Waiting] = []
    while True:
        best: Waiting | None = None
        best_key: tuple[int, float, int] | None = None
        seen: set[str] = set()
        for turn in remaining:
            if turn.session_id in seen:
                continue  # behind an older turn of its session
            seen.add(turn.session_id)
            if slots.joins(turn):
                best = turn
                break
            if not slots.can_start(turn):
                continue
            key = slots.order(turn)
            if best_key is None or key < best_key:
                best, best_key = turn, key
        if best is None:
            return started
        remaining.remove(best)
        if not slots.joins(best):
            slots.take(best)
        started.append(best)


@dataclass(frozen=True, slots=True)
class Claimed:
    """A turn the caller now owns the start of: it sends its ``turn.start``."""

    session_id: str
    response_id: str
    runner_id: str


def _lock() -> None:
    """Serialise claims across server processes for the rest of the transaction."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SCHEDULER_LOCK_KEY])
    # SQLite: every transaction of this project is IMMEDIATE, the database's one
    # write lock, taken by ``atomic`` already.


def _slots(waiting: Sequence[Waiting], known: Collection[Runner]) -> Slots:
    runner_ids = {turn.runner_id for turn in waiting if turn.runner_id is not None}
    user_ids = {turn.user_id for turn in waiting}
    rows = {runner.id: runner for runner in known if runner.id in runner_ids}
    if runner_ids - rows.keys():
        rows.update(
            (runner.id, runner) for runner in Runner.objects.filter(pk__in=runner_ids - rows.keys())
        )
    capacity = {runner.id: runner.max_turns for runner in rows.values() if runner.online}
    slots = Slots(capacity=capacity, user_cap=settings.OMNIGENT_MAX_RUNNING_TURNS_PER_USER)
    by_user = Q(user_id__in=[user for user in user_ids if user is not None])
    if None in user_ids:
        by_user |= Q(user_id__isnull=True)
    holding = (
        Turn.objects.filter(status__in=Turn.OPEN_STATUSES, dispatched_at__isnull=False)
        .filter(Q(session__runner_id__in=runner_ids) | by_user)
        .values_list("session_id", "session__runner_id", "user_id")
        .distinct()
    )
    on_runner: set[tuple[str, str]] = set()
    for_user: set[tuple[int | None, str]] = set()
    for session_id, runner_id, user_id in holding:
        if runner_id in runner_ids:
            on_runner.add((runner_id, session_id))
        if user_id in user_ids:
            for_user.add((user_id, session_id))
        slots.busy_sessions.add(session_id)
    slots.running_on.update(runner for runner, _session in on_runner)
    slots.running_for.update(user for user, _session in for_user)
    if len(user_ids) > 1:  # one user's turns go oldest first whenever it was served
        slots.last_started.update(last_started(user_ids))
    return slots


def claim(*, touched: Collection[str] = (), runners: Collection[Runner] = ()) -> list[Claimed]:
    """Start what can start: mark those turns dispatched and return them (the caller
    sends each one's ``turn.start``); record which turns of each session still wait.

    ``touched``: sessions whose waiting turns may have changed (a message added one, a
    turn ended), so their stored list is brought up to date even when none of their
    turns waits any more. ``runners``: runner rows the caller read already (a message's
    request has its session's), taken as they are for capacity and liveness.
    """
    with transaction.atomic():
        _lock()
        waiting = waiting_turns()
        started: list[Waiting] = []
        slots = Slots(capacity={})
        if waiting:
            slots = _slots(waiting, runners)
            started = plan(waiting, slots)
            if started:
                Turn.objects.filter(seq__in=[turn.seq for turn in started]).update(
                    dispatched_at=timezone.now()
                )
        chosen = {turn.seq for turn in started}
        left = [turn for turn in waiting if turn.seq not in chosen]
        places = positions(left, running_for=slots.running_for, last_started=slots.last_started)
        stored = {turn.session_id: list(turn.stored_queue) for turn in waiting}
        _store_queues(places, touched={*touched, *stored}, stored=stored)
    return [
        Claimed(turn.session_id, turn.response_id, turn.runner_id)
        for turn in started
        if turn.runner_id is not None
    ]


def _store_queues(
    places: dict[str, list[QueuedTurnOut]], *, touched: set[str], stored: dict[str, list[str]]
) -> None:
    """Write which of each touched session's turns wait (``Session.queued_turns``) where
    that changed, with a ``session.queue`` event showing their places then. Places
    that only move (a turn ahead started) are not written: a snapshot computes them
    (``turn_queue.places``), so a start costs no write per waiting session."""
    if not touched:
        return
    unknown = touched - stored.keys()  # read with its waiting turns otherwise
    if unknown:
        stored = {
            **stored,
            **dict(Session.objects.filter(pk__in=unknown).values_list("id", "queued_turns")),
        }
    for session_id in touched:
        before = stored.get(session_id)
        shown = places.get(session_id, [])
        after = [entry["response_id"] for entry in shown]
        if (before or []) == after:
            continue
        Session.objects.filter(pk=session_id).update(queued_turns=after)
        record_event(
            session_id=session_id,
            payload=session_queue_event(session_id=session_id, queued_turns=shown),
        )


def try_lock() -> bool:
    """The claims' lock without waiting (PostgreSQL): a caller that holds a session row
    lock must not wait for it, as a claim holding it may wait for that row. SQLite: the
    transaction holds the write lock already."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SCHEDULER_LOCK_KEY])
        return bool(cursor.fetchone()[0])


def starts_at_once(*, session: Session, runner: Runner, user_id: int | None) -> bool:
    """A new turn's fast path (a message's common case), in the transaction that stores
    it with the session row locked: whether :func:`claim` would start it now, decided
    with one query under the claims' lock (kept to the transaction's end, so the turn,
    stored dispatched, counts in every later claim). True only when no turn waits at all
    (so no one is passed over and no stored queue changes), the session's stored queue is
    empty, and the session holds a slot or its runner and user are under their caps; in
    any other case (the lock busy included) False: the turn is stored waiting and a
    claim decides, as before."""
    if session.queued_turns or not runner.online or session.runner_id != runner.id:
        return False
    if not try_lock():
        return False
    with connection.cursor() as cursor:
        cursor.execute(_fast_counts_sql(user_id is None), _fast_counts_params(session, user_id))
        waiting, on_runner, for_user, holding = cursor.fetchone()
    if waiting:
        return False
    if holding:
        return True
    cap = settings.OMNIGENT_MAX_RUNNING_TURNS_PER_USER
    return on_runner < runner.max_turns and not (cap and for_user >= cap)


def _fast_counts_params(session: Session, user_id: int | None) -> list[Any]:
    open_statuses = [str(status) for status in Turn.OPEN_STATUSES]
    user = [] if user_id is None else [user_id]
    return [
        Turn.Status.QUEUED.value,
        *open_statuses,
        session.runner_id,
        *open_statuses,
        *user,
        *open_statuses,
        session.id,
    ]


@functools.cache
def _fast_counts_sql(no_user: bool) -> str:
    """Whether any turn waits; the sessions holding a slot on the runner and of the
    user; whether the session holds one (``_slots``' counts for one turn)."""
    turn, sess = quoted(Turn), quoted(Session)
    status, dispatched = quoted(Turn, "status"), quoted(Turn, "dispatched_at")
    session_col, user = quoted(Turn, "session"), quoted(Turn, "user_id")
    held = f"t.{status} IN (%s, %s) AND t.{dispatched} IS NOT NULL"
    by_user = f"t.{user} IS NULL" if no_user else f"t.{user} = %s"
    return (
        f"SELECT EXISTS (SELECT 1 FROM {turn} t WHERE t.{status} = %s AND t.{dispatched} IS NULL), "
        f"(SELECT COUNT(DISTINCT t.{session_col}) FROM {turn} t JOIN {sess} s "
        f"ON s.{quoted(Session, 'id')} = t.{session_col} "
        f"WHERE {held} AND s.{quoted(Session, 'runner')} = %s), "
        f"(SELECT COUNT(DISTINCT t.{session_col}) FROM {turn} t WHERE {held} AND {by_user}), "
        f"EXISTS (SELECT 1 FROM {turn} t WHERE {held} AND t.{session_col} = %s)"
    )


@functools.cache
def _any_waiting_sql() -> str:
    # The condition is written out as the partial index ``turn_waiting`` states it, so
    # the read is of that index on both databases (a bound status would not match it).
    return (
        f"SELECT 1 FROM {quoted(Turn)} WHERE {quoted(Turn, 'status')} = '{Turn.Status.QUEUED.value}'"
        f" AND {quoted(Turn, 'dispatched_at')} IS NULL LIMIT 1"
    )


def any_waiting() -> bool:
    """Whether any turn waits for a slot (no lock: a claim decides under the lock).

    Asked after every turn that ends, by the tunnel's event writer: written as SQL, it
    costs that writer a sixth less than the queryset did.
    """
    with connection.cursor() as cursor:
        cursor.execute(_any_waiting_sql())
        return cursor.fetchone() is not None


def unstarted_turn_ids(*, session_id: str) -> set[str]:
    """The ids of the session's turns the runner has not started (``queued``: waiting
    for a slot, or dispatched behind another turn of the session)."""
    return set(
        Turn.objects.filter(session_id=session_id, status=Turn.Status.QUEUED).values_list(
            "id", flat=True
        )
    )
