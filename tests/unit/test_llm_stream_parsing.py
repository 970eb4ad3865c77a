"""Guard for issue 14: reading the event stream as plain dicts changes no answer and no error.

``omnigent_runner.llm`` reads the model's Server-Sent Events as decoded JSON instead of
the SDK's per-event pydantic models, which cost about a third of the runner's CPU per
turn. That is only right while it reads the same thing. Each case here serves one
recorded body (the mock LLM's own streams, and hand-written edge cases: errors, cut
streams, multi-line ``data:``, unknown events, UTF-8 split across chunks, HTTP
errors) through an in-memory transport twice: once to ``call_model`` as it is, and
once to ``call_model`` with the reading replaced by the typed reading it had before
(kept below as the reference), and requires the same answer, the same deltas in the
same order, or the same ``LLMError`` code and message.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import pytest

from omnigent_runner import llm
from omnigent_runner.llm import (
    DeltaCallback,
    FunctionCall,
    LLMError,
    ModelAnswer,
    ModelRequest,
    call_model,
)
from omnigent_runner.transcript import to_chat_messages, to_responses_input
from testing.mockllm import ChatTurn, Reply, ResponsesTurn, ToolCall

pytestmark = pytest.mark.timeout(30)

BASE_URL = "http://llm.invalid/v1"
TWENTY_WORDS = (
    "The build is green again: I fixed the flaky clock test, pinned the parser, "
    "and reran the whole suite over."
)
UNICODE_TEXT = "Grüße — 日本語のテキスト ✓ café 😀 naïve Ωmega"
HISTORY: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}
]
CALLS = (
    ToolCall(call_id="call_read", name="sys_os_read", arguments='{"path": "a.txt"}'),
    # No id and no arguments: the runner makes an id up and sends "{}".
    ToolCall(call_id="", name="lookup_ticket", arguments=""),
)


# --- the typed reading call_model had before (the reference) ------------------------------


async def _typed_responses(
    client: openai.AsyncOpenAI, request: ModelRequest, on_delta: DeltaCallback, progress: Any
) -> ModelAnswer:
    body: dict[str, Any] = {"input": to_responses_input(request.history)}
    if request.instructions:
        body["instructions"] = request.instructions
    deltas: list[str] = []
    done_items: list[Any] = []
    final_output: list[Any] | None = None
    stream: Any = await client.responses.create(model=request.model, stream=True, extra_body=body)
    progress.answering = True
    async with stream:
        async for event in stream:
            kind = event.type
            if kind == "response.output_text.delta":
                deltas.append(event.delta)
                on_delta(event.delta)
            elif kind == "response.output_item.done":
                done_items.append(event.item)
            elif kind in ("response.completed", "response.incomplete"):
                final_output = list(event.response.output or [])
            elif kind == "response.failed":
                error = event.response.error
                message = error.message if error is not None else "the response failed"
                raise LLMError("llm_error", f"LLM response failed: {message}")
            elif kind == "error":
                raise LLMError("llm_error", f"LLM stream error: {event.message}")
    if final_output is None:
        raise LLMError("llm_error", llm.STREAM_ENDED_EARLY)
    items = done_items or final_output
    answer = ModelAnswer()
    texts: list[str] = []
    for item in items:
        kind = getattr(item, "type", None)
        if kind == "message":
            for part in item.content or []:
                if getattr(part, "type", None) == "output_text":
                    texts.append(part.text)
        elif kind == "function_call":
            answer.calls.append(
                FunctionCall(
                    call_id=item.call_id or llm._new_call_id(),
                    name=item.name,
                    arguments=item.arguments or "{}",
                )
            )
    answer.text = "".join(texts) or "".join(deltas)
    return answer


async def _typed_chat(
    client: openai.AsyncOpenAI, request: ModelRequest, on_delta: DeltaCallback, progress: Any
) -> ModelAnswer:
    body = {"messages": to_chat_messages(request.instructions, request.history)}
    texts: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    stream = await client.chat.completions.create(
        model=request.model, messages=[], stream=True, extra_body=body
    )
    progress.answering = True
    finished = False
    chunk_count = 0
    async with stream:
        async for chunk in stream:
            chunk_count += 1
            for choice in chunk.choices or []:
                finished = finished or bool(choice.finish_reason)
                delta = choice.delta
                if delta is None:
                    continue
                if delta.content:
                    texts.append(delta.content)
                    on_delta(delta.content)
                for part in delta.tool_calls or []:
                    call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                    if part.id:
                        call["id"] = part.id
                    if part.function is not None:
                        call["name"] = call["name"] or part.function.name or ""
                        call["arguments"] += part.function.arguments or ""
    if not finished:
        if chunk_count:
            raise LLMError("llm_error", llm.STREAM_ENDED_EARLY)
        raise LLMError("llm_error", await llm._empty_stream_message(client, request, body))
    answer = ModelAnswer(text="".join(texts))
    for index in sorted(calls):
        call = calls[index]
        answer.calls.append(
            FunctionCall(
                call_id=call["id"] or llm._new_call_id(),
                name=call["name"],
                arguments=call["arguments"] or "{}",
            )
        )
    return answer


# --- recorded bodies -----------------------------------------------------------------------


def _responses_events(reply: Reply) -> list[dict[str, Any]]:
    request = {"model": "gpt-test", "input": HISTORY}
    return [
        {**event, "sequence_number": n}
        for n, event in enumerate(ResponsesTurn(reply=reply, request=request).events())
    ]


def _chat_chunks(reply: Reply) -> list[dict[str, Any]]:
    return list(ChatTurn(reply=reply, request={"model": "gpt-test"}).chunks())


def _named(events: list[dict[str, Any]]) -> str:
    """Responses framing: an ``event:`` line naming the type, then the JSON."""
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


def _data(chunks: list[dict[str, Any]], *, done: bool = True) -> str:
    """Chat framing: ``data:`` lines only, ``[DONE]`` at the end."""
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return text + ("data: [DONE]\n\n" if done else "")


def _cut(events: list[dict[str, Any]], before: str) -> list[dict[str, Any]]:
    """The events up to (not including) the first of type ``before``."""
    kinds = [e["type"] for e in events]
    return events[: kinds.index(before)]


def _chunk(
    delta: dict[str, Any] | None, finish_reason: str | None = None, **extra: Any
) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-test",
        "choices": [choice],
        **extra,
    }


def _multi_line(event: dict[str, Any]) -> str:
    """One event whose JSON is spread over several ``data:`` lines (joined with newlines)."""
    lines = json.dumps(event, indent=1).splitlines()
    return "".join(f"data: {line}\n" for line in lines) + "\n"


@dataclass(frozen=True)
class Case:
    api: str
    body: str = ""
    status: int = 200
    content_type: str = "text/event-stream"
    chunk_size: int | None = None  # None: the whole body in one chunk
    crlf: bool = False
    drop: type[httpx2.TransportError] | None = None  # raised after the body
    connect_error: bool = False  # no response at all


def _responses_cases() -> Iterator[tuple[str, Case]]:
    text = Reply(text=TWENTY_WORDS, stream_words=True)
    calls = Reply(text="Reading two things.", tool_calls=CALLS, stream_words=True)
    text_events = _responses_events(text)
    completed_only = [e for e in text_events if e["type"] != "response.output_item.done"]
    incomplete = [
        {**e, "type": "response.incomplete"} if e["type"] == "response.completed" else e
        for e in completed_only
    ]
    deltas_then = _cut(text_events, "response.output_text.done")
    no_deltas = [e for e in text_events if e["type"] != "response.output_text.delta"]
    parts = [
        {"type": "output_text", "text": "First part. ", "annotations": []},
        {"type": "refusal", "refusal": "Not that part."},
        {"type": "output_text", "text": "Last part.", "annotations": []},
    ]
    several_parts = [
        {**e, "item": {**e["item"], "content": parts}}
        if e["type"] == "response.output_item.done"
        else e
        for e in text_events
    ]
    failed: dict[str, Any] = {
        "type": "response.failed",
        "response": {
            **text_events[0]["response"],
            "status": "failed",
            "error": {"code": "server_error", "message": "The model crashed."},
        },
    }
    failed_quietly = {**failed, "response": {**failed["response"], "error": None}}
    error_event: dict[str, Any] = {
        "type": "error",
        "code": "rate_limit_exceeded",
        "message": "Slow down ✋",
        "param": None,
        "sequence_number": 9,
    }
    error_payload = {"error": {"message": "The engine is overloaded.", "type": "server_error"}}
    unknown: list[dict[str, Any]] = [
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "delta": "hmm"},
        {"type": "response.some_future_event", "payload": {"nested": [1, 2, 3]}},
        {"type": "response.audio.delta", "delta": "AAAA"},
    ]
    with_unknown = text_events[:3] + unknown + text_events[3:]
    delta_at = next(
        n for n, e in enumerate(text_events) if e["type"] == "response.output_text.delta"
    )
    yield "text", Case("responses", _named(text_events))
    yield "function-calls", Case("responses", _named(_responses_events(calls)))
    yield "calls-only", Case("responses", _named(_responses_events(Reply(tool_calls=CALLS))))
    yield "final-output-only", Case("responses", _named(completed_only))
    yield "incomplete", Case("responses", _named(incomplete))
    yield "text-without-deltas", Case("responses", _named(no_deltas))
    yield "message-with-several-parts", Case("responses", _named(several_parts))
    yield "failed", Case("responses", _named([*deltas_then, failed]))
    yield "failed-without-error", Case("responses", _named([*deltas_then, failed_quietly]))
    yield "error-event", Case("responses", _named([*deltas_then, error_event]))
    yield (
        "error-payload",
        Case("responses", _named(deltas_then) + f"data: {json.dumps(error_payload)}\n\n"),
    )
    yield "cut-before-completion", Case("responses", _named(deltas_then))
    yield "cut-empty", Case("responses", "")
    yield "cut-by-read-error", Case("responses", _named(deltas_then), drop=httpx2.ReadError)
    yield (
        "cut-by-read-timeout",
        Case("responses", _named(deltas_then), drop=httpx2.ReadTimeout),
    )
    yield "unknown-event-types", Case("responses", _named(with_unknown))
    yield (
        "multi-line-data",
        Case(
            "responses",
            _named(text_events[:delta_at])
            + ": a comment line\nid: 7\nretry: 1000\nevent: response.output_text.delta\n"
            + _multi_line(text_events[delta_at])
            + _named(text_events[delta_at + 1 :]),
        ),
    )
    yield "crlf", Case("responses", _named(text_events), crlf=True, chunk_size=5)
    unicode_events = _responses_events(Reply(text=UNICODE_TEXT, stream_words=True))
    yield "unicode-split-1", Case("responses", _named(unicode_events), chunk_size=1)
    yield "unicode-split-7", Case("responses", _named(unicode_events), chunk_size=7)


def _chat_cases() -> Iterator[tuple[str, Case]]:
    text = _chat_chunks(Reply(text=TWENTY_WORDS, stream_words=True))
    calls = _chat_chunks(Reply(text="Reading two things.", tool_calls=CALLS, stream_words=True))
    pieces = [
        _chunk({"role": "assistant", "content": None}),
        # Index 1 first; arguments in pieces; the id only once; the name repeated.
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "b", "arguments": '{"x"'},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"name": "a", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 1, "function": {"name": "b", "arguments": ": 1}"}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"y": "é"}'}}]}),
        _chunk({"tool_calls": [{"index": 0, "id": "call_a", "function": None}]}),
        _chunk({}, finish_reason="tool_calls"),
    ]
    odd: list[dict[str, Any]] = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": None}),
        _chunk(None),
        {**_chunk({"content": "kept"}), "system_fingerprint": "fp_1", "future_field": {"a": 1}},
        {**_chunk({}), "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
        {**_chunk({}), "choices": None},
        _chunk({"content": " too", "reasoning_content": "ignored", "refusal": None}),
        _chunk({}, finish_reason="stop"),
    ]
    error_payload = {"error": {"message": "The engine is overloaded.", "type": "server_error"}}
    unicode_chunks = _chat_chunks(Reply(text=UNICODE_TEXT, stream_words=True))
    yield "text", Case("chat_completions", _data(text))
    yield "function-calls", Case("chat_completions", _data(calls))
    yield "tool-calls-by-index", Case("chat_completions", _data(pieces))
    yield "unknown-fields-and-empty-deltas", Case("chat_completions", _data(odd))
    yield (
        "error-payload",
        Case("chat_completions", _data(text[:4], done=False) + _data([error_payload])),
    )
    yield "cut-before-completion", Case("chat_completions", _data(text[:6], done=False))
    yield "cut-empty", Case("chat_completions", "")
    yield (
        "cut-by-read-error",
        Case("chat_completions", _data(text[:6], done=False), drop=httpx2.ReadError),
    )
    yield (
        "cut-by-read-timeout",
        Case("chat_completions", _data(text[:6], done=False), drop=httpx2.ReadTimeout),
    )
    yield (
        "multi-line-data",
        Case(
            "chat_completions",
            _data(text[:2], done=False) + ": keep-alive\n" + _multi_line(text[2]) + _data(text[3:]),
        ),
    )
    yield "crlf", Case("chat_completions", _data(text), crlf=True, chunk_size=5)
    yield "named-events", Case("chat_completions", _named_chat(text))
    yield "unicode-split-1", Case("chat_completions", _data(unicode_chunks), chunk_size=1)
    yield "unicode-split-7", Case("chat_completions", _data(unicode_chunks), chunk_size=7)


def _named_chat(chunks: list[dict[str, Any]]) -> str:
    """Some servers name Chat chunks too; the name is not what is read."""
    return "".join(f"event: chunk\ndata: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def _http_error_cases() -> Iterator[tuple[str, Case]]:
    for api in ("responses", "chat_completions"):
        for status in (429, 500):
            body = json.dumps(
                {"error": {"message": f"Failure {status} ✗", "type": "x", "code": None}}
            )
            yield (
                f"{api}-http-{status}",
                Case(api, body, status=status, content_type="application/json"),
            )
        yield (
            f"{api}-http-502-html",
            Case(api, "<html>Bad gateway</html>", status=502, content_type="text/html"),
        )
        yield f"{api}-connect-error", Case(api, connect_error=True)


CASES: dict[str, Case] = {
    **{f"responses-{name}": case for name, case in _responses_cases()},
    **{f"chat-{name}": case for name, case in _chat_cases()},
    **dict(_http_error_cases()),
}


# --- serving a body and comparing -----------------------------------------------------------


class _Body(httpx2.AsyncByteStream):
    """A response body in chunks of ``size`` bytes, optionally broken off at the end."""

    def __init__(
        self, data: bytes, size: int | None, *, drop: type[httpx2.TransportError] | None
    ) -> None:
        self._data = data
        self._size = size or max(len(data), 1)
        self._drop = drop

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self._data), self._size):
            yield self._data[start : start + self._size]
        if self._drop is not None:
            raise self._drop("the connection broke off")

    async def aclose(self) -> None:
        pass


def _client(case: Case) -> openai.AsyncOpenAI:
    def handle(request: httpx2.Request) -> httpx2.Response:
        if case.connect_error:
            raise httpx2.ConnectError("connection refused", request=request)
        text = case.body.replace("\n", "\r\n") if case.crlf else case.body
        return httpx2.Response(
            case.status,
            headers={"content-type": case.content_type},
            stream=_Body(text.encode(), case.chunk_size, drop=case.drop),
        )

    return openai.AsyncOpenAI(
        api_key="sk-stream",
        base_url=BASE_URL,
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handle)),
    )


_MADE_UP_ID = re.compile(r"^call_[0-9a-f]{32}$")


async def _outcome(client: openai.AsyncOpenAI, api: str) -> tuple[Any, ...]:
    """What the turn sees of one call: the deltas, then the answer or the error."""
    request = ModelRequest(
        api=api, model="gpt-test", instructions="Be brief.", history=HISTORY, tools=[]
    )
    deltas: list[str] = []
    try:
        answer = await call_model(client, request, deltas.append)
    except LLMError as exc:
        return ("error", exc.code, exc.message, deltas)
    calls = [
        # Made-up ids differ per call by design; that one was made up is what must match.
        (("<made up>" if _MADE_UP_ID.match(c.call_id) else c.call_id), c.name, c.arguments)
        for c in answer.calls
    ]
    return ("answer", answer.text, calls, deltas)


@pytest.mark.parametrize("name", list(CASES))
async def test_dict_reading_matches_the_typed_reading(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    client = _client(case)
    try:
        ours = await _outcome(client, case.api)
        with monkeypatch.context() as patch:
            patch.setattr(llm, "_call_responses", _typed_responses)
            patch.setattr(llm, "_call_chat", _typed_chat)
            typed = await _outcome(client, case.api)
    finally:
        await client.close()
    assert ours == typed


async def test_the_cases_cover_what_they_claim() -> None:
    """The comparison alone would pass on two equally wrong readers: pin a few outcomes."""

    async def outcome(name: str) -> tuple[Any, ...]:
        client = _client(CASES[name])
        try:
            return await _outcome(client, CASES[name].api)
        finally:
            await client.close()

    for api in ("responses", "chat"):
        kind, text, calls, deltas = await outcome(f"{api}-text")
        assert (kind, text, calls) == ("answer", TWENTY_WORDS, [])
        assert len(deltas) == 20 and "".join(deltas) == TWENTY_WORDS
        kind, text, _calls, deltas = await outcome(f"{api}-unicode-split-1")
        assert (kind, text, "".join(deltas)) == ("answer", UNICODE_TEXT, UNICODE_TEXT)
        kind, text, calls, _deltas = await outcome(f"{api}-function-calls")
        assert text == "Reading two things."
        assert calls == [
            ("call_read", "sys_os_read", '{"path": "a.txt"}'),
            ("<made up>", "lookup_ticket", "{}"),
        ]
        assert (await outcome(f"{api}-multi-line-data"))[1] == TWENTY_WORDS
        assert (await outcome(f"{api}-crlf"))[1] == TWENTY_WORDS
    assert (await outcome("chat-tool-calls-by-index"))[2] == [
        ("call_a", "a", '{"y": "é"}'),
        ("call_b", "b", '{"x": 1}'),
    ]
    assert (await outcome("chat-unknown-fields-and-empty-deltas"))[1:] == (
        "kept too",
        [],
        ["kept", " too"],
    )
    assert (await outcome("responses-unknown-event-types"))[1] == TWENTY_WORDS
    _kind, text, _calls, deltas = await outcome("responses-text-without-deltas")
    assert (text, deltas) == (TWENTY_WORDS, [])
    assert (await outcome("responses-message-with-several-parts"))[1] == "First part. Last part."
    assert (await outcome("responses-failed"))[:3] == (
        "error",
        "llm_error",
        "LLM response failed: The model crashed.",
    )
    assert (await outcome("responses-failed-without-error"))[2] == (
        "LLM response failed: the response failed"
    )
    assert (await outcome("responses-error-event"))[2] == "LLM stream error: Slow down ✋"
    for api in ("responses", "chat"):
        assert (await outcome(f"{api}-error-payload"))[2] == (
            "LLM error: The engine is overloaded."
        )
    for api in ("responses", "chat"):
        # Issue 44: only the end marker (``response.completed``, a ``finish_reason``)
        # makes an answer whole; a stream that stops before it fails the turn.
        assert (await outcome(f"{api}-cut-before-completion"))[1:3] == (
            "llm_error",
            llm.STREAM_ENDED_EARLY,
        )
        assert (await outcome(f"{api}-cut-empty"))[1:3] == ("llm_error", llm.STREAM_ENDED_EARLY)
    for api in ("responses", "chat_completions"):
        assert (await outcome(f"{api}-http-429"))[1:3] == (
            "llm_error",
            "LLM returned HTTP 429: Failure 429 ✗",
        )
        assert (await outcome(f"{api}-connect-error"))[1] == "connection_error"
    # Reached, then broken mid-answer: not "cannot reach" (issue 44).
    for name in ("responses-cut-by-read-error", "chat-cut-by-read-timeout"):
        assert (await outcome(name))[1:3] == ("connection_error", llm.CONNECTION_BROKE)


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_the_sdk_still_retries(api: str) -> None:
    """The raw-response path keeps the SDK's retries: a 429, then the answer."""
    answer = CASES["responses-text" if api == "responses" else "chat-text"].body.encode()
    statuses = [429, 200]
    sent: list[httpx2.Request] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        if statuses.pop(0) == 429:
            # A 1 ms server-directed wait, so the SDK's backoff does not slow the suite.
            body = b'{"error": {"message": "slow down"}}'
            return httpx2.Response(429, headers={"retry-after-ms": "1"}, content=body)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=answer)

    client = openai.AsyncOpenAI(
        api_key="sk-stream",
        base_url=BASE_URL,
        max_retries=1,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handle)),
    )
    request = ModelRequest(api=api, model="gpt-test", instructions="", history=HISTORY, tools=[])
    try:
        result = await call_model(client, request, lambda _delta: None)
    finally:
        await client.close()
    assert result.text == TWENTY_WORDS
    assert len(sent) == 2
    assert sent[0].content == sent[1].content
