"""Fair share of runners (usage.md) through the real tunnel consumer and HTTP views: a
stub runner declares its capacity in ``hello``; turns over it wait ``queued`` with their
place, and start, user by user, as the stub ends the turns that hold the slots."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from omnigent_runner import protocol
from runners import consumers, runner_events, scheduler, services
from runners.models import Runner
from sessions.models import Session, SessionEvent, Turn
from sessions.services import create_session_from_bundle

from .stubs import (
    ALICE,
    BOB,
    FRAME_TIMEOUT,
    StubRunner,
    Stubs,
    body_of,
    call,
    in_db,
    patch_runner,
    post_event,
    start,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

MESSAGE = {"type": "message", "data": {"role": "user", "content": "go"}}


async def bound_session(
    user: Any, runner: Runner, bundle: bytes, *, opened: bool = True
) -> Session:
    """A session of ``user`` on ``runner``, open on the stub's connection unless not
    ``opened`` (then its first turn brings ``session.open``)."""
    session = await in_db(create_session_from_bundle)(user=user, data=bundle)
    generation = (await in_db(Runner.objects.get)(pk=runner.pk)).generation
    await in_db(Session.objects.filter(pk=session.pk).update)(
        runner=runner, runner_generation_opened=generation if opened else 0
    )
    return session


async def started_now(stub: StubRunner, session: Session, user: str = ALICE) -> str:
    """Post a message the stub must be sent at once; ack it; its response id."""
    pending = start(post_event(session.id, MESSAGE, user))
    turn = await stub.expect("turn.start")
    assert turn["session_id"] == session.id
    await stub.ack(turn)
    assert body_of(await pending, 202)["response_id"] == turn["response_id"]
    return str(turn["response_id"])


async def left_waiting(session: Session, user: str = ALICE) -> str:
    """Post a message that must wait: 202 at once, nothing sent to the runner."""
    body = body_of(await post_event(session.id, MESSAGE, user), 202)
    assert body["queued"] is True
    turn = await in_db(Turn.objects.get)(session_id=session.id, id=body["response_id"])
    assert turn.status == Turn.Status.QUEUED and turn.dispatched_at is None
    return str(body["response_id"])


class RunnerEvents:
    """The stub's side of running turns: numbered events per session."""

    def __init__(self, stub: StubRunner) -> None:
        self.stub = stub
        self.seqs: dict[str, int] = {}

    async def send(self, session_id: str, *events: protocol.AnyEvent) -> None:
        for event in events:
            seq = self.seqs[session_id] = self.seqs.get(session_id, 0) + 1
            await self.stub.send(protocol.EventFrame(session_id=session_id, seq=seq, event=event))

    async def finish(self, session_id: str, response_id: str) -> None:
        await self.send(
            session_id,
            protocol.ResponseCreated(response_id=response_id),
            protocol.ResponseCompleted(response_id=response_id),
            protocol.SessionStatus(status="idle"),
        )


async def next_command(stub: StubRunner, kind: str) -> dict[str, Any]:
    """The next command of ``kind``, past the acknowledgements of the stub's events."""
    async with asyncio.timeout(4 * FRAME_TIMEOUT):
        while True:
            frame = await stub.recv()
            if frame["type"] in ("event.ack", "event.acks"):
                continue
            assert frame["type"] == kind, frame
            return frame


async def snapshot(session: Session, user: str = ALICE) -> dict[str, Any]:
    return body_of(await call("get", f"/v1/sessions/{session.id}", user), 200)


async def places(*sessions: tuple[Session, str]) -> dict[str, int]:
    """Every waiting turn's place, by response id, as the snapshots list them."""
    found: dict[str, int] = {}
    for session, owner in sessions:
        for entry in (await snapshot(session, owner))["queued_turns"]:
            found[entry["response_id"]] = entry["position"]
    return found


@pytest.fixture
def bundle(make_bundle: Callable[..., bytes]) -> bytes:
    return make_bundle()


async def test_a_turn_over_the_runners_capacity_waits_with_its_place_then_starts(
    stubs: Stubs, runner_token: tuple[Runner, str], alice: Any, bundle: bytes
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token, max_turns=1)
    assert (await in_db(Runner.objects.get)(pk=runner.pk)).max_turns == 1
    first = await bound_session(alice, runner, bundle)
    second = await bound_session(alice, runner, bundle, opened=False)
    running = await started_now(stub, first)
    # A follow-up in the session that holds the slot joins it: the runner runs it next.
    follow_up = await started_now(stub, first)
    waiting = await left_waiting(second)
    behind = await left_waiting(second)

    assert (await snapshot(second))["queued_turns"] == [
        {"response_id": waiting, "position": 1},
        {"response_id": behind, "position": 2},
    ]
    turn = body_of(await call("get", f"/v1/sessions/{second.id}/responses/{waiting}", ALICE), 200)
    assert turn["status"] == "queued"
    assert (await snapshot(first))["queued_turns"] == []

    events = RunnerEvents(stub)
    await events.finish(first.id, running)
    await events.finish(first.id, follow_up)
    opened = await next_command(stub, "session.open")
    assert opened["session_id"] == second.id
    # The waiting turn's message comes with its turn.start, not in the history.
    assert [item.get("role") for item in opened["history"]] == []
    await stub.ack(opened)
    begun = await next_command(stub, "turn.start")
    assert (begun["session_id"], begun["response_id"]) == (second.id, waiting)
    assert [item["content"] for item in begun["input"]] == [[{"type": "input_text", "text": "go"}]]
    await stub.ack(begun)
    assert (await snapshot(second))["queued_turns"] == []
    shown = await in_db(
        lambda: [
            row.payload["queued_turns"]
            for row in SessionEvent.objects.filter(session_id=second.id, type="session.queue")
        ]
    )()
    assert shown == [
        [{"response_id": waiting, "position": 1}],
        [{"response_id": waiting, "position": 1}, {"response_id": behind, "position": 2}],
        [],
    ]


async def test_a_free_slot_with_nothing_waiting_starts_the_turn_without_a_claim(
    stubs: Stubs,
    runner_token: tuple[Runner, str],
    alice: Any,
    bundle: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The message's fast path (``scheduler.starts_at_once``): stored dispatched in its
    own transaction, no claim and no queue event; once a turn waits, claims decide."""
    runner, token = runner_token
    stub = await stubs.online(token, max_turns=1)
    first = await bound_session(alice, runner, bundle)
    second = await bound_session(alice, runner, bundle)
    claims: list[dict[str, Any]] = []
    real_claim = scheduler.claim

    def counted(**kwargs: Any) -> list[scheduler.Claimed]:
        claims.append(kwargs)
        return real_claim(**kwargs)

    monkeypatch.setattr(scheduler, "claim", counted)
    running = await started_now(stub, first)
    follow_up = await started_now(stub, first)  # joins the slot its session holds
    assert claims == []
    dispatched = await in_db(
        lambda: list(Turn.objects.filter(session_id=first.id).values_list("id", "dispatched_at"))
    )()
    assert {turn_id for turn_id, at in dispatched if at is not None} == {running, follow_up}

    waiting = await left_waiting(second)  # over the capacity: a claim decides
    assert len(claims) == 1
    # A turn waits: even a session holding a slot goes through a claim (which starts it).
    await started_now(stub, first)
    assert len(claims) == 2
    queue_events = await in_db(
        lambda: list(
            SessionEvent.objects.filter(type="session.queue").values_list("session_id", flat=True)
        )
    )()
    assert queue_events == [second.id]
    assert (await snapshot(second))["queued_turns"] == [{"response_id": waiting, "position": 1}]


async def test_the_next_free_slot_goes_to_the_user_who_waited_not_the_busy_one(
    stubs: Stubs, runner_token: tuple[Runner, str], alice: Any, bob: Any, bundle: bytes
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token, max_turns=1)
    alices = [await bound_session(alice, runner, bundle) for _ in range(3)]
    bobs = await bound_session(bob, runner, bundle)
    running = await started_now(stub, alices[0])
    alice_waiting = [await left_waiting(session) for session in alices[1:]]
    bob_waiting = await left_waiting(bobs, BOB)
    # Bob asked last, but Alice holds the slot: he is next, then Alice's two in order.
    watched = [(session, ALICE) for session in alices[1:]] + [(bobs, BOB)]
    assert await places(*watched) == {
        bob_waiting: 1,
        alice_waiting[0]: 2,
        alice_waiting[1]: 3,
    }

    events = RunnerEvents(stub)
    await events.finish(alices[0].id, running)
    begun = await next_command(stub, "turn.start")
    assert begun["response_id"] == bob_waiting
    await stub.ack(begun)
    assert await places(*watched) == {alice_waiting[0]: 1, alice_waiting[1]: 2}

    await events.finish(bobs.id, bob_waiting)
    begun = await next_command(stub, "turn.start")
    assert begun["response_id"] == alice_waiting[0]
    await stub.ack(begun)
    assert await places(*watched) == {alice_waiting[1]: 1}


async def test_a_user_at_the_cap_waits_while_another_user_starts(
    stubs: Stubs,
    runner_token: tuple[Runner, str],
    alice: Any,
    bob: Any,
    bundle: bytes,
    settings: Any,
) -> None:
    settings.OMNIGENT_MAX_RUNNING_TURNS_PER_USER = 1
    runner, token = runner_token
    stub = await stubs.online(token)  # the default capacity, 8
    first, second = [await bound_session(alice, runner, bundle) for _ in range(2)]
    bobs = await bound_session(bob, runner, bundle)
    running = await started_now(stub, first)
    waiting = await left_waiting(second)
    await started_now(stub, bobs, BOB)

    await RunnerEvents(stub).finish(first.id, running)
    begun = await next_command(stub, "turn.start")
    assert begun["response_id"] == waiting
    await stub.ack(begun)


async def test_waiting_turns_start_when_their_runner_comes_back(
    stubs: Stubs, runner_token: tuple[Runner, str], alice: Any, bundle: bytes
) -> None:
    """The queue is in the database: a runner that reconnects (or a server process that
    restarted and is dialled again) is sent what waited, up to its capacity."""
    runner, token = runner_token
    stub = await stubs.online(token, max_turns=1)
    first, second = [await bound_session(alice, runner, bundle) for _ in range(2)]
    running = await started_now(stub, first)
    waiting = await left_waiting(second)
    await RunnerEvents(stub).send(first.id, protocol.ResponseCreated(response_id=running))
    assert (await stub.recv())["type"] == "event.ack"
    await stub.drop()

    # Back with nothing open (a restarted runner), two slots this time.
    stub = await stubs.online(token, max_turns=2)
    commands = [await next_command(stub, kind) for kind in ("session.open", "turn.start")]
    assert commands[1]["response_id"] == running
    later = [await next_command(stub, kind) for kind in ("session.open", "turn.start")]
    assert (later[1]["session_id"], later[1]["response_id"]) == (second.id, waiting)
    assert (await snapshot(second))["queued_turns"] == []


async def test_a_waiting_turn_moved_to_a_free_runner_starts_there(
    stubs: Stubs, runner_token: tuple[Runner, str], alice: Any, bundle: bytes
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token, max_turns=1)
    first, second = [await bound_session(alice, runner, bundle) for _ in range(2)]
    await started_now(stub, first)
    waiting = await left_waiting(second)

    other, other_token = await in_db(services.register_runner)(owner=alice, name="other")
    free = await stubs.online(other_token, max_turns=1)
    body_of(await patch_runner(second.id, other.id), 200)
    assert (await free.expect("session.open"))["session_id"] == second.id
    begun = await free.expect("turn.start")
    assert (begun["session_id"], begun["response_id"]) == (second.id, waiting)
    assert (await snapshot(second))["queued_turns"] == []


def dispatched_turn(session: Session) -> str:
    """A message's turn given a slot (its ``turn.start`` sent), not acknowledged."""
    _item, turn = runner_events.accept_message(
        session_id=session.id, created_by=ALICE, data=MESSAGE["data"], tools=[]
    )
    Turn.objects.filter(pk=turn.pk).update(dispatched_at=timezone.now())
    return turn.id


async def acked_at(session: Session, response_id: str) -> Any:
    turn = await in_db(Turn.objects.get)(session_id=session.id, id=response_id)
    return turn.start_acked_at


async def test_a_turn_start_lost_with_a_closing_tunnel_is_sent_again_on_the_next(
    stubs: Stubs, runner_token: tuple[Runner, str], alice: Any, bundle: bytes
) -> None:
    """A turn given a slot is sent without waiting for its answer; when the tunnel it
    went to closes before the runner read it (a server process stopping), the runner's
    next tunnel gets it again, also for a session the runner still holds open. Once
    acknowledged, it is not sent again."""
    runner, token = runner_token
    stub = await stubs.online(token, max_turns=1)
    first, second = [await bound_session(alice, runner, bundle) for _ in range(2)]
    running = await started_now(stub, first)
    waiting = await left_waiting(second)
    # The first turn ends: the slot goes to the waiting turn, whose turn.start the
    # runner never reads (its tunnel drops first).
    events = RunnerEvents(stub)
    await events.send(first.id, protocol.ResponseCreated(response_id=running))
    await events.send(first.id, protocol.ResponseCompleted(response_id=running))
    lost = await next_command(stub, "turn.start")
    assert lost["response_id"] == waiting
    await stub.drop()
    assert await acked_at(second, waiting) is None

    stub = await stubs.online(token, max_turns=1, open_sessions=[first.id, second.id])
    again = await next_command(stub, "turn.start")
    assert (again["session_id"], again["response_id"]) == (second.id, waiting)
    assert again["input"] == lost["input"]
    await stub.ack(again)
    await stub.nothing_pending()  # the ended turn is not sent again
    await stub.drop()  # the acknowledgement is recorded by the time the tunnel is gone
    assert await acked_at(second, waiting) is not None

    stub = await stubs.online(token, max_turns=1, open_sessions=[first.id, second.id])
    await stub.nothing_pending()


async def test_an_acknowledged_turn_start_is_not_sent_again_to_a_runner_holding_it(
    stubs: Stubs, runner_token: tuple[Runner, str], alice: Any, bundle: bytes
) -> None:
    """Turns the runner acknowledged (one queued behind another in its session) or
    started (``response.created`` stored, its ack lost with the tunnel) are not sent
    again when it comes back holding their sessions; a runner that comes back without
    them (restarted) is sent them all."""
    runner, token = runner_token
    stub = await stubs.online(token)
    first, second = [await bound_session(alice, runner, bundle) for _ in range(2)]
    running = await started_now(stub, first)
    behind = await started_now(stub, first)  # joins the slot: queued on the runner
    # A turn handed over whose ack never came, but whose start the runner reported.
    unanswered = await in_db(dispatched_turn)(second)
    events = RunnerEvents(stub)
    await events.send(second.id, protocol.ResponseCreated(response_id=unanswered))
    assert (await stub.recv())["type"] == "event.ack"
    await stub.drop()
    assert await acked_at(first, behind) is not None
    turn = await in_db(Turn.objects.get)(session_id=second.id, id=unanswered)
    assert turn.status == Turn.Status.IN_PROGRESS and turn.start_acked_at is not None

    stub = await stubs.online(token, open_sessions=[first.id, second.id])
    await stub.nothing_pending()
    await stub.drop()

    stub = await stubs.online(token)  # restarted: holds nothing
    sent = [await stub.recv() for _ in range(5)]  # each session's open, then its turns
    assert sorted(frame["type"] for frame in sent) == ["session.open"] * 2 + ["turn.start"] * 3
    starts = [
        (frame["session_id"], frame["response_id"]) for frame in sent if "response_id" in frame
    ]
    assert sorted(starts) == sorted(
        [(first.id, running), (first.id, behind), (second.id, unanswered)]
    )
    assert starts.index((first.id, running)) < starts.index((first.id, behind))


async def test_a_stopping_process_marks_the_acks_it_holds_before_the_runner_is_back(
    stubs: Stubs, runner_token: tuple[Runner, str], alice: Any, bundle: bytes
) -> None:
    """A process told to stop closes its tunnels with 4005, and marks the ``turn.start``
    acks no event carried yet then, not after its drain: the runner's next tunnel (on
    another process) is not sent those turns again."""
    runner, token = runner_token
    stub = await stubs.online(token)
    session = await bound_session(alice, runner, bundle)
    running = await started_now(stub, session)
    assert await acked_at(session, running) is None  # no event carried it yet

    await consumers.close_tunnels_for_restart()
    closed = await stub.comm.receive_output(timeout=FRAME_TIMEOUT)
    assert closed == {"type": "websocket.close", "code": 4005}, closed
    assert await acked_at(session, running) is not None

    again = await stubs.online(token, open_sessions=[session.id])
    await again.nothing_pending()
    await stub.drop()
