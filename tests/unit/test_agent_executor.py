"""The agent loop (omnigent_runner.agent) against the in-process mock LLM.

Every test drives :class:`AgentExecutor` the way the tunnel does (open, start, results,
interrupts) and checks two sides: the events it reports through the sink, and what it
sent to the model (the mock's captured requests). No sleeps: tests await events.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from typing import Any

import pytest

from omnigent_runner import protocol
from omnigent_runner.agent import AgentExecutor
from omnigent_runner.executor import CommandRejected
from testing.mockllm import MockLLMServer
from tests.tools import WEATHER_TOOL
from tests.unit import agent_loop
from tests.unit.agent_loop import (
    SID,
    Event,
    RecordingSink,
    agent,
    agent_yaml,
    call,
    done_items,
    user,
)

pytestmark = pytest.mark.timeout(60)

mock = agent_loop.mock
workspace = agent_loop.workspace
make_executor = agent_loop.make_executor


# --- helpers ------------------------------------------------------------------------------


def request_signal(mock: MockLLMServer) -> asyncio.Event:
    """An event set when the mock receives a request (it serves from its own threads)."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    store = mock._store  # no public hook: wrap the request log
    original = store.record

    def record(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        loop.call_soon_threadsafe(event.set)

    store.record = record  # type: ignore[method-assign]
    return event


def free_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def open_and_run(
    executor: AgentExecutor,
    sink: RecordingSink,
    yaml_text: str,
    text: str = "hello",
    *,
    response_id: str = "resp_1",
    tools: list[Event] | None = None,
) -> Event:
    await executor.open_session(session_id=SID, agent=agent(yaml_text), history=[])
    await executor.start_turn(
        session_id=SID, response_id=response_id, input=[user(text)], tools=tools or []
    )
    return await sink.wait_end(response_id)


# --- text turns -----------------------------------------------------------------------------


async def test_text_turn_events_in_order_and_history_grows(mock, make_executor) -> None:
    mock.configure([{"text": "Hello there"}])
    executor, sink = make_executor()
    end = await open_and_run(executor, sink, agent_yaml(mock.base_url), "hi")

    assert end["status"] == "idle"
    assert sink.types("resp_1") == [
        "session.status",
        "response.created",
        "response.output_text.delta",
        "response.output_item.done",
        "usage.recorded",
        "response.completed",
        "session.status",
    ]
    assert sink.of("session.status")[0]["status"] == "running"
    assert {sid for sid, _ in sink.events} == {SID}
    delta = sink.of("response.output_text.delta")[0]
    (item,) = done_items(sink, "resp_1")
    assert delta["delta"] == "Hello there" and delta["item_id"] == item["id"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": "Hello there"}]

    history = executor.session_history(SID)
    assert [(i["type"], i["role"]) for i in history] == [
        ("message", "user"),
        ("message", "assistant"),
    ]
    (request,) = mock.requests
    assert request["path"] == "/v1/responses"
    body = request["body"]
    assert body["stream"] is True and body["model"] == "mock-model"
    assert body["instructions"] == "You are a test agent."
    assert body["input"] == [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    assert "tools" not in body  # no os_env, no client tools


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_each_model_call_reports_its_usage(mock, make_executor, api: str) -> None:
    """usage.md: one ``usage.recorded`` per LLM call, cached tokens apart from the rest."""
    call = {"call_id": "call_1", "name": "lookup", "arguments": "{}"}
    mock.configure(
        [
            {"tool_calls": [call], "usage": {"input_tokens": 500, "output_tokens": 20}},
            {
                "text": "Done.",
                "usage": {
                    "input_tokens": 900,
                    "output_tokens": 40,
                    "cached_tokens": 600,
                    "reasoning_tokens": 10,
                },
            },
        ]
    )
    executor, sink = make_executor()
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    await executor.open_session(
        session_id=SID, agent=agent(agent_yaml(mock.base_url, api=api)), history=[]
    )
    await executor.start_turn(
        session_id=SID, response_id="resp_1", input=[user("go")], tools=[tool]
    )
    await sink.wait_status("resp_1", "waiting")
    await executor.tool_result(session_id=SID, call_id="call_1", output="{}")
    await sink.wait_end("resp_1")
    first, second = sink.of("usage.recorded")
    assert first == {
        "type": "usage.recorded",
        "response_id": "resp_1",
        "model": "mock-model",
        "input_tokens": 500,
        "output_tokens": 20,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "reasoning_tokens": 0,
        "reported": True,
    }
    assert (second["input_tokens"], second["cache_read_input_tokens"]) == (300, 600)
    assert (second["output_tokens"], second["reasoning_tokens"]) == (40, 10)


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_a_call_without_usage_is_reported_as_unreported(mock, make_executor, api) -> None:
    mock.configure([{"text": "Hi."}])
    mock.set_quirks(no_usage=True)
    executor, sink = make_executor()
    await open_and_run(executor, sink, agent_yaml(mock.base_url, api=api), "hi")
    (usage,) = sink.of("usage.recorded")
    assert usage["reported"] is False
    assert (usage["input_tokens"], usage["output_tokens"]) == (0, 0)


async def test_a_failed_call_reports_nothing(mock, make_executor) -> None:
    mock.configure([{"error": {"status_code": 400, "message": "bad"}}])
    executor, sink = make_executor()
    end = await open_and_run(executor, sink, agent_yaml(mock.base_url), "hi")
    assert end["status"] == "failed"
    assert sink.of("usage.recorded") == []


async def test_streamed_deltas_concatenate_to_the_text(mock, make_executor) -> None:
    text = "The quick brown fox jumps over the lazy dog"
    mock.configure([{"text": text, "stream": True}])
    executor, sink = make_executor()
    await open_and_run(executor, sink, agent_yaml(mock.base_url))

    deltas = sink.of("response.output_text.delta", "resp_1")
    assert len(deltas) > 1
    assert "".join(d["delta"] for d in deltas) == text
    (item,) = done_items(sink, "resp_1")
    assert {d["item_id"] for d in deltas} == {item["id"]}
    assert item["content"][0]["text"] == text


async def test_second_turn_sends_first_turns_history(mock, make_executor) -> None:
    mock.configure([{"text": "first answer"}, {"text": "second answer"}])
    executor, sink = make_executor()
    await open_and_run(executor, sink, agent_yaml(mock.base_url), "first question")
    await executor.start_turn(
        session_id=SID, response_id="resp_2", input=[user("second question")], tools=[]
    )
    assert (await sink.wait_end("resp_2"))["status"] == "idle"

    assert mock.requests[1]["body"]["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "first question"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "first answer"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "second question"}]},
    ]


# --- tools ----------------------------------------------------------------------------------


async def test_builtin_write_tool_changes_workspace(mock, make_executor, workspace) -> None:
    args = {"path": "notes/hello.txt", "content": "hi\n"}
    mock.configure([{"tool_calls": [call("sys_os_write", args, "call_w")]}, {"text": "Wrote it."}])
    executor, sink = make_executor()
    end = await open_and_run(executor, sink, agent_yaml(mock.base_url, os_env="."))

    assert end["status"] == "idle"
    assert (workspace / "notes" / "hello.txt").read_text() == "hi\n"
    call_item, output_item, message = done_items(sink, "resp_1")
    assert call_item["type"] == "function_call" and call_item["status"] == "completed"
    assert (call_item["call_id"], call_item["name"]) == ("call_w", "sys_os_write")
    assert json.loads(call_item["arguments"]) == args
    assert output_item["type"] == "function_call_output" and output_item["call_id"] == "call_w"
    assert json.loads(output_item["output"])["created"] is True
    assert message["content"][0]["text"] == "Wrote it."

    types = [e["type"] for _, e in sink.events]  # workspace.changes has no response_id
    assert types[-9:] == [
        "usage.recorded",  # the first model call
        "response.output_item.done",  # the call
        "response.output_item.done",  # its output
        "workspace.changes",
        "response.output_text.delta",
        "response.output_item.done",  # the message
        "usage.recorded",  # the second model call
        "response.completed",
        "session.status",
    ]
    (changes,) = sink.of("workspace.changes")
    assert changes["environment_id"] == "default" and changes["mode"] == "agent_edit"
    assert [(e["path"], e["status"]) for e in changes["entries"]] == [
        ("notes/hello.txt", "created")
    ]

    first, second = (r["body"] for r in mock.requests)
    names = [tool["name"] for tool in first["tools"]]
    assert names == ["sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell"]
    assert all(tool["type"] == "function" and "parameters" in tool for tool in first["tools"])
    outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["call_w"]
    assert json.loads(outputs[0]["output"])["path"] == "notes/hello.txt"


async def test_a_call_id_reused_in_a_later_answer_is_another_item(
    mock, make_executor, workspace
) -> None:
    """Some servers number calls per answer: the second answer's call_0 is a new call,
    stored as its own item beside the first, never in its place."""
    mock.configure(
        [
            {"tool_calls": [call("sys_os_write", {"path": "a.txt", "content": "A"}, "call_0")]},
            {"tool_calls": [call("sys_os_write", {"path": "b.txt", "content": "B"}, "call_0")]},
            {"text": "Both written"},
        ]
    )
    executor, sink = make_executor()
    end = await open_and_run(executor, sink, agent_yaml(mock.base_url, os_env="."), "write")

    assert end["status"] == "idle"
    calls = [i for i in done_items(sink, "resp_1") if i["type"] == "function_call"]
    assert [json.loads(c["arguments"])["path"] for c in calls] == ["a.txt", "b.txt"]
    assert calls[0]["id"] != calls[1]["id"]
    history_calls = [i for i in executor.session_history(SID) if i["type"] == "function_call"]
    assert len({i["id"] for i in history_calls}) == 2
    assert (workspace / "a.txt").read_text() == "A" and (workspace / "b.txt").read_text() == "B"


async def test_chat_completions_text_and_tool_call(mock, make_executor, workspace) -> None:
    args = {"path": "a.txt", "content": "A"}
    mock.configure(
        [
            {"tool_calls": [call("sys_os_write", args, "call_c")]},
            {"text": "All done", "stream": True},
        ]
    )
    executor, sink = make_executor()
    yaml_text = agent_yaml(mock.base_url, api="chat_completions", os_env=".")
    end = await open_and_run(executor, sink, yaml_text, "write a")

    assert end["status"] == "idle"
    assert (workspace / "a.txt").read_text() == "A"
    items = done_items(sink, "resp_1")
    assert [i["type"] for i in items] == ["function_call", "function_call_output", "message"]
    assert items[2]["content"][0]["text"] == "All done"
    deltas = sink.of("response.output_text.delta", "resp_1")
    assert "".join(d["delta"] for d in deltas) == "All done"

    assert [r["path"] for r in mock.requests] == ["/v1/chat/completions"] * 2
    first, second = (r["body"] for r in mock.requests)
    assert first["messages"] == [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "write a"},
    ]
    assert first["tools"][1]["function"]["name"] == "sys_os_write"
    assistant, tool = second["messages"][2:]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"][0]["id"] == "call_c"
    assert assistant["tool_calls"][0]["function"]["name"] == "sys_os_write"
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_c"
    assert json.loads(tool["content"])["created"] is True


async def test_client_tool_round_trip(mock, make_executor) -> None:
    mock.configure(
        [{"tool_calls": [call("get_weather", {"city": "Paris"}, "call_c")]}, {"text": "Sunny."}]
    )
    executor, sink = make_executor()
    await executor.open_session(session_id=SID, agent=agent(agent_yaml(mock.base_url)), history=[])
    await executor.start_turn(
        session_id=SID, response_id="resp_1", input=[user("weather?")], tools=[WEATHER_TOOL]
    )
    await sink.wait_status("resp_1", "waiting")
    (parked,) = done_items(sink, "resp_1")
    assert parked["status"] == "action_required"
    assert (parked["call_id"], parked["name"]) == ("call_c", "get_weather")
    assert json.loads(parked["arguments"]) == {"city": "Paris"}
    assert len(mock.requests) == 1
    assert mock.requests[0]["body"]["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]

    await executor.tool_result(session_id=SID, call_id="call_other", output="ignored")
    await executor.tool_result(session_id=SID, call_id="call_c", output='{"temp": 21}')
    assert (await sink.wait_end("resp_1"))["status"] == "idle"

    items = done_items(sink, "resp_1")
    assert [(i["type"], i["status"]) for i in items] == [
        ("function_call", "action_required"),
        ("function_call", "completed"),
        ("function_call_output", "completed"),
        ("message", "completed"),
    ]
    assert items[1]["id"] == parked["id"]
    assert items[2]["output"] == '{"temp": 21}'
    statuses = [e["status"] for e in sink.of("session.status", "resp_1")]
    assert statuses == ["running", "waiting", "running", "idle"]
    second = mock.requests[1]["body"]["input"]
    assert {"type": "function_call_output", "call_id": "call_c", "output": '{"temp": 21}'} in second


async def test_builtin_tool_wins_a_name_clash(mock, make_executor) -> None:
    mock.configure([{"text": "ok"}])
    executor, sink = make_executor()
    clashing = {
        "type": "function",
        "function": {"name": "sys_os_read", "description": "client version", "parameters": {}},
    }
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    await open_and_run(
        executor, sink, agent_yaml(mock.base_url, os_env="."), tools=[clashing, lookup]
    )

    tools = mock.requests[0]["body"]["tools"]
    names = [t["name"] for t in tools]
    assert names == ["sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell", "lookup"]
    assert tools[0]["description"] != "client version"


# --- re-sent turns --------------------------------------------------------------------------


async def test_resent_start_turn_is_ignored(mock, make_executor) -> None:
    mock.configure([{"text": "once"}, {"text": "twice"}])
    executor, sink = make_executor()
    await executor.open_session(session_id=SID, agent=agent(agent_yaml(mock.base_url)), history=[])
    message = user("hi")
    for _ in range(2):  # re-sent while queued/running
        await executor.start_turn(session_id=SID, response_id="resp_1", input=[message], tools=[])
    await sink.wait_end("resp_1")
    await executor.start_turn(session_id=SID, response_id="resp_1", input=[message], tools=[])
    await executor.rpc(method="ping", params={})  # one more loop pass for any stray work

    assert len(sink.of("response.created", "resp_1")) == 1
    assert len(sink.of("response.completed", "resp_1")) == 1
    assert len(mock.requests) == 1


async def test_resent_turn_after_restart_does_not_repeat_the_user_message(
    mock, make_executor
) -> None:
    mock.configure([{"text": "answer"}])
    executor, sink = make_executor()
    message = user("only once", "item_user_1")
    dangling = {  # the old runner died while this built-in call ran: no output stored
        "id": "item_call_1",
        "type": "function_call",
        "status": "completed",
        "call_id": "call_lost",
        "name": "sys_os_shell",
        "arguments": "{}",
    }
    await executor.open_session(
        session_id=SID, agent=agent(agent_yaml(mock.base_url)), history=[message, dangling]
    )
    await executor.start_turn(session_id=SID, response_id="resp_1", input=[message], tools=[])
    assert (await sink.wait_end("resp_1"))["status"] == "idle"

    assert mock.requests[0]["body"]["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "only once"}]}
    ]
    ids = [item["id"] for item in executor.session_history(SID)]
    assert ids.count("item_user_1") == 1


# --- failures -------------------------------------------------------------------------------


async def test_http_500_after_retries_is_llm_error(mock, make_executor) -> None:
    mock.configure([{"error": {"status_code": 500, "message": "boom"}}] * 2)
    executor, sink = make_executor(llm_max_retries=1)
    end = await open_and_run(executor, sink, agent_yaml(mock.base_url))

    assert end["status"] == "failed"
    assert end["error"]["code"] == "llm_error"
    assert "500" in end["error"]["message"] and "boom" in end["error"]["message"]
    (failed,) = sink.of("response.failed", "resp_1")
    assert failed["error"] == end["error"]
    assert sink.types("resp_1")[-2:] == ["response.failed", "session.status"]
    assert len(mock.requests) == 2  # the first try and one SDK retry


async def test_unreachable_llm_is_connection_error(make_executor) -> None:
    executor, sink = make_executor()
    end = await open_and_run(executor, sink, agent_yaml(f"http://127.0.0.1:{free_port()}/v1"))

    assert end["status"] == "failed"
    assert end["error"]["code"] == "connection_error"


async def test_max_iterations_exceeded(mock, make_executor) -> None:
    mock.configure([{"tool_calls": [call("noop", {}, f"call_{n}")]} for n in range(5)])
    executor, sink = make_executor()
    end = await open_and_run(executor, sink, agent_yaml(mock.base_url, max_iterations=2))

    assert end["error"]["code"] == "max_iterations_exceeded"
    assert len(mock.requests) == 2
    # The unknown tool did not fail the turn: the model got an error output instead.
    outputs = [i for i in done_items(sink, "resp_1") if i["type"] == "function_call_output"]
    assert "unknown tool 'noop'" in json.loads(outputs[0]["output"])["error"]


async def test_turn_timeout(mock, make_executor) -> None:
    mock.configure([{"text": "too late", "delay_s": 5}])
    executor, sink = make_executor()
    end = await open_and_run(executor, sink, agent_yaml(mock.base_url, timeout=0.5))

    assert end["status"] == "failed"
    assert end["error"]["code"] == "timeout"
    assert sink.of("response.failed", "resp_1")


async def test_bad_bundle_fails_each_turn_with_agent_load_failed(make_executor) -> None:
    executor, sink = make_executor()
    bad = protocol.AgentRef(
        id="agent_bad", version=1, bundle_b64=base64.b64encode(b"junk").decode()
    )
    await executor.open_session(session_id=SID, agent=bad, history=[])
    assert executor.open_session_ids() == [SID]
    for response_id in ("resp_1", "resp_2"):
        await executor.start_turn(
            session_id=SID, response_id=response_id, input=[user("hi")], tools=[]
        )
        end = await sink.wait_end(response_id)
        assert end["status"] == "failed" and end["error"]["code"] == "agent_load_failed"
        assert "tar" in end["error"]["message"]
        assert sink.types(response_id)[:2] == ["session.status", "response.created"]

    await executor.open_session(
        session_id="sess_2",
        agent=protocol.AgentRef(id="a", version=1, bundle_b64="%%%"),
        history=[],
    )
    await executor.start_turn(session_id="sess_2", response_id="resp_3", input=[], tools=[])
    assert (await sink.wait_end("resp_3"))["error"]["code"] == "agent_load_failed"


# --- interrupt, isolation, credentials, commands -------------------------------------------


async def test_interrupt_while_parked_then_queued_and_next_turns_run(mock, make_executor) -> None:
    mock.configure(
        [
            {"tool_calls": [call("get_weather", {"city": "Oslo"}, "call_p")]},
            {"text": "queued turn ran"},
            {"text": "next turn ran"},
        ]
    )
    executor, sink = make_executor()
    await executor.open_session(session_id=SID, agent=agent(agent_yaml(mock.base_url)), history=[])
    await executor.start_turn(
        session_id=SID, response_id="resp_1", input=[user("one")], tools=[WEATHER_TOOL]
    )
    await sink.wait_status("resp_1", "waiting")
    await executor.start_turn(session_id=SID, response_id="resp_2", input=[user("two")], tools=[])
    await executor.interrupt(session_id=SID)

    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert sink.types("resp_1")[-2:] == ["response.cancelled", "session.status"]
    assert (await sink.wait_end("resp_2"))["status"] == "idle"
    await executor.tool_result(session_id=SID, call_id="call_p", output="too late")  # ignored

    await executor.start_turn(session_id=SID, response_id="resp_3", input=[user("three")], tools=[])
    assert (await sink.wait_end("resp_3"))["status"] == "idle"
    assert done_items(sink, "resp_3")[0]["content"][0]["text"] == "next turn ran"
    # The parked call never completed, so it is not part of the transcript.
    roles = [i.get("role") or i["type"] for i in mock.requests[2]["body"]["input"]]
    assert roles == ["user", "user", "assistant", "user"]
    await executor.interrupt(session_id=SID)  # nothing running: no-op
    assert not sink.of("response.cancelled", "resp_3")


async def test_interrupt_during_llm_request_and_during_a_shell_tool(mock, make_executor) -> None:
    mock.configure([{"text": "slow", "delay_s": 5}], match="SLOW")
    mock.configure(
        [
            {"tool_calls": [call("sys_os_shell", {"command": "sleep 30"}, "call_s")]},
            {"text": "after"},
        ]
    )
    arrived = request_signal(mock)
    executor, sink = make_executor()
    await executor.open_session(
        session_id=SID, agent=agent(agent_yaml(mock.base_url, os_env=".")), history=[]
    )
    await executor.start_turn(
        session_id=SID, response_id="resp_1", input=[user("SLOW a")], tools=[]
    )
    await asyncio.wait_for(arrived.wait(), 20)  # the LLM request is in flight
    await executor.interrupt(session_id=SID)
    assert (await sink.wait_end("resp_1"))["status"] == "idle"
    assert sink.of("response.cancelled", "resp_1")

    await executor.start_turn(session_id=SID, response_id="resp_2", input=[user("b")], tools=[])
    await sink.wait_for(
        lambda e: e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"
    )
    await executor.interrupt(session_id=SID)
    assert (await sink.wait_end("resp_2"))["status"] == "idle"
    # The stored call gets an error output, so the transcript has no dangling call.
    call_item, output_item = done_items(sink, "resp_2")
    assert output_item["call_id"] == "call_s" and "cancelled" in output_item["output"]

    await executor.start_turn(session_id=SID, response_id="resp_3", input=[user("c")], tools=[])
    assert (await sink.wait_end("resp_3"))["status"] == "idle"
    kinds = [i.get("type", "message") for i in mock.requests[-1]["body"]["input"]]
    assert kinds == ["message", "message", "function_call", "function_call_output", "message"]


async def test_parked_call_without_result_times_out(mock, make_executor) -> None:
    mock.configure([{"tool_calls": [call("get_weather", {}, "call_t")]}])
    executor, sink = make_executor()
    # The turn's clock also covers the model's answer: 2 s leaves it room on a loaded machine.
    end = await open_and_run(
        executor, sink, agent_yaml(mock.base_url, timeout=2), tools=[WEATHER_TOOL]
    )

    assert end["error"]["code"] == "timeout"
    statuses = [e["status"] for e in sink.of("session.status", "resp_1")]
    assert statuses == ["running", "waiting", "failed"]
    assert executor.session_history(SID)[-1]["type"] == "message"  # the call was dropped


async def test_isolate_sessions_writes_under_the_session_folder(
    mock, make_executor, workspace
) -> None:
    mock.configure([{"tool_calls": [call("sys_os_write", {"path": "a.txt", "content": "x"})]}])
    executor, sink = make_executor(isolate_sessions=True)
    await open_and_run(executor, sink, agent_yaml(mock.base_url, os_env="sub"))

    assert (workspace / SID / "sub" / "a.txt").read_text() == "x"
    assert not (workspace / "a.txt").exists()


async def test_credentials_and_model_from_env(mock, make_executor) -> None:
    mock.configure([{"text": "via env"}], key="env-model")
    env = {
        "OPENAI_BASE_URL": mock.base_url,
        "OPENAI_API_KEY": "sk-env",
        "OMNIGENT_DEFAULT_MODEL": "env-model",
    }
    executor, sink = make_executor(env=env)
    end = await open_and_run(executor, sink, agent_yaml(None, model=None))

    assert end["status"] == "idle"
    assert mock.requests[0]["body"]["model"] == "env-model"
    assert done_items(sink, "resp_1")[0]["content"][0]["text"] == "via env"


async def test_commands_outside_turns(mock, make_executor) -> None:
    mock.configure([{"tool_calls": [call("get_weather", {}, "call_x")]}])
    executor, sink = make_executor()
    assert await executor.rpc(method="ping", params={}) == {"pong": True}
    with pytest.raises(CommandRejected) as rejected:
        await executor.rpc(method="nope", params={})
    assert rejected.value.code == "unknown_method"
    with pytest.raises(CommandRejected) as rejected:
        await executor.start_turn(session_id="missing", response_id="r", input=[], tools=[])
    assert rejected.value.code == "session_not_open"
    await executor.tool_result(session_id="missing", call_id="c", output="x")
    await executor.interrupt(session_id="missing")

    await executor.open_session(session_id=SID, agent=agent(agent_yaml(mock.base_url)), history=[])
    await executor.start_turn(
        session_id=SID, response_id="resp_1", input=[user("hi")], tools=[WEATHER_TOOL]
    )
    await sink.wait_status("resp_1", "waiting")
    count = len(sink.events)
    await executor.close_session(session_id=SID)
    assert executor.open_session_ids() == []
    assert len(sink.events) == count  # closing reports nothing
