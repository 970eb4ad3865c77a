"""The session-list stream's log: one numbered ``ListEvent`` row per list event per user.

Written in the transaction of the change it reports (``updates.py`` calls it), so an
event exists exactly when its change committed. Each user's events take the next
numbers of the user's ``ListCursor`` row with an upsert that locks it until the
commit, so one user's numbers follow the order in which their writes commit, and a
list that has seen ``n`` has seen every event numbered up to ``n``. Users are
numbered in ascending order within a statement, so two writers never wait for each
other's cursors in opposite orders.

Cost: a list event of one session (the one a turn's status change makes) is one
statement on PostgreSQL (the numbers and the rows in one ``INSERT`` with a
data-modifying ``WITH``), two on SQLite (no ``WITH`` for writes there; no network
between them either). Every ``PRUNE_EVERY`` numbers of a user, one ``DELETE`` drops
what is older than the retention (``OMNIGENT_LIST_EVENT_RETENTION`` events and
``OMNIGENT_LIST_EVENT_RETENTION_S`` seconds: a row goes only when it is out of both).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from omnigent_site.rawsql import insert_rows, quoted

from .models import ListCursor, ListEvent, Permission

PRUNE_EVERY = 100

# (user pk, session id) -> the number of that user's event about that session.
Numbered = dict[tuple[int, str], int]


def _created_at(now: datetime) -> Any:
    return ListEvent._meta.get_field("created_at").get_db_prep_value(now, connection)


@functools.cache
def _upsert(adds: str) -> tuple[str, str]:
    """The cursor upsert around its rows: each user's ``last_seq`` plus ``adds``, the
    new values returned."""
    cursor, user, last = (
        quoted(ListCursor),
        quoted(ListCursor, "user"),
        quoted(ListCursor, "last_seq"),
    )
    return (
        f"INSERT INTO {cursor} ({user}, {last}) ",
        f" ON CONFLICT ({user}) DO UPDATE SET {last} = {cursor}.{last} + {adds} "
        f"RETURNING {user}, {last}",
    )


@functools.cache
def _grantees_sql(*, one_user: bool) -> str:
    """Each grantee of a session (or the one given) takes its next number, in user order."""
    head, tail = _upsert("1")
    user = quoted(Permission, "user")
    where = f"{quoted(Permission, 'session')} = %s"
    if one_user:
        where += f" AND {user} = %s"
    return f"{head}SELECT {user}, 1 FROM {quoted(Permission)} WHERE {where} ORDER BY {user}{tail}"


@functools.cache
def _grantees_with_rows_sql(*, one_user: bool) -> str:
    """PostgreSQL: ``_grantees_sql`` and the event rows in one statement."""
    columns = ", ".join(quoted(ListEvent, name) for name in _EVENT_COLUMNS)
    return (
        f"WITH numbered AS ({_grantees_sql(one_user=one_user)}) "
        f"INSERT INTO {quoted(ListEvent)} ({columns}) "
        f"SELECT {quoted(ListCursor, 'user')}, {quoted(ListCursor, 'last_seq')}, %s, %s, %s "
        f"FROM numbered RETURNING {quoted(ListEvent, 'user')}, {quoted(ListEvent, 'seq')}"
    )


_EVENT_COLUMNS = ("user", "seq", "session_id", "kind", "created_at")


@functools.lru_cache(maxsize=64)
def _counts_sql(users: int) -> str:
    """Users given with how many numbers each takes (``VALUES``, in user order)."""
    head, tail = _upsert("excluded." + quoted(ListCursor, "last_seq"))
    values = ", ".join(["(%s, %s)"] * users)
    return f"{head}VALUES {values}{tail}"


def record_session(*, session_id: str, kind: str, only: int | None = None) -> Numbered:
    """One event about the session for each of its grantees (or for user ``only``, if a
    grantee): their numbers."""
    now = timezone.now()
    params: list[Any] = [session_id] if only is None else [session_id, only]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                _grantees_with_rows_sql(one_user=only is not None),
                [*params, session_id, kind, _created_at(now)],
            )
            numbers = {(int(user), session_id): int(seq) for user, seq in cursor.fetchall()}
        else:
            cursor.execute(_grantees_sql(one_user=only is not None), params)
            numbers = {(int(user), session_id): int(seq) for user, seq in cursor.fetchall()}
            _insert(numbers, kinds={session_id: kind}, now=now)
    _prune(numbers, taken=Counter(user for user, _session in numbers), now=now)
    return numbers


def record_removed(*, session_id: str, user_pks: Iterable[int]) -> Numbered:
    """One ``removed`` event about the session for each of these users: their numbers."""
    return record_pairs([(user, session_id) for user in set(user_pks)], kind=ListEvent.Kind.REMOVED)


def runner_pairs(*, runner_id: str) -> list[tuple[int, str]]:
    """(grantee, session) for every session bound to the runner."""
    return list(
        Permission.objects.filter(session__runner_id=runner_id)
        .order_by()
        .values_list("user_id", "session_id")
    )


def record_pairs(pairs: Sequence[tuple[int, str]], *, kind: str) -> Numbered:
    """One event of ``kind`` for each (user, session): their numbers. A user's events
    are numbered in session id order."""
    if not pairs:
        return {}
    now = timezone.now()
    taken = Counter(user for user, _session in pairs)
    users = sorted(taken)
    with connection.cursor() as cursor:
        cursor.execute(
            _counts_sql(len(users)), [value for user in users for value in (user, taken[user])]
        )
        last = {int(user): int(seq) for user, seq in cursor.fetchall()}
    numbers: Numbered = {}
    for user in users:
        sessions = sorted(session for pair_user, session in pairs if pair_user == user)
        first = last[user] - len(sessions) + 1
        for offset, session in enumerate(sessions):
            numbers[(user, session)] = first + offset
    _insert(numbers, kinds={session: kind for _user, session in pairs}, now=now)
    _prune(numbers, taken=taken, now=now)
    return numbers


def _insert(numbers: Numbered, *, kinds: dict[str, str], now: datetime) -> None:
    insert_rows(
        ListEvent,
        [
            ListEvent(
                user_id=user, seq=seq, session_id=session, kind=kinds[session], created_at=now
            )
            for (user, session), seq in numbers.items()
        ],
    )


def _prune(numbers: Numbered, *, taken: Counter[int], now: datetime) -> None:
    """For each user whose numbers crossed a multiple of ``PRUNE_EVERY``: drop the events
    older than both retentions."""
    newest: dict[int, int] = {}
    for (user, _session), seq in numbers.items():
        newest[user] = max(seq, newest.get(user, 0))
    keep = int(settings.OMNIGENT_LIST_EVENT_RETENTION)
    cutoff = now - timedelta(seconds=float(settings.OMNIGENT_LIST_EVENT_RETENTION_S))
    for user, last in newest.items():
        if (last - taken[user]) // PRUNE_EVERY != last // PRUNE_EVERY and last > keep:
            ListEvent.objects.filter(
                user_id=user, seq__lte=last - keep, created_at__lt=cutoff
            ).delete()


def bounds(*, user_pk: int) -> tuple[int, int | None]:
    """The user's newest number (0: none yet) and the oldest one still kept (None: none)."""
    last = (
        ListCursor.objects.filter(user_id=user_pk).values_list("last_seq", flat=True).first() or 0
    )
    first = (
        ListEvent.objects.filter(user_id=user_pk)
        .order_by("seq")
        .values_list("seq", flat=True)
        .first()
    )
    return int(last), first


def between(*, user_pk: int, after: int, upto: int, limit: int) -> list[tuple[int, str, str]]:
    """(seq, session id, kind) of the user's events after ``after`` up to ``upto``, in order."""
    return list(
        ListEvent.objects.filter(user_id=user_pk, seq__gt=after, seq__lte=upto)
        .order_by("seq")
        .values_list("seq", "session_id", "kind")[:limit]
    )
