"""A ``turn.start`` sent fire and forget and lost while the tunnel stayed up (issue 42,
operations.md) is sent again by the sweep of the process holding the runner's tunnel
(``runners.upkeep.resend_unacked_starts``), through the real tunnel consumer to a stub
runner. The runner's side (a copy acknowledged, never run twice) is
``tests/unit/test_runner_tunnel.py::test_a_turn_start_sent_again_is_acknowledged_and_runs_once``
and ``tests/unit/test_agent_executor.py::test_resent_start_turn_is_ignored``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from omnigent_runner import protocol
from runners import liveness, runner_events, services, upkeep
from runners.models import Runner
from sessions.models import Session, Turn
from sessions.services import create_session_from_bundle

from .stubs import ALICE, FRAME_TIMEOUT, Stubs, in_db

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

MESSAGE = {"role": "user", "content": "go"}


def unacked_turn(session: Session, *, sent_s_ago: float) -> Turn:
    """A message's turn given a slot ``sent_s_ago`` seconds ago, as the fair-share queue
    leaves it after posting its ``turn.start``: dispatched, never acknowledged."""
    _item, turn = runner_events.accept_message(
        session_id=session.id, created_by=ALICE, data=MESSAGE, tools=[]
    )
    turn.dispatched_at = timezone.now() - timedelta(seconds=sent_s_ago)
    Turn.objects.filter(pk=turn.pk).update(dispatched_at=turn.dispatched_at)
    return turn


def old() -> float:
    """Seconds ago that make a ``turn.start`` due to be sent again."""
    return services.start_resend_after_s() + 5


def bound(session: Session, runner: Runner, *, opened: bool = True) -> Session:
    """``session`` on ``runner``, open on its current connection unless not ``opened``."""
    generation = Runner.objects.get(pk=runner.pk).generation
    Session.objects.filter(pk=session.pk).update(
        runner=runner, runner_generation_opened=generation if opened else 0
    )
    return Session.objects.get(pk=session.pk)


def acked_at(turn: Turn) -> datetime | None:
    return Turn.objects.get(pk=turn.pk).start_acked_at


@pytest.fixture
def new_session(alice: Any, make_bundle: Callable[..., bytes]) -> Callable[[], Session]:
    bundle = make_bundle()
    return lambda: create_session_from_bundle(user=alice, data=bundle)


async def test_an_unacknowledged_old_turn_start_is_sent_again_once_per_sweep(
    stubs: Stubs, runner_token: tuple[Runner, str], new_session: Callable[[], Session]
) -> None:
    runner, token = runner_token
    stub = await stubs.online(token)
    session = await in_db(bound)(await in_db(new_session)(), runner)
    turn = await in_db(unacked_turn)(session, sent_s_ago=old())

    for _sweep in range(2):  # still unacknowledged: sent again by the next sweep too
        assert await upkeep.resend_unacked_starts() == 1
        again = await stub.expect("turn.start")
        assert (again["session_id"], again["response_id"]) == (session.id, turn.id)
        assert again["input"][0]["content"] == "go"
        assert again["budgets"] is not None
        await stub.nothing_pending()  # once per sweep, and no session.open: it is open

    await stub.ack(again)
    await stub.nothing_pending()  # the probe's event makes the writer mark the ack
    assert await in_db(acked_at)(turn) is not None
    assert await upkeep.resend_unacked_starts() == 0
    await stub.nothing_pending()


async def test_a_session_the_connection_never_opened_gets_session_open_first(
    stubs: Stubs, runner_token: tuple[Runner, str], new_session: Callable[[], Session]
) -> None:
    """Both commands of a turn the queue started on a session this connection had not
    opened were lost: without ``session.open`` the runner would refuse the copy."""
    runner, token = runner_token
    stub = await stubs.online(token)
    session = await in_db(bound)(await in_db(new_session)(), runner, opened=False)
    first = await in_db(unacked_turn)(session, sent_s_ago=old() + 1)
    second = await in_db(unacked_turn)(session, sent_s_ago=old())

    assert await upkeep.resend_unacked_starts() == 2
    opened = await stub.expect("session.open")
    assert opened["session_id"] == session.id
    # Not the messages of turns the runner has not started: each comes with its turn.
    assert opened["history"] == []
    starts = [await stub.expect("turn.start") for _ in range(2)]
    assert [frame["response_id"] for frame in starts] == [first.id, second.id]
    await stub.nothing_pending()


async def test_an_ack_no_event_carries_is_marked_at_the_next_heartbeat(
    stubs: Stubs,
    runner_token: tuple[Runner, str],
    new_session: Callable[[], Session],
    settings: Any,
) -> None:
    """A turn the runner queued behind a quiet one sends no event for a while: its ack
    is marked by the tunnel's heartbeat, so the sweep stops sending it."""
    settings.OMNIGENT_HEARTBEAT_S = 0.2
    runner, token = runner_token
    stub = await stubs.online(token)
    session = await in_db(bound)(await in_db(new_session)(), runner)
    turn = await in_db(unacked_turn)(session, sent_s_ago=old())
    assert await upkeep.resend_unacked_starts() == 1
    await stub.ack(await stub.expect("turn.start"))
    async with asyncio.timeout(10 * FRAME_TIMEOUT):
        while await in_db(acked_at)(turn) is None:
            ping = await stub.expect("ping")
            await stub.send(protocol.Pong(ts=ping["ts"]))
    assert await upkeep.resend_unacked_starts() == 0


async def test_a_copy_the_runner_refuses_fails_the_turn_instead_of_coming_back(
    stubs: Stubs, runner_token: tuple[Runner, str], new_session: Callable[[], Session]
) -> None:
    """A ``turn.start`` nobody waits for that the runner refuses would be refused again
    at every sweep: the turn fails visibly, as a refused message's turn does."""
    runner, token = runner_token
    stub = await stubs.online(token)
    session = await in_db(bound)(await in_db(new_session)(), runner)
    turn = await in_db(unacked_turn)(session, sent_s_ago=old())
    assert await upkeep.resend_unacked_starts() == 1
    await stub.nack(await stub.expect("turn.start"), code="session_not_open")
    # The consumer handles frames in order: once the probe is answered, so is the nack.
    await stub.nothing_pending()
    failed = await in_db(Turn.objects.get)(pk=turn.pk)
    assert failed.status == Turn.Status.FAILED
    assert failed.error == {
        "code": "runner_unreachable",
        "message": "the runner did not accept the turn: no",
    }
    assert await upkeep.resend_unacked_starts() == 0
    await stub.nothing_pending()


def test_only_old_unacknowledged_open_turns_on_this_process_online_runners_are_found(
    alice: Any, new_session: Callable[[], Session]
) -> None:
    def online_runner(name: str, **row: Any) -> Runner:
        runner, _token = services.register_runner(owner=alice, name=name)
        fields = {
            "channel_name": f"chan-{name}",
            "generation": 1,
            "tunnel_process": liveness.PROCESS_ID,
            "last_seen_at": timezone.now(),
            **row,
        }
        Runner.objects.filter(pk=runner.pk).update(**fields)
        return Runner.objects.get(pk=runner.pk)

    here = online_runner("here")
    due = unacked_turn(bound(new_session(), here), sent_s_ago=old())
    acked = unacked_turn(bound(new_session(), here), sent_s_ago=old())
    Turn.objects.filter(pk=acked.pk).update(start_acked_at=timezone.now())
    young = unacked_turn(bound(new_session(), here), sent_s_ago=0)
    closed = unacked_turn(bound(new_session(), here), sent_s_ago=old())
    Turn.objects.filter(pk=closed.pk).update(status=Turn.Status.COMPLETED)
    waiting = unacked_turn(bound(new_session(), here), sent_s_ago=old())
    Turn.objects.filter(pk=waiting.pk).update(dispatched_at=None)  # in the server's queue
    others = [
        online_runner("offline", channel_name=""),
        online_runner("silent", last_seen_at=timezone.now() - timedelta(hours=1)),
        online_runner("revoked", revoked_at=timezone.now()),
        online_runner("elsewhere", tunnel_process="srv_another_process"),
    ]
    for runner in others:
        unacked_turn(bound(new_session(), runner), sent_s_ago=old())

    def found(**kwargs: Any) -> list[tuple[str, list[str]]]:
        return [
            (channel, [getattr(c, "response_id", protocol.frame_type(c)) for c in commands])
            for channel, commands in services.unacked_starts_to_resend(
                process_id=liveness.PROCESS_ID, **kwargs
            )
        ]

    assert found() == [("chan-here", [due.id])]
    # The clock is the caller's: a minute on, the young turn is due too.
    later = timezone.now() + timedelta(minutes=1)
    assert found(now=later) == [("chan-here", [due.id, young.id])]
    assert found(now=later, limit=1) == [("chan-here", [due.id])]  # the oldest first


def test_a_message_request_gives_up_before_its_turn_start_is_sent_again(
    settings: Any,
) -> None:
    """The request of a message waits ``OMNIGENT_RELAY_TIMEOUT_S`` for each of its two
    commands; its turn is not sent again before then, whatever the setting says."""
    settings.OMNIGENT_RELAY_TIMEOUT_S = 10
    settings.OMNIGENT_START_RESEND_S = 1
    assert services.start_resend_after_s() == 20
    settings.OMNIGENT_START_RESEND_S = 45
    assert services.start_resend_after_s() == 45


async def test_zero_turns_the_sweep_off(settings: Any) -> None:
    settings.OMNIGENT_START_RESEND_S = 0
    async with asyncio.timeout(FRAME_TIMEOUT):
        await upkeep.resend_unacked_starts_forever()  # returns: no loop
