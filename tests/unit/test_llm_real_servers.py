"""The runner pieces of issue 44 (real OpenAI-compatible servers), each on its own:
the Chat history builder, ``executor.tool_choice`` in bundles and on the wire, the
error messages of ``call_model``, the partial answer kept ``incomplete``, and the mock
LLM's quirks, in process and over HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from omnigent_runner import protocol
from omnigent_runner.bundles import BundleError, build_bundle, parse_bundle
from omnigent_runner.llm import (
    CONNECTION_BROKE,
    STREAM_ENDED_EARLY,
    ClientPool,
    LLMError,
    ModelRequest,
    call_model,
    tool_choice_body,
)
from omnigent_runner.transcript import to_chat_messages
from omnigent_runner.turn import SessionState, TurnRequest, TurnRunner
from testing.mockllm import NO_TOOLS_TEXT, QUIRKS, MockLLMServer

pytestmark = pytest.mark.timeout(60)

USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
}
CALL = {"call_id": "c1", "name": "lookup", "arguments": "{}"}


@pytest.fixture
def mock() -> Iterator[MockLLMServer]:
    with MockLLMServer() as server:
        yield server


@pytest.fixture
async def pool() -> AsyncIterator[ClientPool]:
    made = ClientPool(max_retries=0)
    yield made
    await made.aclose()


async def ask(
    pool: ClientPool, mock: MockLLMServer, api: str, *, tool_choice: str | None = None
) -> tuple[str, str, list[str]]:
    """(code or "answer", message or text, deltas) of one call against the mock."""
    client = pool.get(api_key="k", base_url=mock.base_url)
    request = ModelRequest(
        api=api, model="m", instructions="", history=[USER], tools=[TOOL], tool_choice=tool_choice
    )
    deltas: list[str] = []
    try:
        answer = await call_model(client, request, deltas.append)
    except LLMError as exc:
        return exc.code, exc.message, deltas
    return "answer", answer.text, deltas


# --- item 1: the Chat history ----------------------------------------------------------------


def test_an_assistant_message_of_calls_only_has_empty_string_content() -> None:
    history = [
        USER,
        {"type": "function_call", **CALL},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    messages = to_chat_messages("", history)
    assert messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        ],
    }


# --- item 2: streams without their end ------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_an_empty_stream_is_an_error_with_the_servers_reason(
    api: str, mock: MockLLMServer, pool: ClientPool
) -> None:
    mock.set_quirks(empty_stream=True)
    mock.configure([{"error": {"status_code": 400, "message": "prompt too long"}}])
    code, message, _ = await ask(pool, mock, api)
    assert code == "llm_error"
    if api == "chat_completions":
        assert (
            message
            == f"{STREAM_ENDED_EARLY}; without streaming, LLM returned HTTP 400: prompt too long"
        )
    else:
        assert message == STREAM_ENDED_EARLY


async def test_an_empty_stream_whose_probe_succeeds_still_fails(
    mock: MockLLMServer, pool: ClientPool
) -> None:
    mock.set_quirks(empty_stream=True)
    assert await ask(pool, mock, "chat_completions") == ("llm_error", STREAM_ENDED_EARLY, [])


# --- item 3: tool_choice ------------------------------------------------------------------


def spec_tool_choice(value: str, *, os_env: bool = True) -> str | None:
    text = f"name: a\nprompt: p\nexecutor:\n  tool_choice: {value}\n"
    if os_env:
        text += "os_env: {type: caller_process}\n"
    return parse_bundle(build_bundle({"a.yaml": text})).spec.tool_choice


@pytest.mark.parametrize("value", ["auto", "required", "none", "sys_os_write", "my-tool_2"])
def test_tool_choice_values_are_accepted(value: str) -> None:
    assert spec_tool_choice(value) == value


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("sys_os_delete", "not a built-in tool"),
        ("'two words'", "must be 'auto', 'required', 'none' or the name of a tool"),
        ("[auto]", "must be 'auto'"),
        ("3", "must be 'auto'"),
    ],
)
def test_bad_tool_choice_values_are_refused(value: str, words: str) -> None:
    with pytest.raises(BundleError, match=words.replace("(", r"\(")):
        spec_tool_choice(value)


def test_a_builtin_tool_choice_needs_os_env() -> None:
    with pytest.raises(BundleError, match="no os_env"):
        spec_tool_choice("sys_os_shell", os_env=False)


def test_tool_choice_is_not_sent_unless_set() -> None:
    assert parse_bundle(build_bundle({"a.yaml": "name: a\nprompt: p\n"})).spec.tool_choice is None


@pytest.mark.parametrize(
    ("api", "named"),
    [
        ("chat_completions", {"type": "function", "function": {"name": "lookup"}}),
        ("responses", {"type": "function", "name": "lookup"}),
    ],
)
async def test_tool_choice_on_the_wire(
    api: str, named: dict[str, Any], mock: MockLLMServer, pool: ClientPool
) -> None:
    assert tool_choice_body(api, "lookup") == named
    for choice, sent in ((None, None), ("required", "required"), ("lookup", named)):
        mock.reset()
        await ask(pool, mock, api, tool_choice=choice)
        assert mock.requests[0]["body"].get("tool_choice") == sent
        assert ("tool_choice" in mock.requests[0]["body"]) is (choice is not None)


def run_turn(
    mock: MockLLMServer, yaml_extra: str, tools: list[Any], *, root: Path | None = None
) -> list[Any]:
    """One TurnRunner turn against the mock; the events it emitted."""
    text = f"name: a\nprompt: p\nexecutor:\n  model: m\n{yaml_extra}"
    spec = parse_bundle(build_bundle({"a.yaml": text})).spec
    session = SessionState(
        session_id="s", spec=spec, load_error=None, history=[], root=root, tracker=None
    )
    events: list[Any] = []

    async def go() -> None:
        pool = ClientPool(max_retries=0)
        runner = TurnRunner(
            session,
            TurnRequest("resp_1", [USER], tools),
            emit=events.append,
            pool=pool,
            env={"OPENAI_BASE_URL": mock.base_url},
            delta_interval_s=0,
        )
        try:
            await runner.run()
        finally:
            await pool.aclose()

    asyncio.run(go())
    return events


@pytest.mark.parametrize("choice", ["required", "sys_os_write"])
def test_a_forced_tool_choice_is_sent_once_per_turn(
    choice: str, mock: MockLLMServer, tmp_path: Path
) -> None:
    """After the first call the follow-up has no tool_choice: forced again, the model
    would call the tool after every output and never answer."""
    write = {"call_id": "w", "name": "sys_os_write", "arguments": '{"path": "a", "content": ""}'}
    mock.configure([{"tool_calls": [write]}, {"text": "done"}])
    extra = f"  api: chat_completions\n  tool_choice: {choice}\nos_env: {{type: caller_process}}\n"
    events = run_turn(mock, extra, [], root=tmp_path)
    assert any(isinstance(e, protocol.ResponseCompleted) for e in events)
    sent = [r["body"].get("tool_choice") for r in mock.requests]
    assert sent == [tool_choice_body("chat_completions", choice), None]
    assert (tmp_path / "a").exists()


def test_without_tools_no_tool_choice_is_sent(mock: MockLLMServer) -> None:
    run_turn(mock, "  api: chat_completions\n  tool_choice: required\n", [])
    assert "tool_choice" not in mock.requests[0]["body"]


def test_an_unoffered_tool_name_fails_the_turn_before_the_model_is_asked(
    mock: MockLLMServer,
) -> None:
    events = run_turn(mock, "  tool_choice: get_weather\n", [TOOL])
    [failed] = [e for e in events if isinstance(e, protocol.ResponseFailed)]
    assert failed.error.code == "agent_load_failed"
    assert "'get_weather'" in failed.error.message and "lookup" in failed.error.message
    assert mock.requests == []


# --- item 4: no Responses API ---------------------------------------------------------------


async def test_a_404_names_the_url_and_the_fix(mock: MockLLMServer, pool: ClientPool) -> None:
    mock.set_quirks(no_responses=True)
    code, message, _ = await ask(pool, mock, "responses")
    assert code == "llm_error"
    assert message == (
        f"LLM returned HTTP 404 for {mock.base_url}/responses: Not Found; if the server has "
        "no Responses API, `executor.api: chat_completions` is the likely fix"
    )
    assert (await ask(pool, mock, "chat_completions"))[0] == "answer"


# --- item 5: a connection cut mid-answer ------------------------------------------------------


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_a_cut_mid_answer_is_a_broken_connection_not_an_unreachable_one(
    api: str, transport: str, mock: MockLLMServer
) -> None:
    mock.set_quirks(cut_mid_stream=True)
    mock.configure([{"text": "one two three four", "stream": True}])
    pool = ClientPool(max_retries=0, http_client=transport)
    try:
        code, message, deltas = await ask(pool, mock, api)
    finally:
        await pool.aclose()
    assert (code, message, deltas) == ("connection_error", CONNECTION_BROKE, ["one ", "two "])


def test_the_streamed_part_is_kept_as_an_incomplete_item(mock: MockLLMServer) -> None:
    mock.set_quirks(cut_mid_stream=True)
    mock.configure([{"text": "one two three four", "stream": True}])
    events = run_turn(mock, "  api: chat_completions\n", [])
    deltas = "".join(e.delta for e in events if isinstance(e, protocol.OutputTextDelta))
    [done] = [e.item for e in events if isinstance(e, protocol.OutputItemDone)]
    assert done["status"] == "incomplete" and done["role"] == "assistant"
    assert done["content"] == [{"type": "output_text", "text": deltas}] and deltas == "one two "
    [failed] = [e for e in events if isinstance(e, protocol.ResponseFailed)]
    assert failed.error.code == "connection_error"
    # The item goes out before the turn's end, so watchers store it with the turn.
    assert events.index(next(e for e in events if isinstance(e, protocol.OutputItemDone))) < (
        events.index(failed)
    )


def test_a_failure_before_any_text_stores_no_item(mock: MockLLMServer) -> None:
    mock.set_quirks(empty_stream=True)
    events = run_turn(mock, "  api: chat_completions\n", [])
    assert not [e for e in events if isinstance(e, protocol.OutputItemDone)]


# --- the mock's quirks -----------------------------------------------------------------------


def test_quirks_over_http(mock: MockLLMServer) -> None:
    with httpx.Client(base_url=f"http://{mock.host}:{mock.port}") as http:
        assert http.get("/mock/quirks").json() == {"quirks": []}
        on = http.post("/mock/quirks", json={"no_responses": True, "empty_stream": True})
        assert on.json() == {"quirks": ["empty_stream", "no_responses"]}
        assert http.post("/v1/responses", json={"model": "m", "input": "x"}).status_code == 404
        off = http.post("/mock/quirks", json={"no_responses": False})
        assert off.json() == {"quirks": ["empty_stream"]}
        bad = http.post("/mock/quirks", json={"always_happy": True})
        assert bad.status_code == 400 and "unknown quirk" in bad.text
        assert http.post("/mock/quirks", json={"empty_stream": "yes"}).status_code == 400
        http.post("/mock/reset")
        assert http.get("/mock/quirks").json() == {"quirks": []}
    assert "cut_mid_stream" in QUIRKS


def test_reject_null_content_and_tool_choice_required(mock: MockLLMServer) -> None:
    mock.set_quirks(reject_null_content=True, tool_choice_required=True)
    url = f"{mock.base_url}/chat/completions"
    null: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
    with httpx.Client() as http:
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}, null]}
        rejected = http.post(url, json=body)
        assert rejected.status_code == 500 and "Input should be a valid string" in rejected.text
        body["messages"][1] = {**null, "content": ""}
        mock.configure([{"tool_calls": [CALL]}, {"tool_calls": [CALL]}])
        plain = http.post(url, json=body).json()["choices"][0]["message"]
        assert plain["content"] == NO_TOOLS_TEXT and "tool_calls" not in plain
        forced = http.post(url, json={**body, "tool_choice": "required"}).json()
        assert json.dumps(forced).count("lookup") == 1
