"""Live session-list updates (``GET /v1/sessions/updates``): who is told what.

Fan-out: every user has a channel-layer group, ``updates.<user pk>``. A write that
changes what a session's list row shows (create, title, status, runner binding or
online state, a grant given or taken, delete) calls one of the ``announce_*``
functions below inside its transaction; once the transaction commits, the session
row is read back once, rendered once per grantee (the row carries the grantee's own
``permission_level``) and sent to each grantee's group. The group reaches every
server process through the channel layer (Redis when scaled out), so a list open on
any process hears about a write made on any other.

Resume: there is no per-user event log. Each frame's ``id`` is its publication time
in milliseconds; a client that reconnects with ``Last-Event-ID`` first gets
``session.resync`` (reload ``GET /v1/sessions``), then the live tail. The stream joins
the group before it sends ``session.resync``, so everything written after the reload
starts is also delivered: no gap. Every event replaces a whole row, so the overlap
between the reload and the live tail is harmless (a row set twice is the same row).

Who hears: the users holding a direct grant on the session, as ``GET /v1/sessions``
lists sessions by direct grant (an admin's list is personal too).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from django.db import transaction

from .eventlog import Publication, publish_later, send_all, sse_frame
from .list_watch import lists_open
from .models import Permission, Session
from .selectors import runner_session_list_rows, session_list_rows
from .shapes import session_removed_event, session_row_event

RowKind = Literal["session.added", "session.updated"]
ADDED: RowKind = "session.added"
UPDATED: RowKind = "session.updated"


def user_group(user_pk: int) -> str:
    """The channel-layer group of one user's live session lists."""
    return f"updates.{user_pk}"


def frame_id() -> int:
    """Publication time in milliseconds: increasing enough for ``Last-Event-ID``."""
    return time.time_ns() // 1_000_000


def announce_session(*, session_id: str, kind: RowKind = UPDATED, only: int | None = None) -> None:
    """After the commit, send the session's row to its grantees (or to user ``only``)."""
    transaction.on_commit(
        lambda: publish_later(
            ("session-row", session_id, kind, only),
            lambda: row_publications(session_id=session_id, kind=kind, only=only),
        )
    )


def announce_removed(*, session_id: str, user_pks: list[int]) -> None:
    """After the commit, tell these users the session left their list."""
    transaction.on_commit(
        lambda: send_all(removed_publications(session_id=session_id, user_pks=user_pks))
    )


def grantees(*, session_id: str) -> list[int]:
    return list(Permission.objects.filter(session_id=session_id).values_list("user_id", flat=True))


def announce_runner_sessions(*, runner_id: str) -> None:
    """A runner went on- or offline: the rows of its sessions show it. After the
    commit, all of them are read in one statement, however many the runner holds."""
    transaction.on_commit(
        lambda: publish_later(
            ("runner-rows", runner_id),
            lambda: runner_row_publications(runner_id=runner_id),
        )
    )


def row_publications(
    *, session_id: str, kind: RowKind, only: int | None = None
) -> list[Publication]:
    """The session's list row for each grantee (or for user ``only``), read now; nothing
    while no list is open anywhere (``list_watch``)."""
    if not lists_open():
        return []
    return _row_messages(kind, session_list_rows(session_id=session_id, user_pk=only))


def runner_row_publications(*, runner_id: str) -> list[Publication]:
    """The list row of each session bound to the runner, for each of its grantees."""
    if not lists_open():
        return []
    return _row_messages(UPDATED, runner_session_list_rows(runner_id=runner_id))


def _row_messages(kind: RowKind, rows: list[tuple[int, int, Session]]) -> list[Publication]:
    """Each (grantee, level, row) as that grantee's list-row message."""
    return [
        (user_group(user_pk), _message(dict(session_row_event(kind, row, level=level))))
        for user_pk, level, row in rows
    ]


def removed_publications(*, session_id: str, user_pks: list[int]) -> list[Publication]:
    message = _message(dict(session_removed_event(session_id)))
    return [(user_group(user_pk), message) for user_pk in user_pks]


def _message(payload: dict[str, Any]) -> dict[str, Any]:
    seq = frame_id()
    return {"type": "session.updates", "seq": seq, "frame": sse_frame(payload, seq=seq)}
