"""The queue of turns waiting for a runner slot, as sessions read it (usage.md, Fair
share of runners): who waits, and each waiting turn's place.

``runners.scheduler`` decides which turns start; this module holds the order it uses,
so a snapshot can show a place without importing the runners app. A place is computed
when read, never stored: every start would move the place of every turn behind it.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from django.db.models import Max
from typing_extensions import TypedDict

from .models import Session, Turn


class QueuedTurnOut(TypedDict):
    """A turn waiting for a runner slot and its place in that runner's queue (1: next)."""

    response_id: str
    position: int


@dataclass(frozen=True, slots=True)
class Waiting:
    """A turn waiting for a slot, as the planner sees it."""

    seq: int
    response_id: str
    session_id: str
    runner_id: str | None
    user_id: int | None
    # The session's ``queued_turns`` as stored (read with the turn, in the claim's lock).
    stored_queue: tuple[str, ...] = field(default=(), compare=False)


def later_than(times: dict[int | None, float]) -> float:
    """A time later than every one in ``times`` (and than now)."""
    return max([time.time(), *times.values()]) + 1.0


def positions(
    waiting: Iterable[Waiting],
    *,
    running_for: Counter[int | None],
    last_started: dict[int | None, float],
) -> dict[str, list[QueuedTurnOut]]:
    """Each waiting turn's place in its runner's queue, by session.

    The place is the order the turns would start in if that runner's slots freed one
    at a time, by the scheduler's rule: the user holding the fewest slots
    (``running_for``), then the one served the longest ago (``last_started``), then the
    oldest turn; caps aside. 1: the next to start.
    """
    by_runner: dict[str | None, dict[int | None, list[Waiting]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for turn in sorted(waiting, key=lambda turn: turn.seq):
        by_runner[turn.runner_id][turn.user_id].append(turn)
    placed: dict[str, list[QueuedTurnOut]] = defaultdict(list)
    for users in by_runner.values():
        counts = Counter(running_for)
        last = dict(last_started)
        queues = list(users.values())
        heap = [
            (counts[turns[0].user_id], last.get(turns[0].user_id, -math.inf), turns[0].seq, index)
            for index, turns in enumerate(queues)
        ]
        heapq.heapify(heap)
        taken = [0] * len(queues)
        position = 0
        while heap:
            index = heapq.heappop(heap)[-1]
            turns = queues[index]
            turn = turns[taken[index]]
            taken[index] += 1
            position += 1
            placed[turn.session_id].append({"response_id": turn.response_id, "position": position})
            user = turn.user_id
            counts[user] += 1
            last[user] = later_than(last)
            if taken[index] < len(turns):
                following = turns[taken[index]]
                heapq.heappush(heap, (counts[user], last[user], following.seq, index))
    return dict(placed)


def waiting_turns(*, runner_id: str | None = None) -> list[Waiting]:
    """The turns waiting for a slot, oldest first (of one runner's sessions if given)."""
    turns = Turn.objects.filter(status=Turn.Status.QUEUED, dispatched_at__isnull=True)
    if runner_id is not None:
        turns = turns.filter(session__runner_id=runner_id)
    rows = turns.order_by("seq").values_list(
        "seq", "id", "session_id", "session__runner_id", "user_id", "session__queued_turns"
    )
    return [
        Waiting(seq, rid, sid, runner, user, tuple(str(entry) for entry in stored or ()))
        for seq, rid, sid, runner, user, stored in rows
    ]


def last_started(user_ids: Collection[int | None]) -> dict[int | None, float]:
    """When each user last got a slot (a timestamp), for those who ever did."""
    latest = (
        Turn.objects.filter(
            user_id__in=[user for user in user_ids if user is not None],
            dispatched_at__isnull=False,
        )
        .values("user_id")
        .annotate(last=Max("dispatched_at"))
        .values_list("user_id", "last")
    )
    return {user: last.timestamp() for user, last in latest}


def slots_held(user_ids: Collection[int | None]) -> Counter[int | None]:
    """How many sessions of each user hold a slot (have a dispatched open turn)."""
    held = (
        Turn.objects.filter(
            status__in=Turn.OPEN_STATUSES,
            dispatched_at__isnull=False,
            user_id__in=[user for user in user_ids if user is not None],
        )
        .values_list("user_id", "session_id")
        .distinct()
    )
    return Counter(user for user, _session in held)


def places(session: Session) -> list[QueuedTurnOut]:
    """The session's waiting turns with their places now; no query when none waits."""
    if not session.queued_turns or session.runner_id is None:
        return []
    waiting = waiting_turns(runner_id=session.runner_id)
    if not any(turn.session_id == session.id for turn in waiting):
        return []
    users = {turn.user_id for turn in waiting}
    return positions(waiting, running_for=slots_held(users), last_started=last_started(users)).get(
        session.id, []
    )
