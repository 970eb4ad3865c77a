"""Budgets between the server and a stub runner on a real tunnel (usage.md, Budgets):
``session.open`` and ``turn.start`` carry the budgets; a recorded LLM call of a session
with a budget is followed by a ``policy.update`` (rules unchanged) with the new spend,
and one of a session without any budget by nothing; an accepted budget question is
relayed as the verdict, then the raised budget."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from channels.db import database_sync_to_async

from omnigent_runner import protocol
from runners.models import Runner
from sessions import budgets
from sessions.models import Approval, Session
from usage import services as usage_services
from usage.models import Price

from .stubs import (
    ALICE,
    MESSAGE,
    StubRunner,
    Stubs,
    bind,
    body_of,
    call,
    post_event,
    start,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

in_db = database_sync_to_async
NANO = 1_000_000_000


@pytest.fixture(autouse=True)
def price() -> Iterator[None]:
    """mock-model at $1 per million input tokens, so 1,000 tokens cost $0.001."""
    Price.objects.all().delete()
    Price.objects.create(
        model="mock-model", input_per_million=Decimal("1"), output_per_million=Decimal("0")
    )
    usage_services.prices.clear()
    yield
    usage_services.prices.clear()


def set_budget(session: Session, usd: float, on_budget: str | None = None) -> None:
    budgets.set_session_budget(
        session=session, actor=None, budget_nano=int(usd * NANO), on_budget=on_budget
    )


async def started_turn(stub: StubRunner, session: Session) -> tuple[dict, dict]:
    """A message posted: the ``session.open`` and ``turn.start`` the runner gets."""
    pending = start(post_event(session.id, {"type": "message", "data": MESSAGE}))
    opened = await stub.expect("session.open")
    await stub.ack(opened)
    turn_start = await stub.expect("turn.start")
    await stub.ack(turn_start)
    body_of(await pending, 202)
    return opened, turn_start


async def record_call(stub: StubRunner, session_id: str, response_id: str, seq: int) -> None:
    await stub.send(
        protocol.EventFrame(
            session_id=session_id,
            seq=seq,
            event=protocol.UsageRecorded(
                response_id=response_id, model="mock-model", input_tokens=1000
            ),
        )
    )


async def test_budgets_go_out_with_open_and_start_and_after_each_recorded_call(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    await in_db(set_budget)(session, 2.5, "deny")
    await bind(session, runner)
    stub = await stubs.online(token)
    opened, turn_start = await started_turn(stub, session)
    line = {"scope": "session", "limit_nano": 2_500_000_000, "spent_nano": 0, "on_budget": "deny"}
    assert opened["budgets"]["session"] == line
    assert opened["budgets"].get("user") is None
    assert turn_start["budgets"]["session"] == line

    await record_call(stub, session.id, turn_start["response_id"], 1)
    frames = [await stub.recv(), await stub.recv()]
    update = next(frame for frame in frames if frame["type"] == "policy.update")
    assert any(frame["type"] == "event.ack" for frame in frames), frames
    assert update["session_id"] == session.id
    assert update.get("rules") is None
    assert update["budgets"]["session"] == {**line, "spent_nano": 1_000_000}
    await stub.ack(update)
    await stub.nothing_pending()


async def test_a_session_without_any_budget_gets_no_update_after_a_call(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    await bind(session, runner)
    stub = await stubs.online(token)
    opened, turn_start = await started_turn(stub, session)
    assert opened["budgets"] in (None, {}, {"session": None, "user": None})
    await record_call(stub, session.id, turn_start["response_id"], 1)
    ack = await stub.recv()
    assert ack == {"type": "event.ack", "session_id": session.id, "seq": 1}, ack
    await stub.nothing_pending()


async def test_an_accepted_budget_question_is_relayed_then_the_raised_budget(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    await in_db(set_budget)(session, 1.0)
    await bind(session, runner)
    stub = await stubs.online(token)
    _opened, turn_start = await started_turn(stub, session)
    params = {
        "kind": "budget",
        "scope": "session",
        "budget_usd": 1.0,
        "spent_usd": 1.02,
        "increment_usd": 0.5,
    }
    await stub.send(
        protocol.EventFrame(
            session_id=session.id,
            seq=1,
            event=protocol.ApprovalRequested(
                response_id=turn_start["response_id"],
                call_id="budget_1",
                tool="",
                phase="budget",
                arguments=params,
                policy_name="budget",
                reason="the session's budget is spent",
                ask_timeout=600,
            ),
        )
    )
    assert (await stub.recv())["type"] == "event.ack"
    approval: Any = await in_db(Approval.objects.get)(session_id=session.id)
    assert approval.message.startswith("Budget reached: spent $1.02 of $1.00")
    pending = start(
        call(
            "post",
            f"/v1/sessions/{session.id}/elicitations/{approval.id}/resolve",
            ALICE,
            {"action": "accept"},
        )
    )
    verdict = await stub.expect("approval.verdict")
    assert verdict["action"] == "accept"
    await stub.ack(verdict)
    update = await stub.expect("policy.update")
    assert update["budgets"]["session"]["limit_nano"] == 1_500_000_000
    await stub.ack(update)
    body_of(await pending, 202)
    stored = await in_db(Session.objects.get)(pk=session.id)
    assert stored.budget_nano == 1_500_000_000


async def test_a_budget_patch_reaches_the_running_runner(
    stubs: Stubs, session: Session, runner_token: tuple[Runner, str]
) -> None:
    runner, token = runner_token
    await bind(session, runner)
    stub = await stubs.online(token, open_sessions=[session.id])
    pending = start(call("patch", f"/v1/sessions/{session.id}", ALICE, {"budget_usd": 0.75}))
    update = await stub.expect("policy.update")
    assert update.get("rules") is None
    assert update["budgets"]["session"] == {
        "scope": "session",
        "limit_nano": 750_000_000,
        "spent_nano": 0,
        "on_budget": None,
    }
    await stub.ack(update)
    assert body_of(await pending, 200)["budget_usd"] == 0.75
    removed = start(call("patch", f"/v1/sessions/{session.id}", ALICE, {"budget_usd": None}))
    cleared = await stub.expect("policy.update")
    assert cleared["budgets"] == {"session": None, "user": None}
    await stub.ack(cleared)
    body_of(await removed, 200)
