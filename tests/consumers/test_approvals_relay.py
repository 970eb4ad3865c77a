"""Approvals between the HTTP API and a stub runner on a real tunnel (approvals.md, tunnel.md).

``approval.requested`` stored once however often it arrives; a verdict stored first
and relayed as ``approval.verdict`` (acknowledged → not resent); an offline runner
gets it in ``session.open.verdicts``; a restarted runner that asks again gets the
stored verdict instead of a second question; the expiry sweep; an interrupt; policy
changes reaching a running runner (``policy.update``); ``policy.denied``; and two
writers racing for one question, of which exactly one wins.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.utils import timezone

from omnigent_runner import protocol
from runners import runner_events
from runners.models import Runner
from runners.verdicts import sweep_expired_approvals
from sessions import approvals
from sessions.models import Approval, Session, SessionEvent, Turn
from tests.turns import handed_to_runner

from .stubs import (
    ALICE,
    FRAME_TIMEOUT,
    MESSAGE,
    StubRunner,
    Stubs,
    bind,
    body_of,
    call,
    error_of,
    post_event,
    start,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

in_db = database_sync_to_async
SHELL = {"command": "rm -rf build"}
VERDICT_KEYS = {
    "type",
    "id",
    "session_id",
    "elicitation_id",
    "response_id",
    "call_id",
    "action",
    "resolved_by",
}


async def eventually(check: Callable[[], Any], *, timeout: float = FRAME_TIMEOUT) -> Any:
    """Poll the synchronous ``check`` (in the DB thread) until it returns truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await in_db(check)()
        if value:
            return value
        assert time.monotonic() < deadline, f"condition not met within {timeout} s"
        await asyncio.sleep(0.02)


async def open_turn(session: Session) -> Turn:
    """A message's turn, handed to the runner (it holds a slot, usage.md)."""
    _item, response = await in_db(runner_events.accept_message)(
        session_id=session.id, created_by=ALICE, data=MESSAGE, tools=[]
    )
    return await in_db(handed_to_runner)(response)


def requested(response_id: str, *, call_id: str = "call_1", timeout: float = 600) -> Any:
    return protocol.ApprovalRequested(
        response_id=response_id,
        call_id=call_id,
        tool="sys_os_shell",
        arguments=SHELL,
        policy_name="ask-shell",
        reason="shell needs a yes",
        ask_timeout=timeout,
    )


async def send_event(stub: StubRunner, session_id: str, seq: int, event: Any) -> None:
    await stub.send(protocol.EventFrame(session_id=session_id, seq=seq, event=event))
    ack = await stub.expect("event.ack")
    assert ack == {"type": "event.ack", "session_id": session_id, "seq": seq}, ack


def payloads(session_id: str, kind: str) -> list[dict[str, Any]]:
    return list(
        SessionEvent.objects.filter(session_id=session_id, type=kind)
        .order_by("seq")
        .values_list("payload", flat=True)
    )


async def asked(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], **kwargs: Any
) -> tuple[StubRunner, Turn, Approval]:
    """A bound session whose open turn asks about one call, its runner online."""
    runner, token = runner_token
    await bind(session, runner)
    turn = await open_turn(session)
    stub = await stubs.online(token, open_sessions=[session.id])
    await send_event(stub, session.id, 1, requested(turn.id, **kwargs))
    approval = await in_db(Approval.objects.get)(response_id=turn.id)
    return stub, turn, approval


def resolve_path(session_id: str, approval_id: str) -> str:
    return f"/v1/sessions/{session_id}/elicitations/{approval_id}/resolve"


# --- asking -------------------------------------------------------------------------------


async def test_a_question_delivered_twice_or_asked_again_is_stored_once(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub, turn, approval = await asked(stubs, session, runner_token)
    await send_event(stub, session.id, 1, requested(turn.id))  # the same event again
    await send_event(stub, session.id, 2, requested(turn.id))  # asked again, new seq
    assert await in_db(Approval.objects.filter(session=session).count)() == 1
    shown = await in_db(payloads)(session.id, "response.elicitation_request")
    assert [p["elicitation_id"] for p in shown] == [approval.id]
    assert shown[0]["params"]["content_preview"] == '{"command": "rm -rf build"}'
    await stub.nothing_pending()  # still open: nothing is sent to the runner
    assert (await in_db(Session.objects.get)(pk=session.id)).status == "running"


async def test_a_question_for_an_unknown_turn_is_acknowledged_and_skipped(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    await bind(session, runner)
    stub = await stubs.online(token, open_sessions=[session.id])
    await send_event(stub, session.id, 1, requested("resp_unknown"))
    assert await in_db(Approval.objects.count)() == 0


# --- answering ----------------------------------------------------------------------------


async def test_a_verdict_is_stored_then_relayed_and_marked_acknowledged(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub, turn, approval = await asked(stubs, session, runner_token)
    pending = start(
        call("post", resolve_path(session.id, approval.id), ALICE, {"action": "decline"})
    )
    frame = await stub.expect("approval.verdict")
    assert set(frame) == VERDICT_KEYS, frame
    assert frame["session_id"] == session.id
    assert frame["elicitation_id"] == approval.id
    assert (frame["response_id"], frame["call_id"]) == (turn.id, "call_1")
    assert (frame["action"], frame["resolved_by"]) == ("decline", ALICE)
    # Stored before the runner answered.
    stored = await in_db(Approval.objects.get)(pk=approval.id)
    assert (stored.status, stored.runner_acked) == ("declined", False)
    assert not pending.done()
    await stub.ack(frame)
    assert body_of(await pending, 202) == {"queued": False}
    assert (await in_db(Approval.objects.get)(pk=approval.id)).runner_acked is True
    # The same answer again changes nothing and sends nothing; another is a 409.
    again = await call("post", resolve_path(session.id, approval.id), ALICE, {"action": "decline"})
    assert body_of(again, 202) == {"queued": False}
    other = await post_event(
        session.id,
        {"type": "approval", "data": {"elicitation_id": approval.id, "action": "accept"}},
    )
    error_of(other, 409, "conflict")
    await stub.nothing_pending()


async def test_a_runner_that_refuses_the_verdict_still_gets_202_and_gets_it_on_open(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub, _turn, approval = await asked(stubs, session, runner_token)
    pending = start(
        post_event(
            session.id,
            {"type": "approval", "data": {"elicitation_id": approval.id, "action": "accept"}},
        )
    )
    await stub.nack(await stub.expect("approval.verdict"))
    assert body_of(await pending, 202) == {"queued": False}
    stored = await in_db(Approval.objects.get)(pk=approval.id)
    assert (stored.status, stored.runner_acked) == ("accepted", False)


async def test_an_offline_runner_gets_the_verdict_in_session_open(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub, turn, approval = await asked(stubs, session, runner_token)
    await stub.drop()
    body = {"action": "cancel", "reason": "not today"}
    response = await call("post", resolve_path(session.id, approval.id), ALICE, body)
    assert body_of(response, 202) == {"queued": False}  # never a 503

    _runner, token = runner_token
    restarted = await stubs.online(token)  # a restart: holds no session
    opened = await restarted.expect("session.open")
    assert opened["verdicts"] == [
        {
            "elicitation_id": approval.id,
            "response_id": turn.id,
            "call_id": "call_1",
            "action": "cancel",
            "reason": "not today",
            "resolved_by": ALICE,
        }
    ]
    start_frame = await restarted.expect("turn.start")
    await restarted.ack(opened)
    await restarted.ack(start_frame)
    await eventually(lambda: Approval.objects.get(pk=approval.id).runner_acked)
    await restarted.drop()

    again = await stubs.online(token)
    reopened = await again.expect("session.open")
    assert reopened["verdicts"] == []  # acknowledged: not sent again


async def test_a_runner_back_after_a_tunnel_drop_gets_the_verdict_it_missed(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub, turn, approval = await asked(stubs, session, runner_token)
    await stub.drop()
    response = await call(
        "post", resolve_path(session.id, approval.id), ALICE, {"action": "accept"}
    )
    body_of(response, 202)
    _runner, token = runner_token
    back = await stubs.online(token, open_sessions=[session.id])  # still holds the session
    frame = await back.expect("approval.verdict")
    assert (frame["elicitation_id"], frame["call_id"], frame["action"]) == (
        approval.id,
        "call_1",
        "accept",
    )
    assert frame["response_id"] == turn.id
    await back.ack(frame)
    await eventually(lambda: Approval.objects.get(pk=approval.id).runner_acked)
    await back.drop()
    again = await stubs.online(token, open_sessions=[session.id])
    await again.nothing_pending()  # acknowledged: not sent a second time


async def test_a_restarted_runner_asking_again_gets_the_stored_verdict(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub, turn, approval = await asked(stubs, session, runner_token)
    pending = start(
        call("post", resolve_path(session.id, approval.id), ALICE, {"action": "accept"})
    )
    await stub.ack(await stub.expect("approval.verdict"))
    body_of(await pending, 202)
    # The runner re-runs the turn and asks about the same call again: the stored
    # verdict is sent (it may overtake the event's acknowledgement).
    await stub.send(protocol.EventFrame(session_id=session.id, seq=2, event=requested(turn.id)))
    frames = {frame["type"]: frame for frame in [await stub.recv(), await stub.recv()]}
    assert frames["event.ack"]["seq"] == 2
    relayed = frames["approval.verdict"]
    assert (relayed["elicitation_id"], relayed["action"]) == (approval.id, "accept")
    assert await in_db(Approval.objects.count)() == 1
    assert len(await in_db(payloads)(session.id, "response.elicitation_request")) == 1
    assert len(await in_db(payloads)(session.id, "response.elicitation_resolved")) == 1
    assert (await in_db(Approval.objects.get)(pk=approval.id)).runner_acked is False
    await stub.ack(relayed)
    await eventually(lambda: Approval.objects.get(pk=approval.id).runner_acked)


# --- expiry and interrupt -----------------------------------------------------------------


async def test_the_sweep_expires_a_question_with_a_tiny_timeout(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str], settings: Any
) -> None:
    settings.OMNIGENT_ASK_TIMEOUT_S = 0.05  # caps the rule's 600 s
    stub, _turn, approval = await asked(stubs, session, runner_token)
    assert approval.expires_at - approval.created_at < timedelta(seconds=1)
    deadline = time.monotonic() + FRAME_TIMEOUT
    while not await sweep_expired_approvals():
        assert time.monotonic() < deadline, "the question never expired"
        await asyncio.sleep(0.02)
    frame = await stub.expect("approval.verdict")
    assert (frame["elicitation_id"], frame["action"], frame["reason"]) == (
        approval.id,
        "cancel",
        "unanswered",
    )
    assert "resolved_by" not in frame
    await stub.ack(frame)
    await eventually(lambda: Approval.objects.get(pk=approval.id).runner_acked)
    stored = await in_db(Approval.objects.get)(pk=approval.id)
    assert (stored.status, stored.reason) == ("expired", "unanswered")
    assert await in_db(payloads)(session.id, "response.elicitation_resolved") == [
        {
            "type": "response.elicitation_resolved",
            "elicitation_id": approval.id,
            "action": "cancel",
            "reason": "unanswered",
        }
    ]
    assert await sweep_expired_approvals() == 0  # expired once


async def test_an_interrupt_cancels_the_question_after_the_turn(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    stub, _turn, approval = await asked(stubs, session, runner_token)
    pending = start(post_event(session.id, {"type": "interrupt"}))
    await stub.ack(await stub.expect("turn.interrupt"))
    frame = await stub.expect("approval.verdict")
    assert (frame["action"], frame["reason"], frame["resolved_by"]) == (
        "cancel",
        "interrupted",
        ALICE,
    )
    await stub.ack(frame)
    assert body_of(await pending, 202) == {"queued": False}
    assert (await in_db(Approval.objects.get)(pk=approval.id)).status == "cancelled"


# --- policies -----------------------------------------------------------------------------


async def test_a_policy_change_reaches_the_running_runner_and_the_next_open(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    await bind(session, runner)
    stub = await stubs.online(token, open_sessions=[session.id])
    rule = {"name": "ask-shell", "tools": ["sys_os_shell"], "action": "ask"}
    pending = start(call("put", f"/v1/sessions/{session.id}/policies", ALICE, {"rules": [rule]}))
    update = await stub.expect("policy.update")
    effective = [{**rule, "ask_timeout": 3600.0}]
    assert update["session_id"] == session.id
    assert update["rules"] == effective
    await stub.ack(update)
    body = body_of(await pending, 200)
    assert body["data"] == [{**rule, "ask_timeout": 3600.0, "source": "session"}]
    await stub.drop()

    restarted = await stubs.online(token)
    opened = await restarted.expect("session.open")
    assert opened["policies"] == effective


async def test_a_policy_change_with_the_runner_offline_is_stored(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, _token = runner_token
    await bind(session, runner)  # registered, never connected
    rule = {"name": "no-shell", "tools": ["sys_os_shell"], "action": "deny"}
    response = await call("put", f"/v1/sessions/{session.id}/policies", ALICE, {"rules": [rule]})
    assert body_of(response, 200)["data"] == [{**rule, "source": "session"}]


async def test_a_denied_call_is_shown_with_every_field(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    await bind(session, runner)
    turn = await open_turn(session)
    stub = await stubs.online(token, open_sessions=[session.id])
    denied = protocol.PolicyDenied(
        response_id=turn.id,
        call_id="call_9",
        tool="sys_os_shell",
        policy_name="no-rm",
        reason="no deleting",
    )
    await send_event(stub, session.id, 1, denied)
    assert await in_db(payloads)(session.id, "response.policy_denied") == [
        {
            "type": "response.policy_denied",
            "conversation_id": session.id,
            "session_id": session.id,
            "response_id": turn.id,
            "call_id": "call_9",
            "tool": "sys_os_shell",
            "policy_name": "no-rm",
            "reason": "no deleting",
            "phase": "tool_call",
        }
    ]


# --- two writers, one verdict -------------------------------------------------------------


def race(workers: list[Callable[[], Any]]) -> list[Any]:
    """Run the workers at once on their own threads (and database connections)."""
    barrier = threading.Barrier(len(workers))
    results: list[Any] = [None] * len(workers)

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = workers[index]()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def pending_question(session: Session, *, due: bool = False) -> Approval:
    turn = Turn.objects.create(session=session, status=Turn.Status.IN_PROGRESS)
    approval = approvals.record_requested(
        session=session, turn=turn, event=requested(turn.id)
    ).approval
    if due:
        Approval.objects.filter(pk=approval.pk).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
    return approval


def test_two_concurrent_answers_one_verdict(session: Session, alice: Any) -> None:
    approval = pending_question(session)
    actions = ["accept", "decline"] * 4

    def answer(action: str) -> Callable[[], Any]:
        return lambda: approvals.resolve(
            session_id=session.id, approval_id=approval.id, action=action, user=alice
        )

    results = race([answer(action) for action in actions])
    assert not [r for r in results if isinstance(r, BaseException)], results
    winners = [r for r in results if r.stored]
    assert len(winners) == 1
    won = winners[0].approval.action
    for result, action in zip(results, actions, strict=True):
        assert result.conflict == (action != won)
    stored = Approval.objects.get(pk=approval.pk)
    assert stored.action == won
    assert len(payloads(session.id, "response.elicitation_resolved")) == 1


def test_an_answer_racing_the_expiry_sweep_one_verdict(session: Session, alice: Any) -> None:
    approval = pending_question(session, due=True)
    results = race(
        [
            lambda: approvals.resolve(
                session_id=session.id, approval_id=approval.id, action="accept", user=alice
            ),
            approvals.expire_due,
            approvals.expire_due,
            lambda: approvals.resolve(
                session_id=session.id, approval_id=approval.id, action="accept", user=alice
            ),
        ]
    )
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert Approval.objects.get(pk=approval.pk).status == "expired"
    assert results[0].conflict and results[3].conflict
    expired_by_sweeps = len(results[1]) + len(results[2])
    expired_by_answers = int(results[0].stored) + int(results[3].stored)
    assert expired_by_sweeps + expired_by_answers == 1
    assert len(payloads(session.id, "response.elicitation_resolved")) == 1


async def test_a_question_for_a_turn_the_server_ended_is_cancelled_at_once(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    await bind(session, runner)
    turn = await open_turn(session)
    await in_db(runner_events.fail_turn)(
        session_id=session.id, response_id=turn.id, code="runner_disconnected", message="gone"
    )
    stub = await stubs.online(token, open_sessions=[session.id])
    await stub.send(protocol.EventFrame(session_id=session.id, seq=1, event=requested(turn.id)))
    frames = {frame["type"]: frame for frame in [await stub.recv(), await stub.recv()]}
    assert frames["event.ack"]["seq"] == 1
    verdict = frames["approval.verdict"]
    assert (verdict["action"], verdict["reason"]) == ("cancel", "the turn ended")
    stored = await in_db(Approval.objects.get)(response_id=turn.id)
    assert stored.status == "cancelled"
