"""Budgets checked by the runner before every LLM call (usage.md, "Budgets").

Each test drives :class:`AgentExecutor` as the tunnel does (open, budgets, turn,
verdicts) against the in-process mock LLM, whose captured requests count the model
calls that were made. The server's numbers arrive as ``update_budgets`` (the tunnel's
handling of ``session.open``/``turn.start``/``policy.update`` budgets); a client tool
holds the turn between two model calls so a test can send the server's update there.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, Literal

import pytest

from omnigent_runner import protocol
from omnigent_runner.budgets import SessionBudgets, usd_text
from omnigent_runner.policies import NO_GUARDRAILS, Guardrails
from testing.mockllm import MockLLMServer
from tests.tools import WEATHER_TOOL
from tests.unit import agent_loop
from tests.unit.agent_loop import (
    SID,
    Executor,
    RecordingSink,
    agent,
    agent_yaml,
    call,
    start,
    user,
)

pytestmark = pytest.mark.timeout(60)

mock = agent_loop.mock
workspace = agent_loop.workspace
make_executor = agent_loop.make_executor

APIS = ["responses", "chat_completions"]
WEATHER_THEN_ANSWER = [
    {"tool_calls": [call("get_weather", {"city": "Paris"}, "call_w")]},
    {"text": "Sunny."},
]


def bundle(mock: MockLLMServer, guardrails: str = "", *, api: str = "responses") -> str:
    text = agent_yaml(mock.base_url, api=api)
    return text + ("guardrails:\n" + guardrails if guardrails else "")


def line(
    scope: Literal["session", "user"],
    limit: int,
    spent: int,
    on_budget: Literal["ask", "deny"] | None = None,
) -> protocol.BudgetLine:
    return protocol.BudgetLine(scope=scope, limit_nano=limit, spent_nano=spent, on_budget=on_budget)


def verdict(action: Literal["accept", "decline", "cancel"], n: int = 1) -> protocol.Verdict:
    """The verdict on the turn's ``n``-th budget question."""
    return agent_loop.verdict(action, f"budget_{n}", elicitation_id="elicit_b", resolved_by="alice")


async def failure(sink: RecordingSink) -> dict[str, Any]:
    end = await sink.wait_end("resp_1")
    assert end["status"] == "failed", end
    (failed,) = sink.of("response.failed", "resp_1")
    return dict(failed["error"])


async def asked(sink: RecordingSink, n: int = 1) -> dict[str, Any]:
    """The turn's ``n``-th budget question, once the runner asks."""
    return await agent_loop.asked(sink, f"budget_{n}")


# --- deny -----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_deny_stops_before_the_call(
    mock: MockLLMServer, make_executor: Callable[..., Executor], api: str
) -> None:
    mock.configure([{"text": "never"}])
    executor, sink = make_executor()
    budgets = protocol.Budgets(session=line("session", 1_000_000, 1_000_000))
    await start(executor, bundle(mock, "  on_budget: deny\n", api=api), budgets=budgets)
    error = await failure(sink)
    assert error == {
        "code": "budget_exceeded",
        "message": "the session budget is spent: $0.001 of $0.001",
        "scope": "session",
        "budget_usd": 0.001,
        "spent_usd": 0.001,
    }
    assert mock.requests == []
    assert sink.of("usage.recorded") == []


@pytest.mark.parametrize("api", APIS)
async def test_the_call_that_crosses_the_line_is_the_last(
    mock: MockLLMServer, make_executor: Callable[..., Executor], api: str
) -> None:
    """The first call starts under the budget; the server's update after it (sent while
    the turn waits for its client tool) stops the second one before it starts."""
    mock.configure(WEATHER_THEN_ANSWER)
    executor, sink = make_executor()
    budgets = protocol.Budgets(user=line("user", 5_000, 4_000, on_budget="deny"))
    await start(executor, bundle(mock, api=api), budgets=budgets, tools=[WEATHER_TOOL])
    await sink.wait_status("resp_1", "waiting")
    assert len(mock.requests) == 1
    assert len(sink.of("usage.recorded", "resp_1")) == 1
    # The server priced that call: the user's day is now over its budget.
    over = protocol.Budgets(user=line("user", 5_000, 6_500, on_budget="deny"))
    await executor.update_budgets(session_id=SID, budgets=over)
    await executor.tool_result(session_id=SID, call_id="call_w", output='{"temp": 21}')
    error = await failure(sink)
    assert error["code"] == "budget_exceeded"
    assert error["message"] == "the user budget is spent: $0.0000065 of $0.000005"
    assert (error["scope"], error["budget_usd"], error["spent_usd"]) == ("user", 5e-06, 6.5e-06)
    assert len(mock.requests) == 1
    assert sink.of("approval.requested") == []  # the line's own on_budget beat the bundle's ask


async def test_budgets_under_the_limit_let_every_call_through(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    mock.configure(WEATHER_THEN_ANSWER)
    executor, sink = make_executor()
    budgets = protocol.Budgets(session=line("session", 10_000, 9_999), user=line("user", 10_000, 0))
    await start(
        executor, bundle(mock, "  on_budget: deny\n"), budgets=budgets, tools=[WEATHER_TOOL]
    )
    await sink.wait_status("resp_1", "waiting")
    await executor.tool_result(session_id=SID, call_id="call_w", output="{}")
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert len(mock.requests) == 2


async def test_a_frame_without_budgets_leaves_them_and_a_reopen_keeps_them(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    mock.configure([{"text": "never"}])
    executor, sink = make_executor()
    yaml_text = bundle(mock, "  on_budget: deny\n")
    await executor.open_session(session_id=SID, agent=agent(yaml_text), history=[])
    spent = protocol.Budgets(session=line("session", 10, 10))
    await executor.update_budgets(session_id=SID, budgets=spent)
    # session.open again (a reconnect) without budgets: the lines stay.
    await executor.open_session(session_id=SID, agent=agent(yaml_text), history=[])
    await executor.start_turn(session_id=SID, response_id="resp_1", input=[user("go")], tools=[])
    assert (await failure(sink))["code"] == "budget_exceeded"
    assert mock.requests == []


async def test_budgets_for_a_session_not_open_are_ignored(
    make_executor: Callable[..., Executor],
) -> None:
    executor, sink = make_executor()
    await executor.update_budgets(
        session_id="nobody", budgets=protocol.Budgets(user=line("user", 1, 1))
    )
    assert sink.events == []


# --- ask ------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_ask_raises_a_budget_approval_and_accept_goes_on(
    mock: MockLLMServer, make_executor: Callable[..., Executor], api: str
) -> None:
    mock.configure(WEATHER_THEN_ANSWER)
    executor, sink = make_executor()
    budgets = protocol.Budgets(session=line("session", 2_000_000, 2_500_000))
    guardrails = "  ask_increment_usd: 0.01\n  ask_timeout: 120\n"
    await start(executor, bundle(mock, guardrails, api=api), budgets=budgets, tools=[WEATHER_TOOL])
    question = await asked(sink)
    assert question == {
        "type": "approval.requested",
        "response_id": "resp_1",
        "call_id": "budget_1",
        "tool": "",
        "arguments": {
            "kind": "budget",
            "scope": "session",
            "budget_usd": 0.002,
            "spent_usd": 0.0025,
            "increment_usd": 0.01,
        },
        "policy_name": "budget",
        "reason": "the session budget is spent: $0.0025 of $0.002",
        "ask_timeout": 120.0,
        "phase": "budget",
    }
    assert mock.requests == []
    assert [e["status"] for e in sink.of("session.status", "resp_1")] == ["running"]
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))
    await sink.wait_status("resp_1", "waiting")
    # The raise holds locally (limit 0.012 > spent 0.0025): the next call is not asked.
    await executor.tool_result(session_id=SID, call_id="call_w", output="{}")
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert len(mock.requests) == 2
    assert len(sink.of("approval.requested")) == 1


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_decline_or_cancel_fails_the_turn(
    mock: MockLLMServer, make_executor: Callable[..., Executor], action: Any
) -> None:
    mock.configure([{"text": "never"}])
    executor, sink = make_executor()
    budgets = protocol.Budgets(user=line("user", 100, 100))
    await start(executor, bundle(mock), budgets=budgets)
    question = await asked(sink)
    # The increment defaults to the budget again.
    assert question["arguments"]["increment_usd"] == question["arguments"]["budget_usd"] == 1e-7
    await executor.approval_verdict(session_id=SID, verdict=verdict(action))
    error = await failure(sink)
    answer = "declined" if action == "decline" else "not approved"
    assert error == {
        "code": "budget_exceeded",
        "message": f"the user budget is spent: $0.0000001 of $0.0000001; raising it was {answer}",
        "scope": "user",
        "budget_usd": 1e-07,
        "spent_usd": 1e-07,
    }
    assert mock.requests == []


async def test_a_new_server_update_replaces_the_local_raise(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    """After an accept the server's next numbers count (its raise is in them): spent
    past the raised limit asks again, as ``budget_2``."""
    mock.configure(WEATHER_THEN_ANSWER)
    executor, sink = make_executor()
    await start(
        executor,
        bundle(mock),
        budgets=protocol.Budgets(session=line("session", 1_000, 1_000)),
        tools=[WEATHER_TOOL],
    )
    await asked(sink)
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))
    await sink.wait_status("resp_1", "waiting")
    raised = protocol.Budgets(session=line("session", 2_000, 2_300))
    await executor.update_budgets(session_id=SID, budgets=raised)
    await executor.tool_result(session_id=SID, call_id="call_w", output="{}")
    second = await asked(sink, 2)
    assert second["arguments"]["budget_usd"] == 2e-6
    assert second["arguments"]["spent_usd"] == 2.3e-6
    assert len(mock.requests) == 1
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept", 2))
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert len(mock.requests) == 2


async def test_interrupt_while_asking_cancels_the_turn(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    mock.configure([{"text": "never"}])
    executor, sink = make_executor()
    await start(executor, bundle(mock), budgets=protocol.Budgets(session=line("session", 5, 9)))
    await asked(sink)
    await executor.interrupt(session_id=SID)
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert len(sink.of("response.cancelled", "resp_1")) == 1
    assert mock.requests == []


async def test_a_verdict_stored_before_a_rerun_is_used_without_asking(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    """A turn re-run after a restart asks ``budget_1`` again; the server's stored verdict
    (session.open's verdicts) answers it, nobody is asked twice."""
    mock.configure([{"text": "Done."}])
    executor, sink = make_executor()
    await executor.open_session(session_id=SID, agent=agent(bundle(mock)), history=[])
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))
    await executor.update_budgets(
        session_id=SID, budgets=protocol.Budgets(session=line("session", 5, 9))
    )
    await executor.start_turn(session_id=SID, response_id="resp_1", input=[user("go")], tools=[])
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert sink.of("approval.requested") == []
    assert len(mock.requests) == 1


# --- the bundle's own budget ----------------------------------------------------------------


async def test_a_zero_bundle_budget_with_no_increment_denies_even_with_ask(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    """There is nothing to raise a zero budget by: ``ask`` acts as ``deny``."""
    mock.configure([{"text": "never"}])
    executor, sink = make_executor()
    await start(executor, bundle(mock, "  budget_usd: 0\n  on_budget: ask\n"))
    error = await failure(sink)
    assert error == {
        "code": "budget_exceeded",
        "message": "the session budget is spent: $0.00 of $0.00",
        "scope": "session",
        "budget_usd": 0.0,
        "spent_usd": 0.0,
    }
    assert sink.of("approval.requested") == []
    assert mock.requests == []


async def test_the_bundle_budget_applies_when_the_server_sends_no_session_line(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    """An older server sends no session line: the bundle's budget (nothing spent known)
    still asks, and the accepted raise stays for later turns."""
    mock.configure([{"text": "One."}, {"text": "Two."}])
    executor, sink = make_executor()
    guardrails = "  budget_usd: 0\n  ask_increment_usd: 0.5\n"
    await start(
        executor, bundle(mock, guardrails), budgets=protocol.Budgets(user=line("user", 9, 0))
    )
    question = await asked(sink)
    assert question["arguments"] == {
        "kind": "budget",
        "scope": "session",
        "budget_usd": 0.0,
        "spent_usd": 0.0,
        "increment_usd": 0.5,
    }
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    # A later server update without a session line keeps the bundle line's raise.
    await executor.update_budgets(session_id=SID, budgets=protocol.Budgets(user=line("user", 9, 1)))
    await executor.start_turn(session_id=SID, response_id="resp_2", input=[user("again")], tools=[])
    assert (await sink.wait_end("resp_2"))["status"] == "idle"
    assert len(sink.of("approval.requested")) == 1
    assert len(mock.requests) == 2


async def test_a_server_session_line_wins_over_the_bundle_budget(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    mock.configure([{"text": "Fine."}])
    executor, sink = make_executor()
    budgets = protocol.Budgets(session=line("session", 1_000, 10))
    await start(executor, bundle(mock, "  budget_usd: 0\n  on_budget: deny\n"), budgets=budgets)
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert len(mock.requests) == 1


# --- the pure parts -------------------------------------------------------------------------


def test_the_first_spent_line_decides_and_its_own_on_budget_wins() -> None:
    book = SessionBudgets()
    assert book.overrun(NO_GUARDRAILS) is None
    book.update(
        protocol.Budgets(
            session=line("session", 10, 5), user=line("user", 10, 10, on_budget="deny")
        )
    )
    overrun = book.overrun(Guardrails(on_budget="ask", ask_increment_nano=3))
    assert overrun is not None
    assert (overrun.scope, overrun.on_budget, overrun.increment_nano) == ("user", "deny", 3)
    assert overrun.denies
    book.update(None)  # a frame without budgets changes nothing
    assert book.overrun(NO_GUARDRAILS) is not None
    book.update(protocol.Budgets(user=line("user", 10, 10)))
    asking = book.overrun(NO_GUARDRAILS)
    assert asking is not None and not asking.denies and asking.increment_nano == 10
    book.accept(asking)
    assert book.overrun(NO_GUARDRAILS) is None  # 20 > 10 until the server says otherwise
    book.update(protocol.Budgets(user=line("user", 10, 10)))
    assert book.overrun(NO_GUARDRAILS) is not None


@pytest.mark.parametrize(
    ("nano", "text"),
    [(0, "$0.00"), (1, "$0.000000001"), (1_500_000_000, "$1.50"), (2_345_600_000, "$2.3456")],
)
def test_usd_text(nano: int, text: str) -> None:
    assert usd_text(nano) == text


def test_question_params_are_json_numbers() -> None:
    book = SessionBudgets()
    book.update(protocol.Budgets(session=line("session", 250_000_000, 300_000_000)))
    overrun = book.overrun(Guardrails(ask_increment_nano=1_000_000_000))
    assert overrun is not None
    assert json.loads(json.dumps(overrun.params())) == {
        "kind": "budget",
        "scope": "session",
        "budget_usd": 0.25,
        "spent_usd": 0.3,
        "increment_usd": 1.0,
    }


async def test_asking_does_not_block_other_sessions(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    mock.configure([{"text": "Other."}])
    executor, sink = make_executor()
    await start(executor, bundle(mock), budgets=protocol.Budgets(session=line("session", 1, 1)))
    await asked(sink)
    await executor.open_session(session_id="sess_2", agent=agent(bundle(mock)), history=[])
    await executor.start_turn(
        session_id="sess_2", response_id="resp_2", input=[user("hi")], tools=[]
    )
    assert (await sink.wait_end("resp_2"))["status"] == "idle"
    await executor.interrupt(session_id=SID)
    await asyncio.wait_for(sink.wait_end("resp_1"), 20)
