"""Runner events stored a batch at a time (``runners.services.record_runner_events``).

The tunnel consumer hands over what arrived while its writer was busy; each session's
run of events is one transaction with in-memory event numbers
(``sessions.eventlog.writing_events``). These tests drive the service directly on the
database and the in-memory channel layer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection
from django.test.utils import CaptureQueriesContext

from omnigent_runner import protocol
from runners import dispatch, runner_events, services
from runners.models import Runner
from sessions import eventlog
from sessions.eventlog import record_event, session_group
from sessions.list_watch import mark_list_open
from sessions.models import Agent, Item, ListEvent, Session, SessionEvent, Turn
from sessions.services import create_session_from_bundle
from sessions.updates import user_group
from tests.turns import handed_to_runner

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

USER_MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
WORDS = [f"word{n} " for n in range(30)]


@pytest.fixture
def bound(alice: Any, make_bundle: Callable[..., bytes]) -> tuple[Session, Turn, Runner]:
    """A session bound to a runner, with a queued turn from a user message."""
    runner, _token = services.register_runner(owner=alice, name="stub")
    session = create_session_from_bundle(user=alice, data=make_bundle())
    Session.objects.filter(pk=session.pk).update(runner=runner)
    _item, turn = runner_events.accept_message(
        session_id=session.id, created_by=alice.username, data=USER_MESSAGE, tools=[]
    )
    return session, handed_to_runner(turn), runner


def a_turn(turn: Turn, *, first_seq: int = 1) -> list[runner_events.ReceivedEvent]:
    """The runner events of one streamed text turn, numbered from ``first_seq``."""
    rid = turn.id
    events: list[protocol.AnyEvent] = [protocol.ResponseCreated(response_id=rid)]
    events += [
        protocol.OutputTextDelta(response_id=rid, item_id="msg_1", delta=word) for word in WORDS
    ]
    events += [
        protocol.OutputItemDone(
            response_id=rid,
            item={
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "".join(WORDS)}],
            },
        ),
        protocol.ResponseCompleted(response_id=rid),
        protocol.SessionStatus(status="idle"),
    ]
    return [(turn.session_id, first_seq + n, event) for n, event in enumerate(events)]


def listening(group: str) -> tuple[Any, str]:
    """The channel layer and a new channel of it in ``group``, to read what is published:
    a list stream's part, so it marks a list open first, as the stream does."""
    async_to_sync(mark_list_open)()
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    return layer, channel


def stored(session_id: str) -> list[SessionEvent]:
    return list(SessionEvent.objects.filter(session_id=session_id).order_by("seq"))


def test_a_turn_in_one_batch_is_stored_in_order_with_contiguous_numbers(
    bound: tuple[Session, Turn, Runner],
) -> None:
    session, turn, runner = bound
    before = Session.objects.get(pk=session.pk).last_event_seq
    events = a_turn(turn)
    with CaptureQueriesContext(connection) as queries:
        acks = services.record_runner_events(runner_id=runner.id, events=events)
    assert acks == {session.id: len(events)}
    rows = stored(session.id)
    new = [row for row in rows if row.seq > before]
    assert [row.seq for row in new] == list(range(before + 1, before + len(new) + 1))
    types = [row.type for row in new]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types.count("response.output_text.delta") == len(WORDS)
    assert types[-3:] == ["response.output_item.done", "response.completed", "session.status"]
    deltas = [row.payload["delta"] for row in new if row.type == "response.output_text.delta"]
    assert deltas == WORDS
    after = Session.objects.get(pk=session.pk)
    assert after.last_event_seq == new[-1].seq
    assert after.last_runner_seq == len(events)
    assert after.status == Session.Status.IDLE
    assert Turn.objects.get(pk=turn.pk).status == Turn.Status.COMPLETED
    assert Item.objects.filter(session=session, id="msg_1").count() == 1
    # One transaction and no statement per text delta (it was eight each).
    statements = [q["sql"] for q in queries.captured_queries]
    assert sum(1 for sql in statements if "INSERT" in sql and "sessionevent" in sql) == 1
    assert len(statements) < len(WORDS), statements
    # The row's numbering, runner cursor and new status: one UPDATE for the batch.
    row_updates = [
        sql for sql in statements if sql.startswith(f'UPDATE "{Session._meta.db_table}"')
    ]
    assert len(row_updates) == 1, row_updates
    assert after.updated_at > session.updated_at  # auto_now applied with the status
    # The agent (for the model the payloads name) comes with the locked session row and
    # with the list row; the turn, named by three events of the batch, is read once.
    reads = [sql for sql in statements if sql.startswith("SELECT")]
    assert not [sql for sql in reads if f'FROM "{Agent._meta.db_table}"' in sql], reads
    # After the commit, the turn's end makes the scheduler look once for a turn waiting
    # for the slot it freed (usage.md, Fair share): none here, so nothing more.
    waiting_probe = [sql for sql in reads if '"dispatched_at" IS NULL' in sql]
    assert len(waiting_probe) == 1, reads
    turn_reads = [sql for sql in reads if f'FROM "{Turn._meta.db_table}"' in sql]
    assert len(turn_reads) == 2, reads
    # The turn's end writes its webhook event with it (webhook_outbox: one INSERT).
    outbox = [sql for sql in statements if "webhook_outbox" in sql]
    assert len(outbox) == 1, outbox
    assert len(statements) <= 16, statements
    # The session list log: the batch's status change logged once for the grantee, in
    # one statement on PostgreSQL (numbers and row together), two on SQLite.
    logged = [sql for sql in statements if "listevent" in sql or "listcursor" in sql]
    assert len(logged) == (1 if connection.vendor == "postgresql" else 2), logged
    assert ListEvent.objects.filter(session_id=session.id, kind="updated").count() == 2


def test_duplicates_in_and_before_a_batch_change_nothing(
    bound: tuple[Session, Turn, Runner],
) -> None:
    session, turn, runner = bound
    events = a_turn(turn)
    services.record_runner_events(runner_id=runner.id, events=events[:5])
    count = SessionEvent.objects.filter(session_id=session.id).count()
    # The runner resends from seq 3 (it lost the acks) and repeats one inside the batch.
    again = events[2:5] + events[5:8] + events[7:8]
    acks = services.record_runner_events(runner_id=runner.id, events=again)
    assert acks == {session.id: 8}
    assert SessionEvent.objects.filter(session_id=session.id).count() == count + 3
    assert Session.objects.get(pk=session.pk).last_runner_seq == 8


def test_events_of_a_session_bound_elsewhere_are_acknowledged_and_dropped(
    bound: tuple[Session, Turn, Runner], alice: Any
) -> None:
    session, turn, _runner = bound
    other, _token = services.register_runner(owner=alice, name="other")
    count = SessionEvent.objects.filter(session_id=session.id).count()
    acks = services.record_runner_events(runner_id=other.id, events=a_turn(turn)[:4])
    assert acks == {session.id: 4}
    assert SessionEvent.objects.filter(session_id=session.id).count() == count


def test_a_failing_batch_is_stored_event_by_event_up_to_the_bad_one(
    bound: tuple[Session, Turn, Runner], monkeypatch: pytest.MonkeyPatch
) -> None:
    session, turn, runner = bound
    events = a_turn(turn)
    apply = runner_events._apply
    bad_delta = WORDS[4]

    def failing_apply(session: Session, event: Any) -> None:
        if isinstance(event, protocol.OutputTextDelta) and event.delta == bad_delta:
            raise RuntimeError("the database went away")
        apply(session, event)

    monkeypatch.setattr(runner_events, "_apply", failing_apply)
    before = Session.objects.get(pk=session.pk).last_event_seq
    with pytest.raises(RuntimeError):
        services.record_runner_events(runner_id=runner.id, events=events)
    # The batch's transaction rolled back; the fallback stored everything before the
    # bad event, each in its own transaction, and stopped there: the runner resends
    # the rest after the tunnel closes.
    after = Session.objects.get(pk=session.pk)
    assert after.last_runner_seq == 5  # response.created and four deltas
    new = [row for row in stored(session.id) if row.seq > before]
    assert [row.seq for row in new] == list(range(before + 1, before + len(new) + 1))
    assert [row.payload.get("delta") for row in new[2:]] == WORDS[:4]
    assert after.last_event_seq == new[-1].seq


def test_batch_numbers_and_plain_numbers_interleave_without_gaps(
    bound: tuple[Session, Turn, Runner],
) -> None:
    session, turn, runner = bound
    events = a_turn(turn)
    services.record_runner_events(runner_id=runner.id, events=events[:10])
    record_event(session_id=session.id, payload={"type": "session.custom", "n": 1})
    services.record_runner_events(runner_id=runner.id, events=events[10:])
    record_event(session_id=session.id, payload={"type": "session.custom", "n": 2})
    seqs = [row.seq for row in stored(session.id)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert Session.objects.get(pk=session.pk).last_event_seq == seqs[-1]


def test_a_long_batch_prunes_the_log_to_its_retention(
    bound: tuple[Session, Turn, Runner], settings: Any
) -> None:
    settings.OMNIGENT_EVENT_RETENTION = 50
    session, turn, runner = bound
    rid = turn.id
    deltas = [
        (session.id, n, protocol.OutputTextDelta(response_id=rid, item_id="m", delta=f"{n} "))
        for n in range(1, 251)
    ]
    services.record_runner_events(runner_id=runner.id, events=deltas)
    newest = Session.objects.get(pk=session.pk).last_event_seq
    seqs = [row.seq for row in stored(session.id)]
    assert seqs[-1] == newest
    assert seqs == list(range(newest - 49, newest + 1))


def test_a_batch_reaches_watchers_as_one_group_message_in_order(
    bound: tuple[Session, Turn, Runner],
) -> None:
    session, turn, runner = bound
    layer, channel = listening(session_group(session.id))
    events = a_turn(turn)
    services.record_runner_events(runner_id=runner.id, events=events)
    message = async_to_sync(layer.receive)(channel)
    assert message["type"] == "session.events"
    seqs = [seq for seq, _frame in message["events"]]
    assert seqs == [row.seq for row in stored(session.id) if row.seq >= seqs[0]]
    assert len(seqs) == len(events) + 1  # response.created is shown twice (created, in_progress)


def test_a_batch_nobody_follows_makes_no_trip_to_the_event_loop(
    bound: tuple[Session, Turn, Runner], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the embedded layer, a session followed by pollers only (no stream in its
    group) costs the writer no trip to send to nobody; once a stream joins, the next
    batch reaches it, and what was written before is in the log it replays."""
    session, turn, runner = bound
    trips: list[object] = []
    real_async_to_sync = eventlog.async_to_sync

    def counting(function: Any) -> Any:
        trips.append(function)
        return real_async_to_sync(function)

    monkeypatch.setattr(eventlog, "async_to_sync", counting)
    events = a_turn(turn)
    services.record_runner_events(runner_id=runner.id, events=events[:3])
    assert trips == []
    unsent = [row.seq for row in stored(session.id)]  # in the log a stream replays
    layer, channel = listening(session_group(session.id))
    services.record_runner_events(runner_id=runner.id, events=events[3:])
    assert len(trips) == 1
    message = async_to_sync(layer.receive)(channel)
    sent = [seq for seq, _frame in message["events"]]
    assert sent and unsent
    assert unsent + sent == [row.seq for row in stored(session.id)]


def test_a_batch_announces_a_session_list_row_once_with_its_final_state(
    bound: tuple[Session, Turn, Runner], alice: Any
) -> None:
    session, turn, runner = bound
    layer, channel = listening(user_group(alice.pk))
    # Three changes of the list row in one batch: idle, running again, idle.
    statuses = [
        protocol.SessionStatus(status="idle"),
        protocol.SessionStatus(status="running", response_id=turn.id),
        protocol.SessionStatus(status="idle"),
    ]
    run = [(session.id, n, status) for n, status in enumerate(statuses, start=1)]
    services.record_runner_events(runner_id=runner.id, events=run)
    types = [row.type for row in stored(session.id)]
    assert types.count("session.status") == 4  # running (the message), then the three
    message = async_to_sync(layer.receive)(channel)
    assert message["type"] == "session.updates"
    assert '"status":"idle"' in message["frame"]
    # Read once at the end of the batch: no second message follows.
    with pytest.raises(asyncio.TimeoutError):
        async_to_sync(asyncio.wait_for)(layer.receive(channel), 0.2)


def test_the_announced_list_row_counts_the_open_questions(
    bound: tuple[Session, Turn, Runner], alice: Any
) -> None:
    session, turn, runner = bound
    layer, channel = listening(user_group(alice.pk))
    asked = [
        protocol.ApprovalRequested(
            response_id=turn.id,
            call_id=f"call_{n}",
            tool="sys_os_write",
            arguments={"path": "a.txt"},
            policy_name="ask",
            reason="writes",
            ask_timeout=60.0,
        )
        for n in (1, 2)
    ]
    run = [(session.id, n, event) for n, event in enumerate(asked, start=1)]
    services.record_runner_events(runner_id=runner.id, events=run)
    message = async_to_sync(layer.receive)(channel)
    frame = message["frame"]
    assert '"pending_elicitations_count":2' in frame, frame
    assert f'"runner_id":"{runner.id}"' in frame and '"agent_name":"file-helper"' in frame


def test_an_accepted_message_publishes_its_events_and_list_row_in_one_trip(
    alice: Any, make_bundle: Callable[..., bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``202`` of a message waits for what it publishes: one trip to the event loop
    for the stream events and the session-list row together, not one each."""
    runner, _token = services.register_runner(owner=alice, name="stub")
    session = create_session_from_bundle(user=alice, data=make_bundle())
    Session.objects.filter(pk=session.pk).update(runner=runner)
    stream_layer, stream_channel = listening(session_group(session.id))
    list_layer, list_channel = listening(user_group(alice.pk))
    trips: list[list[str]] = []
    send_all = eventlog.send_all

    def counting_send_all(publications: list[eventlog.Publication]) -> None:
        trips.append([group for group, _message in publications])
        send_all(publications)

    monkeypatch.setattr(eventlog, "send_all", counting_send_all)
    runner_events.accept_message(
        session_id=session.id, created_by=alice.username, data=USER_MESSAGE, tools=[]
    )
    assert trips == [[session_group(session.id), user_group(alice.pk)]]
    events = async_to_sync(stream_layer.receive)(stream_channel)["events"]
    assert [seq for seq, _frame in events] == [row.seq for row in stored(session.id)][-2:]
    row = async_to_sync(list_layer.receive)(list_channel)
    assert '"status":"running"' in row["frame"]


def test_an_accepted_message_comes_back_with_its_publications_unsent(
    alice: Any, make_bundle: Callable[..., bytes]
) -> None:
    runner, _token = services.register_runner(owner=alice, name="stub")
    session = create_session_from_bundle(user=alice, data=make_bundle())
    Session.objects.filter(pk=session.pk).update(runner=runner)
    stream_layer, stream_channel = listening(session_group(session.id))
    item, turn, command, publications = dispatch._accept_with_command(
        session_id=session.id, created_by=alice.username, data=USER_MESSAGE, tools=[]
    )
    assert command.response_id == turn.id and command.input[0]["id"] == item.id
    assert [group for group, _message in publications] == [
        session_group(session.id),
        user_group(alice.pk),
    ]
    with pytest.raises(asyncio.TimeoutError):
        async_to_sync(asyncio.wait_for)(stream_layer.receive(stream_channel), 0.2)
    async_to_sync(eventlog.send_publications)(publications)
    events = async_to_sync(stream_layer.receive)(stream_channel)["events"]
    assert [seq for seq, _frame in events] == [row.seq for row in stored(session.id)][-2:]


def test_collected_publications_of_a_failing_block_are_sent_before_the_error(
    bound: tuple[Session, Turn, Runner],
) -> None:
    """What a block committed before it failed still reaches watchers."""
    session, _turn, _runner = bound
    layer, channel = listening(session_group(session.id))
    with pytest.raises(RuntimeError, match="after the commit"):
        with eventlog.collecting_publications() as unit:
            record_event(session_id=session.id, payload={"type": "session.note", "n": 1}, unit=unit)
            raise RuntimeError("after the commit")
    assert [group for group, _message in unit.publications] == [session_group(session.id)]
    message = async_to_sync(layer.receive)(channel)
    assert [seq for seq, _frame in message["events"]] == [stored(session.id)[-1].seq]


def test_only_writes_given_the_unit_are_held(bound: tuple[Session, Turn, Runner]) -> None:
    """The unit of work is explicit: a write not given it inside the block is published
    at once, as anywhere else; one given it waits for the block's end."""
    session, _turn, _runner = bound
    layer, channel = listening(session_group(session.id))
    with eventlog.collecting_publications() as unit:
        plain = record_event(session_id=session.id, payload={"type": "session.note", "n": 1})
        message = async_to_sync(layer.receive)(channel)
        assert [seq for seq, _frame in message["events"]] == [plain.seq]
        held = record_event(
            session_id=session.id, payload={"type": "session.note", "n": 2}, unit=unit
        )
        with pytest.raises(asyncio.TimeoutError):
            async_to_sync(asyncio.wait_for)(layer.receive(channel), 0.2)
    assert [group for group, _message in unit.publications] == [session_group(session.id)]
    assert [seq for seq, _frame in unit.publications[0][1]["events"]] == [held.seq]
    assert not [value for value in vars(eventlog).values() if isinstance(value, threading.local)]
