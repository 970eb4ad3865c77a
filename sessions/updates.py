"""Live session-list updates (``GET /v1/sessions/updates``): who is told what, and the
log a list that reconnects resumes from.

Fan-out: every user has a channel-layer group, ``updates.<user pk>``. A write that
changes what a session's list row shows (create, title, status, runner binding or
online state, a grant given or taken, delete) calls one of the ``announce_*``
functions below inside its transaction; once the transaction commits, the session
row is read back once, rendered once per grantee (the row carries the grantee's own
``permission_level``) and sent to each grantee's group. The group reaches every
server process through the channel layer (Redis when scaled out), so a list open on
any process hears about a write made on any other. Rows are read and sent only while
some list is open (``list_watch``).

The log (``list_log``): the same call stores, in the write's transaction, one
``ListEvent`` per recipient, numbered per user in commit order; the frame sent live
carries that number as its ``id``. A list that reconnects with ``Last-Event-ID: n``
(or ``?after=n``) first gets, for every session whose row changed after ``n``, the
row as it is now (``session.added``/``session.updated``, or ``session.removed`` when
the user no longer has it), ordered and numbered by its newest change, then the live
tail; ``session.resync`` (reload ``GET /v1/sessions``) only when ``n`` is older than
the log keeps or is no number of it (``updates_stream``). Every event replaces a
whole row, so the current row stands for a run of changes.

Who hears: the users holding a direct grant on the session, as ``GET /v1/sessions``
lists sessions by direct grant (an admin's list is personal too).

On the hot path (a turn's status changes twice a turn): in a runner batch's unit of
work (``eventlog.writing_events``, passed as ``unit``) the session's announcements are
stored once, at the end of the unit; each is one statement on PostgreSQL (``list_log``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from . import list_log
from .eventlog import Publication, WriteUnit, at_block_end, publish_later, send_all, sse_frame
from .list_watch import lists_open
from .models import ListEvent, Permission, Session
from .selectors import runner_session_list_rows, session_list_rows, user_session_list_rows
from .updates_events import RowKind, UpdatesEvent, session_removed_event, session_row_event

ADDED: RowKind = "session.added"
UPDATED: RowKind = "session.updated"
_LOGGED: dict[str, str] = {ADDED: ListEvent.Kind.ADDED, UPDATED: ListEvent.Kind.UPDATED}

# Log rows read per statement while a list catches up.
REPLAY_BATCH = 500


def user_group(user_pk: int) -> str:
    """The channel-layer group of one user's live session lists."""
    return f"updates.{user_pk}"


def announce_session(
    *,
    session_id: str,
    kind: RowKind = UPDATED,
    only: int | None = None,
    unit: WriteUnit | None = None,
) -> None:
    """Log the change of the session's row for its grantees (or for user ``only``) and,
    after the commit, send them the row (with what ``unit`` publishes, if it does)."""
    if only is None and at_block_end(
        session_id=session_id,
        key=("list-row", session_id, kind),
        action=lambda: _announce_session(session_id, kind, None, unit),
        unit=unit,
    ):
        return
    _announce_session(session_id, kind, only, unit)


def _announce_session(
    session_id: str, kind: RowKind, only: int | None, unit: WriteUnit | None
) -> None:
    with transaction.atomic(savepoint=False):
        numbers = list_log.record_session(session_id=session_id, kind=_LOGGED[kind], only=only)
        if numbers:
            _publish_after_commit(
                ("session-row", session_id, kind, only),
                _Rows(
                    lambda: session_list_rows(session_id=session_id, user_pk=only), kind, numbers
                ),
                unit,
            )


def announce_removed(*, session_id: str, user_pks: list[int]) -> None:
    """Log that the session left these users' lists and, after the commit, tell them."""
    with transaction.atomic(savepoint=False):
        numbers = list_log.record_removed(session_id=session_id, user_pks=user_pks)
        transaction.on_commit(lambda: send_all(removed_publications(numbers)))


def grantees(*, session_id: str) -> list[int]:
    return list(Permission.objects.filter(session_id=session_id).values_list("user_id", flat=True))


def announce_runner_sessions(*, runner_id: str) -> None:
    """A runner went on- or offline: the rows of its sessions show it. After the
    commit, all of them are read in one statement, however many the runner holds."""
    with transaction.atomic(savepoint=False):
        pairs = list_log.runner_pairs(runner_id=runner_id)
        numbers = list_log.record_pairs(pairs, kind=ListEvent.Kind.UPDATED)
        if numbers:
            _publish_after_commit(
                ("runner-rows", runner_id),
                _Rows(lambda: runner_session_list_rows(runner_id=runner_id), UPDATED, numbers),
                None,
            )


class _Rows:
    """List rows to send after the commit: read then, once, and each numbered with the
    event logged for its (grantee, session)."""

    def __init__(
        self,
        read: Callable[[], list[tuple[int, int, Session]]],
        kind: RowKind,
        numbers: list_log.Numbered,
    ) -> None:
        self.read = read
        self.kind = kind
        self.numbers = dict(numbers)

    def merge(self, other: _Rows) -> None:
        """The same rows announced again in the same publishing block: the newest
        numbers go with the one read."""
        for key, seq in other.numbers.items():
            self.numbers[key] = max(seq, self.numbers.get(key, 0))

    def __call__(self) -> list[Publication]:
        """Nothing while no list is open anywhere (``list_watch``). A grantee without a
        logged event (a grant given since) is left to that grant's own event."""
        if not lists_open():
            return []
        messages = []
        for user_pk, level, row in self.read():
            seq = self.numbers.get((user_pk, row.id))
            if seq is not None:
                payload = session_row_event(self.kind, row, level=level)
                messages.append((seq, user_group(user_pk), _message(payload, seq)))
        messages.sort(key=lambda message: message[0])
        return [(group, message) for _seq, group, message in messages]


def _publish_after_commit(key: tuple[Any, ...], rows: _Rows, unit: WriteUnit | None) -> None:
    def publish() -> None:
        kept = publish_later(key, rows, unit=unit)
        if isinstance(kept, _Rows) and kept is not rows:
            kept.merge(rows)

    transaction.on_commit(publish)


def removed_publications(numbers: list_log.Numbered) -> list[Publication]:
    return [
        (user_group(user_pk), _message(session_removed_event(session_id), seq))
        for (user_pk, session_id), seq in sorted(numbers.items(), key=lambda item: item[1])
    ]


def _message(payload: UpdatesEvent, seq: int) -> dict[str, Any]:
    return {"type": "session.updates", "seq": seq, "frame": sse_frame(payload, seq=seq)}


# --- catching up ---------------------------------------------------------------------


def log_bounds(*, user_pk: int) -> tuple[int, int | None]:
    """The user's newest list-event number and the oldest one kept (``list_log.bounds``)."""
    return list_log.bounds(user_pk=user_pk)


def missed_frames(*, user_pk: int, after: int, upto: int) -> list[tuple[int, str]]:
    """The frames for the user's list events after ``after`` up to ``upto``: for each
    session they name, its row as it is now (or ``session.removed``), numbered with
    the session's newest event there, in that order."""
    newest: dict[str, tuple[int, str]] = {}
    added: set[str] = set()
    reached = after
    while True:
        rows = list_log.between(user_pk=user_pk, after=reached, upto=upto, limit=REPLAY_BATCH)
        for seq, session_id, kind in rows:
            newest[session_id] = (seq, kind)
            if kind == ListEvent.Kind.ADDED:
                added.add(session_id)
            elif kind == ListEvent.Kind.REMOVED:
                added.discard(session_id)
        if len(rows) < REPLAY_BATCH:
            break
        reached = rows[-1][0]
    shown = user_session_list_rows(
        user_pk=user_pk,
        session_ids=[s for s, (_seq, kind) in newest.items() if kind != ListEvent.Kind.REMOVED],
    )
    frames: list[tuple[int, str]] = []
    for session_id, (seq, _kind) in sorted(newest.items(), key=lambda item: item[1][0]):
        current = shown.get(session_id)
        if current is None:  # removed, or no longer the user's (its removal is logged)
            payload: UpdatesEvent = session_removed_event(session_id)
        else:
            level, row = current
            kind = ADDED if session_id in added else UPDATED
            payload = session_row_event(kind, row, level=level)
        frames.append((seq, sse_frame(payload, seq=seq)))
    return frames
