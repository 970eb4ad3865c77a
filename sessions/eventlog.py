"""The session event log: every event a watcher can see passes through ``record_event``.

Each event gets the session's next sequence number in the same transaction that
stores it, and is published to the session's channel-layer group once that
transaction commits. The stream replays the log on resume and uses the numbers
to fill any gap in what the group delivered, so no watcher sees a gap or a
duplicate.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from omnigent_site.rawsql import increment_returning, insert_rows, update_row
from omnigent_site.runtime.channel_layer import group_may_have_members

from .models import Session, SessionEvent

log = logging.getLogger(__name__)

PRUNE_EVERY = 100


def session_group(session_id: str) -> str:
    """The channel-layer group every watcher of the session joins."""
    return f"session.{session_id}"


def record_event(*, session_id: str, payload: dict[str, Any]) -> SessionEvent:
    """Store ``payload`` (which carries its ``type``) as the session's next event."""
    assert "type" in payload, "an event payload names its type"
    writer = getattr(_writing, "writer", None)
    if writer is not None and writer.session_id == session_id:
        return writer.add(payload)
    with transaction.atomic():
        # The UPDATE takes the row lock first, so concurrent writers queue here
        # and each reads back its own number.
        seq = increment_returning(Session, pk=session_id, field="last_event_seq", by=1)
        if seq is None:
            raise Session.DoesNotExist(f"session {session_id} does not exist")
        event = SessionEvent.objects.create(
            session_id=session_id, seq=seq, type=payload["type"], payload=payload
        )
        if seq % PRUNE_EVERY == 0:
            _prune(session_id=session_id, newest=seq)
        transaction.on_commit(lambda: _publish_or_hold([event]))
    return event


class _EventWriter:
    """The events of one session recorded inside ``writing_events``, numbered in memory,
    and the fields of its row saved with them (``save_session_fields``)."""

    def __init__(self, session: Session) -> None:
        self.session_id = session.id
        self.session = session
        self.events: list[SessionEvent] = []
        self.fields: set[str] = set()
        self.at_end: dict[Hashable, Callable[[], None]] = {}

    def add(self, payload: dict[str, Any]) -> SessionEvent:
        self.session.last_event_seq += 1
        event = SessionEvent(
            session_id=self.session_id,
            seq=self.session.last_event_seq,
            type=payload["type"],
            payload=payload,
        )
        self.events.append(event)
        return event

    def store(self) -> None:
        fields, self.fields = self.fields, set()
        events, self.events = self.events, []
        at_end, self.at_end = self.at_end, {}
        if events:
            insert_rows(SessionEvent, events)
            fields.add("last_event_seq")
        if fields:
            # One UPDATE for the row: the numbering and whatever else the block changed.
            update_row(self.session, sorted(fields))
        for action in at_end.values():
            action()
        if not events:
            return
        first, newest = events[0].seq, events[-1].seq
        if newest // PRUNE_EVERY != (first - 1) // PRUNE_EVERY:
            _prune(session_id=self.session_id, newest=newest)
        transaction.on_commit(lambda: _publish_or_hold(events))


def save_session_fields(session: Session, fields: Iterable[str]) -> None:
    """Save ``fields`` of ``session``'s row: inside a ``writing_events`` block for it,
    together with its events at the end of the block (one UPDATE); otherwise now.

    ``auto_now`` fields among them (``updated_at``) get the current time, as
    ``Model.save`` would give them.
    """
    names = list(fields)
    for name in names:
        field = Session._meta.get_field(name)
        if getattr(field, "auto_now", False):
            setattr(session, name, field.pre_save(session, add=False))  # type: ignore[union-attr]
    writer: _EventWriter | None = getattr(_writing, "writer", None)
    if writer is not None and writer.session is session:
        writer.fields.update(names)
        return
    update_row(session, names)


def at_block_end(*, session_id: str, key: Hashable, action: Callable[[], None]) -> bool:
    """Inside a ``writing_events`` block for the session: run ``action`` once per ``key``
    when the block stores its events (same transaction), and return True. False
    outside one: the caller acts now. A list row announced by several events of a
    runner batch is stored once (``updates.announce_session``)."""
    writer: _EventWriter | None = getattr(_writing, "writer", None)
    if writer is None or writer.session_id != session_id:
        return False
    writer.at_end.setdefault(key, action)
    return True


_writing = threading.local()


@contextmanager
def writing_events(*, session: Session) -> Iterator[None]:
    """Number the session's events in memory inside the block and store them at its end.

    For a burst of events of one session (the runner's event batches): one INSERT and
    one UPDATE for the whole block instead of an UPDATE, a read and an INSERT each.
    The caller holds ``session``'s row lock for the whole block (read with
    ``select_for_update`` in the open transaction; on SQLite the ``IMMEDIATE``
    transaction holds the database's write lock), so no other writer can take a
    number in between, and the events become visible together when it commits.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("writing_events needs the transaction that locked the session row")
    if getattr(_writing, "writer", None) is not None:
        raise RuntimeError("writing_events blocks do not nest")
    writer = _writing.writer = _EventWriter(session)
    try:
        yield
        writer.store()
    finally:
        _writing.writer = None


# A group name and the message for it.
Publication = tuple[str, dict[str, Any]]


class _Held:
    """What a ``publishing_together`` block publishes at its end."""

    def __init__(self) -> None:
        self.events: list[SessionEvent] = []
        self.later: dict[Hashable, Callable[[], list[Publication]]] = {}


_held = threading.local()


@contextmanager
def publishing_together() -> Iterator[None]:
    """Hold what is published inside the block; publish it after the block, together.

    Subscribers then get one group message per session for the whole block instead
    of one per event, which is what bounds how fast a busy session can be fanned out.
    Publications registered with ``publish_later`` run once per key at the end (a
    session's list row announced by several events of the block is read and sent
    once), and everything goes to the channel layer in one trip to the event loop.
    """
    with collecting_publications() as publications:
        yield
    send_all(publications)


@contextmanager
def collecting_publications() -> Iterator[list[Publication]]:
    """``publishing_together`` for sync code that async code calls: the block's
    publications are put in the yielded list at its end instead of being sent, and the
    async caller sends them on its event loop (``send_publications``).

    That saves the thread a trip to the event loop and back (``async_to_sync``), and the
    thread (with its running place) no longer waits there for a busy loop. A message's
    ``POST`` uses it; the tunnel's event writer does not (``record_runner_events`` says
    why). If the block raises, what it committed is sent from here before the error goes
    on, as ``publishing_together`` would.
    """
    collected: list[Publication] = []
    if getattr(_held, "block", None) is not None:
        yield collected  # already inside a block: the outer one publishes
        return
    held = _held.block = _Held()
    failed = True
    try:
        yield collected
        failed = False
    finally:
        _held.block = None
        collected += _event_publications(held.events)
        for produce in held.later.values():
            try:
                collected += produce()
            except Exception:
                log.exception("could not prepare a publication")
        if failed:
            send_all(collected)


def publish_later(
    key: Hashable, produce: Callable[[], list[Publication]]
) -> Callable[[], list[Publication]] | None:
    """Run ``produce`` and send what it returns: at the end of the enclosing
    ``publishing_together`` block (once per ``key``; returns the producer kept for the
    key, which may be an earlier one), or now outside one (returns None)."""
    held: _Held | None = getattr(_held, "block", None)
    if held is not None:
        return held.later.setdefault(key, produce)
    send_all(produce())
    return None


def _publish_or_hold(events: list[SessionEvent]) -> None:
    held: _Held | None = getattr(_held, "block", None)
    if held is not None:
        held.events.extend(events)
    else:
        publish_events(events)


def _prune(*, session_id: str, newest: int) -> None:
    keep = max(int(settings.OMNIGENT_EVENT_RETENTION), 1)
    SessionEvent.objects.filter(session_id=session_id, seq__lte=newest - keep).delete()


def sse_frame(payload: dict[str, Any], *, seq: int | None = None) -> str:
    """One Server-Sent Events frame: ``event:``, ``id:`` (the sequence) and ``data:``."""
    lines = [f"event: {payload['type']}"]
    if seq is not None:
        lines.append(f"id: {seq}")
    lines.append("data: " + json.dumps(payload, separators=(",", ":")))
    return "\n".join(lines) + "\n\n"


def group_messages(events: list[SessionEvent]) -> dict[str, dict[str, Any]]:
    """One ``session.events`` message per session, frames rendered once (not per subscriber)."""
    messages: dict[str, dict[str, Any]] = {}
    for event in events:
        message = messages.setdefault(event.session_id, {"type": "session.events", "events": []})
        message["events"].append([event.seq, sse_frame(event.payload, seq=event.seq)])
    return messages


def publish_events(events: list[SessionEvent]) -> None:
    send_all(_event_publications(events))


def _event_publications(events: list[SessionEvent]) -> list[Publication]:
    return [
        (session_group(session_id), message)
        for session_id, message in group_messages(events).items()
    ]


def send_all(publications: list[Publication]) -> None:
    """Send group messages in order, in one trip from this thread to the event loop.

    Messages for groups nobody is in (a session followed by pollers only, with the
    embedded layer) are dropped here, and with none left the trip is not made: the
    tunnel's writer would otherwise wait for the event loop after every batch to
    send to nobody.
    """
    if not publications:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    publications = [
        (group, message) for group, message in publications if group_may_have_members(layer, group)
    ]
    if publications:
        async_to_sync(_send_all)(layer, publications)


async def send_publications(publications: list[Publication]) -> None:
    """Send what ``collecting_publications`` collected, in order, from the event loop."""
    if not publications:
        return
    layer = get_channel_layer()
    if layer is not None:
        await _send_all(layer, publications)


async def _send_all(layer: Any, publications: list[Publication]) -> None:
    for group, message in publications:
        try:
            await layer.group_send(group, message)
        except Exception:
            # Watchers recover from the log (a list from its next reload); a failed
            # publish must not fail the write that caused it.
            log.exception("could not publish to %s", group)


def publish_session_end(*, session_id: str, reason: str) -> None:
    """Tell every watcher the stream is over (the session was deleted)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            session_group(session_id), {"type": "session.end", "reason": reason}
        )
    except Exception:
        log.exception("could not publish the end of %s", session_id)
