"""Tests for the scripted mock LLM server, driven through the real openai SDK.

The mock only earns its keep if the SDK the agent loop uses parses it, so every API test
goes through ``openai.OpenAI`` / ``openai.AsyncOpenAI`` rather than hand-rolled HTTP.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testing.mockllm import DEFAULT_TEXT, MockLLMServer, split_words, tool_then_echo

pytestmark = pytest.mark.timeout(30)

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "gpt-test"
CALL = {"call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}


@pytest.fixture
def server() -> Iterator[MockLLMServer]:
    srv = MockLLMServer()
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: MockLLMServer) -> Iterator[openai.OpenAI]:
    sdk = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    yield sdk
    sdk.close()


# --------------------------------------------------------------------------- Responses API


def test_responses_non_stream_text(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"text": "Hello there"}])
    resp = client.responses.create(model=MODEL, input="hi")
    assert resp.status == "completed"
    assert resp.id.startswith("resp_")
    assert resp.model == MODEL
    assert resp.output_text == "Hello there"
    assert resp.output[0].type == "message"
    assert resp.usage is not None
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens


def test_responses_stream_word_deltas(server: MockLLMServer, client: openai.OpenAI) -> None:
    text = "The quick brown fox jumps"
    server.configure([{"text": text, "stream": True}])
    events = list(client.responses.create(model=MODEL, input="hi", stream=True))

    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    for expected in ("response.output_item.added", "response.output_item.done"):
        assert expected in types
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)

    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 5
    assert "".join(deltas) == text

    completed = events[-1].response
    assert completed.status == "completed"
    assert completed.output_text == text
    assert completed.output[0].type == "message"
    assert completed.usage is not None and completed.usage.output_tokens > 0


def test_responses_stream_single_delta_without_stream_flag(
    server: MockLLMServer, client: openai.OpenAI
) -> None:
    server.configure([{"text": "one two three"}])
    events = list(client.responses.create(model=MODEL, input="hi", stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["one two three"]


def test_responses_stream_helper(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"text": "helper works", "stream": True, "tool_calls": [CALL]}])
    with client.responses.stream(model=MODEL, input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "helper works"
    assert final.output_text == "helper works"
    assert [item.type for item in final.output] == ["message", "function_call"]


def test_responses_tool_calls_non_stream(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"text": "Let me check.", "tool_calls": [CALL]}])
    resp = client.responses.create(model=MODEL, input="weather?")
    assert [item.type for item in resp.output] == ["message", "function_call"]
    call = resp.output[1]
    assert call.type == "function_call"
    assert (call.call_id, call.name, call.arguments) == (
        "call_1",
        "get_weather",
        '{"city": "Paris"}',
    )
    assert call.id and call.id.startswith("fc_")


def test_responses_tool_calls_stream(server: MockLLMServer, client: openai.OpenAI) -> None:
    second = {"call_id": "call_2", "name": "get_time", "arguments": "{}"}
    server.configure([{"tool_calls": [CALL, second]}])
    events = list(client.responses.create(model=MODEL, input="weather?", stream=True))

    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [i.type for i in added] == ["function_call", "function_call"]
    done_args = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert done_args == ['{"city": "Paris"}', "{}"]

    output = events[-1].response.output
    assert [(o.call_id, o.name, o.arguments) for o in output] == [
        ("call_1", "get_weather", '{"city": "Paris"}'),
        ("call_2", "get_time", "{}"),
    ]


async def test_async_responses_stream(server: MockLLMServer) -> None:
    server.configure([{"text": "async hello", "stream": True}])
    aclient = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    deltas: list[str] = []
    async for event in await aclient.responses.create(model=MODEL, input="hi", stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        last = event
    assert "".join(deltas) == "async hello"
    assert last.type == "response.completed"
    await aclient.close()


# --------------------------------------------------------------------------- Chat Completions


def test_chat_non_stream_text(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"text": "chat hello"}])
    completion = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    choice = completion.choices[0]
    assert choice.message.content == "chat hello"
    assert choice.finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens > 0


def test_chat_non_stream_tool_calls(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"tool_calls": [CALL]}])
    completion = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.id == "call_1"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_chat_stream_text(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"text": "streamed chat words", "stream": True}])
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed chat words"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert chunks[-1].usage is not None


def test_chat_stream_tool_calls(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"tool_calls": [CALL]}])
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            acc = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            acc["id"] += delta.id or ""
            if delta.function:
                acc["name"] += delta.function.name or ""
                acc["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls"
    assert calls == {0: {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}}


def test_chat_stream_helper(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"text": "ok", "tool_calls": [CALL]}])
    with client.chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "ok"
    assert message.tool_calls is not None
    assert message.tool_calls[0].function.name == "get_weather"


# --------------------------------------------------------------------------- errors and delay


def test_error_entry_raises_internal_server_error(
    server: MockLLMServer, client: openai.OpenAI
) -> None:
    server.configure([{"error": {"status_code": 500, "message": "boom"}}] * 2)
    with pytest.raises(openai.InternalServerError) as excinfo:
        client.responses.create(model=MODEL, input="hi")
    assert isinstance(excinfo.value, openai.APIStatusError)
    assert excinfo.value.status_code == 500
    assert "boom" in str(excinfo.value)

    with pytest.raises(openai.InternalServerError):
        client.responses.create(model=MODEL, input="hi", stream=True)
    # Each error entry is consumed once; the queue is now exhausted.
    assert client.responses.create(model=MODEL, input="hi").output_text == DEFAULT_TEXT


def test_error_entry_chat_4xx(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"error": {"status_code": 429, "message": "slow down"}}])
    with pytest.raises(openai.RateLimitError) as excinfo:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert excinfo.value.status_code == 429


def test_delay_s(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"text": "late", "delay_s": 0.3}])
    start = time.monotonic()
    assert client.responses.create(model=MODEL, input="hi").output_text == "late"
    assert time.monotonic() - start >= 0.3


# --------------------------------------------------------------------------- routing


def test_routing_match_beats_model_beats_default(
    server: MockLLMServer, client: openai.OpenAI
) -> None:
    server.configure([{"text": "from default"}] * 3)
    server.configure([{"text": "from model"}] * 3, key=MODEL)
    server.configure([{"text": "from match"}] * 3, key="weather", match="WEATHER")

    def ask(model: str, text: str) -> str:
        return client.responses.create(model=model, input=text).output_text

    assert ask(MODEL, "what is the WEATHER today") == "from match"
    assert ask(MODEL, "hello") == "from model"
    assert ask("other-model", "hello") == "from default"
    assert ask("other-model", "WEATHER please") == "from match"


def test_match_uses_last_user_text_only(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure([{"text": "matched"}], match="TOKEN")
    server.configure([{"text": "plain"}])
    # Responses: list input with input_text parts; the earlier user turn holds the token.
    input_items = [
        {"role": "user", "content": "TOKEN earlier"},
        {"role": "assistant", "content": "TOKEN in assistant text"},
        {"role": "user", "content": [{"type": "input_text", "text": "latest question"}]},
    ]
    assert client.responses.create(model=MODEL, input=input_items).output_text == "plain"
    # Chat: last user message (list-of-parts form) carries the token.
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "has TOKEN"}]},
    ]
    completion = client.chat.completions.create(model=MODEL, messages=messages)
    assert completion.choices[0].message.content == "matched"


def test_exhausted_and_missing_queue(server: MockLLMServer, client: openai.OpenAI) -> None:
    assert client.responses.create(model=MODEL, input="hi").output_text == DEFAULT_TEXT
    server.configure([{"text": "only once"}])
    assert client.responses.create(model=MODEL, input="hi").output_text == "only once"
    assert client.responses.create(model=MODEL, input="hi").output_text == DEFAULT_TEXT


# --------------------------------------------------------------------------- control endpoints


def test_requests_capture_and_reset(server: MockLLMServer, client: openai.OpenAI) -> None:
    client.responses.create(model=MODEL, input="capture me", instructions="be brief")
    client.models.list()

    captured = httpx.get(server.base_url.replace("/v1", "/mock/requests")).json()["requests"]
    assert [r["path"] for r in captured] == ["/v1/responses", "/v1/models"]
    first = captured[0]
    assert first["body"] == {"model": MODEL, "input": "capture me", "instructions": "be brief"}
    assert "authorization" not in first["headers"]
    assert first["headers"]["content-type"] == "application/json"
    assert server.requests == captured

    reset = httpx.post(server.base_url.replace("/v1", "/mock/reset"))
    assert reset.status_code == 200
    assert server.requests == []


def test_configure_over_http(server: MockLLMServer, client: openai.OpenAI) -> None:
    base = server.base_url.removesuffix("/v1")
    with httpx.Client(base_url=base) as http:
        ok = http.post("/mock/configure", json={"responses": [{"text": "via http"}]})
        assert ok.status_code == 200
        bad = http.post("/mock/configure", json={"responses": [{"tool_calls": [{}]}]})
        assert bad.status_code == 400
    assert client.responses.create(model=MODEL, input="hi").output_text == "via http"
    assert server.requests[-1]["path"] == "/v1/responses"
    assert all(r["path"].startswith("/v1/") for r in server.requests)


# --------------------------------------------------------------------------- echo scripts


def test_echo_responses_reads_the_outputs_after_the_calls(
    server: MockLLMServer, client: openai.OpenAI
) -> None:
    server.configure(
        tool_then_echo("get_weather", {"city": "Paris"}, call_id="call_w", prefix="saw: "),
        match="ECHO",
    )
    first = client.responses.create(model=MODEL, input="ECHO please")
    (call,) = first.output
    assert (call.type, call.call_id, call.name) == ("function_call", "call_w", "get_weather")
    assert json.loads(call.arguments) == {"city": "Paris"}
    conversation = [
        {"role": "user", "content": "ECHO please"},
        {"type": "function_call", "call_id": "call_w", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_w", "output": '{"error": "no"}'},
        {"type": "function_call", "call_id": "call_2", "name": "other", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_2", "output": "sunny"},
    ]
    events = list(client.responses.create(model=MODEL, input=conversation, stream=True))
    assert events[-1].response.output_text == 'saw: {"error": "no"}\nsunny'


def test_echo_chat_reads_tool_messages(server: MockLLMServer, client: openai.OpenAI) -> None:
    server.configure(tool_then_echo("get_weather", '{"city": "Rome"}'))
    first = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    (tool_call,) = first.choices[0].message.tool_calls or []
    assert tool_call.id == "call_echo" and tool_call.function.arguments == '{"city": "Rome"}'
    messages: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call.model_dump()]},
        {"role": "tool", "tool_call_id": "call_echo", "content": "declined by bob: no reason"},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages)
    assert second.choices[0].message.content == "declined by bob: no reason"


def test_echo_without_tool_outputs_answers_the_prefix_only(
    server: MockLLMServer, client: openai.OpenAI
) -> None:
    server.configure([{"echo_tool_output": True, "text": "nothing: "}, {"echo_tool_output": True}])
    assert client.responses.create(model=MODEL, input="hi").output_text == "nothing: "
    # The last item is a user message, so earlier tool outputs are not "the" outputs.
    conversation = [
        {"type": "function_call_output", "call_id": "c", "output": "old"},
        {"role": "user", "content": "again"},
    ]
    assert client.responses.create(model=MODEL, input=conversation).output_text == ""


@pytest.mark.parametrize(
    "entry",
    [
        {"echo_tool_output": "yes"},
        {"echo_tool_output": True, "tool_calls": [CALL]},
    ],
)
def test_bad_echo_entries_are_refused(server: MockLLMServer, entry: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        server.configure([entry])
    base = server.base_url.removesuffix("/v1")
    with httpx.Client(base_url=base) as http:
        assert http.post("/mock/configure", json={"responses": [entry]}).status_code == 400


def test_models_endpoint(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["mock-model"]
    assert models.data[0].owned_by == "mock"


def test_bad_json_and_unknown_path(server: MockLLMServer) -> None:
    # One keep-alive client for all calls: JSON responses must be reusable connections.
    with httpx.Client(base_url=server.base_url.removesuffix("/v1")) as http:
        bad = http.post(
            "/v1/responses", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert bad.status_code == 400
        assert set(bad.json()["error"]) >= {"message", "type", "code"}
        assert bad.json()["error"]["code"] is None

        missing = http.get("/v1/nope")
        assert missing.status_code == 404
        assert "error" in missing.json()

        assert http.get("/v1/models").status_code == 200


def test_split_words_round_trips() -> None:
    for text in ["", "one", "  lead and trail  ", "multi\nline  text\tok"]:
        assert "".join(split_words(text)) == text
    assert split_words("a b c") == ["a ", "b ", "c"]


# --------------------------------------------------------------------------- CLI


def test_cli_prints_url_serves_and_exits_cleanly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "testing.mockllm", "--host", "127.0.0.1", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("MOCKLLM_URL=http://127.0.0.1:")
        url = line.removeprefix("MOCKLLM_URL=")
        assert url.endswith("/v1")

        cli_client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        assert cli_client.responses.create(model=MODEL, input="hi").output_text == DEFAULT_TEXT
        cli_client.close()

        proc.terminate()
        stdout, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert stdout == ""  # exactly one line was printed


@pytest.mark.timeout(30)
def test_many_connections_at_once_complete_their_handshake_before_any_is_accepted() -> None:
    """A runner starting 20 turns at once opens 20 connections. With socketserver's
    backlog of 5 the kernel dropped the handshakes beyond it and the clients retried a
    second later, which stalled a few turns of every concurrent benchmark round."""
    mock = MockLLMServer()  # not started: nothing accepts, only the backlog holds them
    sockets: list[socket.socket] = []
    try:
        for _ in range(40):
            sock = socket.create_connection((mock.host, mock.port), timeout=5)
            sockets.append(sock)
        # A handshake the kernel dropped would have raised TimeoutError above; the
        # queue now holds all of them.
        assert len(sockets) == 40
        mock.start()
        sockets[-1].sendall(b"GET /v1/models HTTP/1.1\r\nHost: mock\r\nConnection: close\r\n\r\n")
        sockets[-1].settimeout(10)
        assert sockets[-1].recv(64).startswith(b"HTTP/1.1 ")
    finally:
        for sock in sockets:
            sock.close()
        mock.stop()
