"""The runner's policy gate (approvals.md) with the real agent loop and the mock LLM.

Each test drives :class:`AgentExecutor` as the tunnel does (open, rules, turn, verdicts,
interrupts) and checks three things: the events sent (``policy.denied``,
``approval.requested``), the workspace (did the tool run?) and what the model was given
(the mock's echo scripts answer with the tool output they received). Nothing sleeps
where an event can be awaited.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from omnigent_runner import protocol
from omnigent_runner.agent import AgentExecutor
from omnigent_runner.bundles import build_bundle
from omnigent_runner.config import RunnerConfig
from omnigent_runner.policies import RuleError, parse_guardrails, parse_rules
from omnigent_runner.tunnel import RunnerTunnel
from testing.mockllm import MockLLMServer, tool_then_echo
from tests.tools import WEATHER_TOOL
from tests.unit import agent_loop
from tests.unit.agent_loop import (
    SID,
    Executor,
    RecordingSink,
    agent,
    agent_yaml,
    asked,
    call,
    done_items,
    start,
    user,
    verdict,
)
from tests.unit.test_runner_tunnel import RUNNER_ID, TOKEN, handshake, recv_frame, send_frame

pytestmark = pytest.mark.timeout(60)

WRITE = {"path": "out.txt", "content": "written\n"}

mock = agent_loop.mock
workspace = agent_loop.workspace
make_executor = agent_loop.make_executor


def rules(*raw: dict[str, Any]) -> list[protocol.PolicyRule]:
    return parse_rules(list(raw))


def answer_text(sink: RecordingSink, response_id: str = "resp_1") -> str:
    """The text of the turn's last assistant message (the mock's echo)."""
    messages = [i for i in done_items(sink, response_id) if i["type"] == "message"]
    return str(messages[-1]["content"][0]["text"])


def outputs(sink: RecordingSink, response_id: str = "resp_1") -> dict[str, str]:
    return {
        i["call_id"]: i["output"]
        for i in done_items(sink, response_id)
        if i["type"] == "function_call_output"
    }


ASK_WRITE = {"name": "ask-write", "tools": ["sys_os_w*"], "action": "ask", "reason": "writes"}


# --- deny ---------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_deny_does_not_run_and_the_model_sees_the_refusal(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path, api: str
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    deny = {"name": "no-write", "tools": ["sys_os_write"], "action": "deny", "reason": "no"}
    await start(executor, agent_yaml(mock.base_url, os_env=".", api=api), rules(deny))

    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert not (workspace / "out.txt").exists()
    refusal = '{"error": "denied by policy no-write: no"}'
    assert outputs(sink) == {"call_echo": refusal}
    assert answer_text(sink) == refusal  # what the model was given
    (denied,) = sink.of("policy.denied")
    assert denied == {
        "type": "policy.denied",
        "response_id": "resp_1",
        "call_id": "call_echo",
        "tool": "sys_os_write",
        "policy_name": "no-write",
        "reason": "no",
    }
    assert sink.of("approval.requested") == []


async def test_first_matching_rule_decides_and_when_sees_the_arguments(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    policies = rules(
        {
            "name": "allow-other",
            "tools": ["sys_os_write"],
            "when": {"path": "^docs/"},
            "action": "allow",
        },
        {"name": "deny-txt", "tools": ["sys_os_*"], "when": {"path": r"\.txt$"}, "action": "deny"},
        {"name": "ask-all", "tools": ["*"], "action": "ask"},
    )
    await start(executor, agent_yaml(mock.base_url, os_env="."), policies)
    await sink.wait_end("resp_1")
    assert outputs(sink) == {"call_echo": '{"error": "denied by policy deny-txt: no reason"}'}
    assert sink.of("policy.denied")[0]["reason"] == ""


async def test_allowed_call_runs(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    allow = {"name": "ok", "tools": ["sys_os_write"], "action": "allow"}
    await start(executor, agent_yaml(mock.base_url, os_env="."), rules(allow, ASK_WRITE))
    await sink.wait_end("resp_1")
    assert (workspace / "out.txt").read_text() == "written\n"
    assert sink.of("approval.requested") == [] and sink.of("policy.denied") == []


# --- ask ----------------------------------------------------------------------------------


async def test_ask_then_accept_runs_with_the_arguments_shown(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    rule = {**ASK_WRITE, "ask_timeout": 120}
    await start(executor, agent_yaml(mock.base_url, os_env="."), rules(rule))

    request = await asked(sink)
    assert request == {
        "type": "approval.requested",
        "response_id": "resp_1",
        "call_id": "call_echo",
        "tool": "sys_os_write",
        "arguments": WRITE,
        "policy_name": "ask-write",
        "reason": "writes",
        "ask_timeout": 120.0,
    }
    assert not (workspace / "out.txt").exists()  # parked, not run
    assert [e["status"] for e in sink.of("session.status", "resp_1")] == ["running"]
    assert len(mock.requests) == 1

    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert (workspace / "out.txt").read_text() == WRITE["content"]
    assert json.loads(outputs(sink)["call_echo"])["created"] is True
    assert executor._verdicts.parked_keys() == []


async def test_ask_then_decline_names_who_and_why(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    await start(executor, agent_yaml(mock.base_url, os_env="."), rules(ASK_WRITE))
    await asked(sink)
    declined = verdict("decline", reason="too risky", resolved_by="alice")
    await executor.approval_verdict(session_id=SID, verdict=declined)
    await sink.wait_end("resp_1")
    assert not (workspace / "out.txt").exists()
    assert answer_text(sink) == '{"error": "declined by alice: too risky"}'


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (verdict("decline", resolved_by="bob"), '{"error": "declined by bob: no reason"}'),
        (verdict("cancel", reason="unanswered"), '{"error": "not approved"}'),
        (verdict("cancel"), '{"error": "not approved"}'),
    ],
)
async def test_refusal_outputs(
    mock: MockLLMServer,
    make_executor: Callable[..., Executor],
    workspace: Path,
    given: protocol.Verdict,
    expected: str,
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    await start(executor, agent_yaml(mock.base_url, os_env="."), rules(ASK_WRITE))
    await asked(sink)
    await executor.approval_verdict(session_id=SID, verdict=given)
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert not (workspace / "out.txt").exists()
    assert answer_text(sink) == expected


async def test_verdict_before_the_call_is_applied_without_asking(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    """A re-run turn: the server already holds the verdict and sent it first."""
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))
    await start(executor, agent_yaml(mock.base_url, os_env="."), rules(ASK_WRITE))
    await sink.wait_end("resp_1")
    assert sink.of("approval.requested") == []
    assert (workspace / "out.txt").exists()


async def test_a_verdict_for_another_session_or_turn_does_not_apply(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    await executor.approval_verdict(session_id="other", verdict=verdict("accept"))
    other_turn = protocol.Verdict(
        elicitation_id="e", response_id="resp_9", call_id="call_echo", action="accept"
    )
    await executor.approval_verdict(session_id=SID, verdict=other_turn)
    await start(executor, agent_yaml(mock.base_url, os_env="."), rules(ASK_WRITE))
    await asked(sink)  # still asked: neither verdict is this call's
    assert not (workspace / "out.txt").exists()
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))
    await executor.approval_verdict(session_id=SID, verdict=verdict("decline"))  # late: ignored
    await sink.wait_end("resp_1")
    assert (workspace / "out.txt").exists()


async def test_interrupt_answers_the_waiting_call_not_approved(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    await start(executor, agent_yaml(mock.base_url, os_env="."), rules(ASK_WRITE))
    await asked(sink)
    await executor.interrupt(session_id=SID)
    await sink.wait_end("resp_1")
    assert sink.of("response.cancelled", "resp_1")
    assert outputs(sink) == {"call_echo": '{"error": "not approved"}'}
    assert executor._verdicts.parked_keys() == []
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))  # too late
    assert not (workspace / "out.txt").exists()
    assert len(mock.requests) == 1


async def test_policy_update_applies_from_the_next_call_mid_turn(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    second = {"path": "second.txt", "content": "2"}
    mock.configure(
        [
            {
                "tool_calls": [
                    call("sys_os_write", WRITE, "call_1"),
                    call("sys_os_write", second, "call_2"),
                ]
            },
            {"echo_tool_output": True},
        ]
    )
    executor, sink = make_executor()
    await start(executor, agent_yaml(mock.base_url, os_env="."), rules(ASK_WRITE))
    await asked(sink, "call_1")
    deny = {"name": "now-denied", "tools": ["sys_os_write"], "action": "deny", "reason": "changed"}
    await executor.update_policies(session_id=SID, rules=rules(deny))
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept", "call_1"))
    await sink.wait_end("resp_1")
    assert (workspace / "out.txt").exists()  # asked under the old rules, accepted
    assert not (workspace / "second.txt").exists()  # the new rules apply to the next call
    assert outputs(sink)["call_2"] == '{"error": "denied by policy now-denied: changed"}'
    assert [e["call_id"] for e in sink.of("approval.requested")] == ["call_1"]


async def test_another_session_goes_on_while_a_call_waits(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE), match="WAITER")
    mock.configure([{"text": "free"}], match="OTHER")
    executor, sink = make_executor()
    yaml_text = agent_yaml(mock.base_url, os_env=".")
    await executor.open_session(session_id="s_wait", agent=agent(yaml_text), history=[])
    await executor.update_policies(session_id="s_wait", rules=rules(ASK_WRITE))
    await executor.start_turn(
        session_id="s_wait", response_id="resp_1", input=[user("WAITER")], tools=[]
    )
    await asked(sink)
    await executor.open_session(session_id="s_free", agent=agent(yaml_text), history=[])
    await executor.start_turn(
        session_id="s_free", response_id="resp_2", input=[user("OTHER")], tools=[]
    )
    assert (await sink.wait_end("resp_2"))["status"] == "idle"
    assert sink.of("session.status", "resp_1")[-1]["status"] == "running"  # still parked
    await executor.approval_verdict(session_id="s_wait", verdict=verdict("accept"))
    assert (await sink.wait_end("resp_1"))["status"] == "idle"


async def test_a_lost_verdict_ends_the_wait_after_timeout_and_grace(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor(ask_grace_s=0.05)
    rule = {**ASK_WRITE, "ask_timeout": 0.05}
    await start(executor, agent_yaml(mock.base_url, os_env="."), rules(rule))
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert answer_text(sink) == '{"error": "not approved"}'
    assert not (workspace / "out.txt").exists()


async def test_waiting_for_a_person_does_not_count_against_the_turn_timeout(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure(tool_then_echo("sys_os_write", WRITE))
    executor, sink = make_executor()
    await start(executor, agent_yaml(mock.base_url, os_env=".", timeout=2), rules(ASK_WRITE))
    await asked(sink)
    await asyncio.sleep(2.5)  # longer than the turn's own timeout: the point of the test
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))
    end = await sink.wait_end("resp_1")
    assert end["status"] == "idle", end
    assert (workspace / "out.txt").exists()


# --- a turn re-run after a runner restart ---------------------------------------------------


def restarted_history(call_id: str = "call_r") -> list[dict[str, Any]]:
    """The server's copy of a turn cut by a runner restart while a call waited."""
    return [
        {**user("go", "item_user"), "response_id": "resp_1"},
        {
            "id": "item_fc",
            "type": "function_call",
            "status": "completed",
            "response_id": "resp_1",
            "call_id": call_id,
            "name": "sys_os_write",
            "arguments": json.dumps(WRITE),
        },
    ]


async def rerun(
    executor: AgentExecutor, yaml_text: str, policies: list[protocol.PolicyRule]
) -> None:
    await executor.open_session(session_id=SID, agent=agent(yaml_text), history=restarted_history())
    await executor.update_policies(session_id=SID, rules=policies)
    await executor.start_turn(
        session_id=SID,
        response_id="resp_1",
        input=[{**user("go", "item_user"), "response_id": "resp_1"}],
        tools=[],
    )


async def test_rerun_asks_the_waiting_call_again_under_its_call_id(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure([{"echo_tool_output": True}])
    executor, sink = make_executor()
    await rerun(executor, agent_yaml(mock.base_url, os_env="."), rules(ASK_WRITE))
    request = await asked(sink, "call_r")
    assert request["arguments"] == WRITE
    assert mock.requests == []  # the model is not asked for a new call
    await executor.approval_verdict(session_id=SID, verdict=verdict("accept", "call_r"))
    await sink.wait_end("resp_1")
    assert (workspace / "out.txt").read_text() == WRITE["content"]
    items = done_items(sink, "resp_1")
    assert [i["type"] for i in items] == ["function_call_output", "message"]  # call not re-sent
    assert json.loads(answer_text(sink))["created"] is True
    history = executor.session_history(SID)
    assert [i["type"] for i in history].count("function_call") == 1


async def test_rerun_with_the_stored_verdict_asks_nobody(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    mock.configure([{"echo_tool_output": True}])
    executor, sink = make_executor()
    await executor.approval_verdict(
        session_id=SID, verdict=verdict("decline", "call_r", resolved_by="dan")
    )
    await rerun(executor, agent_yaml(mock.base_url, os_env="."), rules(ASK_WRITE))
    await sink.wait_end("resp_1")
    assert sink.of("approval.requested") == []
    assert not (workspace / "out.txt").exists()
    assert answer_text(sink) == '{"error": "declined by dan: no reason"}'


async def test_rerun_leaves_an_unfinished_allowed_call_alone(
    mock: MockLLMServer, make_executor: Callable[..., Executor], workspace: Path
) -> None:
    """A call that was allowed may have been running when the runner died: it is not
    run a second time (the model is asked again, as without rules)."""
    mock.configure([{"text": "done"}])
    executor, sink = make_executor()
    await rerun(executor, agent_yaml(mock.base_url, os_env="."), [])
    await sink.wait_end("resp_1")
    assert not (workspace / "out.txt").exists()
    assert sink.of("approval.requested") == [] and len(mock.requests) == 1


# --- client-side tools --------------------------------------------------------------------


async def test_client_call_is_asked_before_the_client_sees_it(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    mock.configure(tool_then_echo("get_weather", {"city": "Paris"}))
    executor, sink = make_executor()
    ask = {"name": "ask-weather", "tools": ["get_weather"], "action": "ask"}
    await start(executor, agent_yaml(mock.base_url), rules(ask), tools=[WEATHER_TOOL])
    request = await asked(sink)
    assert request["arguments"] == {"city": "Paris"} and request["ask_timeout"] == 3600.0
    assert done_items(sink, "resp_1") == []  # nothing action_required yet

    await executor.approval_verdict(session_id=SID, verdict=verdict("accept"))
    await sink.wait_status("resp_1", "waiting")
    (parked,) = done_items(sink, "resp_1")
    assert parked["status"] == "action_required"
    assert json.loads(parked["arguments"]) == {"city": "Paris"}
    await executor.tool_result(session_id=SID, call_id="call_echo", output="sunny")
    await sink.wait_end("resp_1")
    assert answer_text(sink) == "sunny"


async def test_refused_client_call_never_reaches_the_client(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    mock.configure(tool_then_echo("get_weather", {"city": "Paris"}))
    executor, sink = make_executor()
    ask = {"name": "ask-weather", "tools": ["get_*"], "action": "ask"}
    await start(executor, agent_yaml(mock.base_url), rules(ask), tools=[WEATHER_TOOL])
    await asked(sink)
    await executor.approval_verdict(session_id=SID, verdict=verdict("decline", resolved_by="carol"))
    await sink.wait_end("resp_1")
    items = done_items(sink, "resp_1")
    assert all(i.get("status") != "action_required" for i in items)
    assert [(i["type"], i["status"]) for i in items][:2] == [
        ("function_call", "completed"),
        ("function_call_output", "completed"),
    ]
    assert answer_text(sink) == '{"error": "declined by carol: no reason"}'
    assert [e["status"] for e in sink.of("session.status", "resp_1")] == ["running", "idle"]


async def test_denied_client_call(
    mock: MockLLMServer, make_executor: Callable[..., Executor]
) -> None:
    mock.configure(tool_then_echo("get_weather", {"city": "Paris"}))
    executor, sink = make_executor()
    deny = {"name": "no-weather", "tools": ["get_weather"], "action": "deny", "reason": "x"}
    await start(executor, agent_yaml(mock.base_url), rules(deny), tools=[WEATHER_TOOL])
    await sink.wait_end("resp_1")
    assert answer_text(sink) == '{"error": "denied by policy no-weather: x"}'
    assert sink.of("policy.denied")[0]["tool"] == "get_weather"


async def test_policy_update_for_a_session_not_open_is_ignored(
    make_executor: Callable[..., Executor],
) -> None:
    executor, _ = make_executor()
    await executor.update_policies(session_id="nope", rules=rules(ASK_WRITE))
    assert executor.open_session_ids() == []


# --- through the tunnel: the frames of tunnel.md --------------------------------------------


async def test_frames_session_open_verdicts_policy_update_and_approval_verdict(
    mock: MockLLMServer, workspace: Path
) -> None:
    """The runner program's tunnel client with the real executor: ``session.open``
    brings rules and a stored verdict (applied without asking), ``approval.requested``
    goes out as an event, ``approval.verdict`` and ``policy.update`` are acked."""
    connections: asyncio.Queue[ServerConnection] = asyncio.Queue()

    async def handler(ws: ServerConnection) -> None:
        await connections.put(ws)
        await ws.wait_closed()

    async def until(
        ws: ServerConnection, wanted: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        while True:
            frame = await recv_frame(ws)
            if wanted(frame):
                return frame

    def event(kind: str) -> Callable[[dict[str, Any]], bool]:
        return lambda f: f["type"] == "event" and f["event"]["type"] == kind

    mock.configure(tool_then_echo("sys_os_write", WRITE, call_id="call_a"), match="FIRST")
    mock.configure(tool_then_echo("sys_os_write", WRITE, call_id="call_b"), match="SECOND")
    bundle = build_bundle({"agent.yaml": agent_yaml(mock.base_url, os_env=".")})
    agent_ref = {"id": "agent_1", "version": 1, "bundle_b64": base64.b64encode(bundle).decode()}
    executor = AgentExecutor(workspace=workspace, env={}, llm_max_retries=0)
    async with serve(handler, "127.0.0.1", 0) as srv:
        port = srv.sockets[0].getsockname()[1]
        config = RunnerConfig(
            server_url=f"http://127.0.0.1:{port}",
            token=TOKEN,
            runner_id=RUNNER_ID,
            workspace=workspace,
        )
        tunnel = RunnerTunnel(config, executor, workspace_info={}, backoff_initial=0.01)
        task = asyncio.create_task(tunnel.run())
        try:
            ws = await asyncio.wait_for(connections.get(), 5)
            await handshake(ws)
            stored = {
                "elicitation_id": "elicit_a",
                "response_id": "resp_1",
                "call_id": "call_a",
                "action": "accept",
                "resolved_by": "alice",
            }
            await send_frame(
                ws,
                {
                    "type": "session.open",
                    "id": "c1",
                    "session_id": SID,
                    "agent": agent_ref,
                    "history": [],
                    "policies": [{**ASK_WRITE, "ask_timeout": 60}],
                    "verdicts": [stored],
                },
            )
            assert await until(ws, lambda f: f["type"] == "ack") == {"type": "ack", "id": "c1"}
            turn = {"type": "turn.start", "session_id": SID, "input": [user("FIRST")]}
            await send_frame(ws, {**turn, "id": "c2", "response_id": "resp_1"})
            completed = await until(ws, event("response.completed"))
            assert completed["event"]["response_id"] == "resp_1"
            assert (workspace / "out.txt").exists()  # the stored verdict: not asked again
            (workspace / "out.txt").unlink()

            await send_frame(
                ws, {**turn, "id": "c3", "response_id": "resp_2", "input": [user("SECOND")]}
            )
            requested = await until(ws, event("approval.requested"))
            assert requested["session_id"] == SID
            assert requested["event"]["call_id"] == "call_b"
            assert requested["event"]["arguments"] == WRITE
            await send_frame(
                ws, {"type": "policy.update", "id": "c4", "session_id": SID, "rules": []}
            )
            assert await until(ws, lambda f: f["type"] == "ack") == {"type": "ack", "id": "c4"}
            await send_frame(
                ws,
                {
                    "type": "approval.verdict",
                    "id": "c5",
                    "session_id": SID,
                    "elicitation_id": "elicit_b",
                    "response_id": "resp_2",
                    "call_id": "call_b",
                    "action": "decline",
                    "reason": "not today",
                    "resolved_by": "bob",
                },
            )
            assert await until(ws, lambda f: f["type"] == "ack") == {"type": "ack", "id": "c5"}
            text = await until(
                ws,
                lambda f: (
                    event("response.output_item.done")(f)
                    and f["event"]["item"]["type"] == "message"
                ),
            )
            assert text["event"]["item"]["content"][0]["text"] == (
                '{"error": "declined by bob: not today"}'
            )
            assert not (workspace / "out.txt").exists()
        finally:
            await asyncio.wait_for(tunnel.stop(), 10)
            await asyncio.wait_for(task, 10)


def test_guardrails_read_the_budget_block_exactly_and_back() -> None:
    guardrails = parse_guardrails(
        {"budget_usd": 0.1, "on_budget": "deny", "ask_increment_usd": 2.5}
    )
    assert guardrails.budget_nano == 100_000_000
    assert guardrails.on_budget == "deny"
    assert guardrails.ask_increment_nano == 2_500_000_000
    assert parse_guardrails(guardrails.as_json()) == guardrails
    assert parse_guardrails({}).on_budget == "ask"


@pytest.mark.parametrize(
    ("block", "path"),
    [
        ({"budget_usd": -1}, "guardrails.budget_usd"),
        ({"budget_usd": True}, "guardrails.budget_usd"),
        ({"budget_usd": float("inf")}, "guardrails.budget_usd"),
        ({"budget_usd": 10_000_000}, "guardrails.budget_usd"),
        ({"on_budget": "warn"}, "guardrails.on_budget"),
        ({"ask_increment_usd": 0}, "guardrails.ask_increment_usd"),
    ],
)
def test_guardrails_refuse_a_bad_budget_by_its_path(block: dict[str, object], path: str) -> None:
    with pytest.raises(RuleError) as caught:
        parse_guardrails(block)
    assert list(caught.value.fields) == [path]
