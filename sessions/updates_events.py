"""The events of the session-list stream (``GET /v1/sessions/updates``; design in
``updates.py``).

Every ``data:`` payload the stream sends is a ``TypedDict`` here, built by the function
next to it. ``EVENTS`` maps each ``type`` to its shape: the stream view's schema lists
them as components and the tests check each constructor against it. The list frames
(``session.added``, ``session.updated``, ``session.removed``) replace a whole row, so
the current row always stands for a run of changes.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from typing_extensions import TypedDict

from .models import Session
from .shapes import SessionRowOut, session_row

RowKind = Literal["session.added", "session.updated"]


class ListHeartbeatEvent(TypedDict):
    """``session.heartbeat``: first on connect (load ``GET /v1/sessions`` after it), then
    every 15 s while idle."""

    type: Literal["session.heartbeat"]


def list_heartbeat_event() -> ListHeartbeatEvent:
    return {"type": "session.heartbeat"}


class ListResyncEvent(TypedDict):
    """``session.resync``: the log no longer reaches back to the resume point; reload
    ``GET /v1/sessions``."""

    type: Literal["session.resync"]


def list_resync_event() -> ListResyncEvent:
    return {"type": "session.resync"}


class SessionRowEvent(TypedDict):
    """``session.added`` / ``session.updated``: the row as ``GET /v1/sessions`` lists it."""

    type: RowKind
    session: SessionRowOut


def session_row_event(kind: RowKind, session: Session, *, level: int) -> SessionRowEvent:
    return {"type": kind, "session": session_row(session, level=level)}


class SessionRemovedEvent(TypedDict):
    """``session.removed``: the session left the user's list (deleted or access revoked)."""

    type: Literal["session.removed"]
    session_id: str


def session_removed_event(session_id: str) -> SessionRemovedEvent:
    return {"type": "session.removed", "session_id": session_id}


UpdatesEvent: TypeAlias = (
    ListHeartbeatEvent | ListResyncEvent | SessionRowEvent | SessionRemovedEvent
)

# Every event type of the session-list stream and its shape.
EVENTS: dict[str, type] = {
    "session.heartbeat": ListHeartbeatEvent,
    "session.added": SessionRowEvent,
    "session.updated": SessionRowEvent,
    "session.removed": SessionRemovedEvent,
    "session.resync": ListResyncEvent,
}
