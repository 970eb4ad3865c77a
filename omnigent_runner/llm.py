"""One model call, streamed, through the official ``openai`` SDK, in either API flavour.

The agent loop only needs three things from a model call: the text deltas as they
arrive, the final text, and the function calls. This module hides how the Responses
API and Chat Completions deliver them, and turns the SDK's exceptions into the two
failure codes of agents.md (``connection_error``, ``llm_error``) so the loop does not
depend on SDK details.

The conversation and the tools go to the SDK as ``extra_body`` (see
:func:`_call_responses`): they are plain JSON in wire format already, and the SDK's
per-request parameter transform would otherwise walk all of them on every call.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai

from omnigent_runner.transcript import to_chat_messages, to_responses_input, to_responses_tools

DeltaCallback = Callable[[str], None]


class LLMError(Exception):
    """The model call failed; ``code`` is the turn's failure code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class FunctionCall:
    call_id: str
    name: str
    arguments: str


@dataclass
class ModelAnswer:
    """What the model produced: text (possibly empty) and function calls (possibly none)."""

    text: str = ""
    calls: list[FunctionCall] = field(default_factory=list)


@dataclass(frozen=True)
class ModelRequest:
    """Everything one model call needs; ``tools`` are Chat-format function definitions."""

    api: str  # "responses" | "chat_completions"
    model: str
    instructions: str
    history: Sequence[dict[str, Any]]
    tools: Sequence[dict[str, Any]]


class ClientPool:
    """One SDK client per (api_key, base_url), so connections are reused across turns."""

    def __init__(self, *, max_retries: int) -> None:
        self._max_retries = max_retries
        self._clients: dict[tuple[str, str | None], openai.AsyncOpenAI] = {}

    def get(self, *, api_key: str, base_url: str | None) -> openai.AsyncOpenAI:
        key = (api_key, base_url)
        client = self._clients.get(key)
        if client is None:
            client = openai.AsyncOpenAI(
                api_key=api_key, base_url=base_url, max_retries=self._max_retries
            )
            self._clients[key] = client
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()


async def call_model(
    client: openai.AsyncOpenAI, request: ModelRequest, on_delta: DeltaCallback
) -> ModelAnswer:
    """Stream one answer, calling ``on_delta`` per text delta; raise :class:`LLMError`.

    The SDK has already retried what it retries (connection errors, 408/409/429/5xx)
    by the time an exception reaches us, so every failure here is final for the turn.
    """
    try:
        if request.api == "chat_completions":
            return await _call_chat(client, request, on_delta)
        return await _call_responses(client, request, on_delta)
    except openai.APIStatusError as exc:
        raise LLMError("llm_error", f"LLM returned HTTP {exc.status_code}: {_detail(exc)}") from exc
    except openai.APIConnectionError as exc:
        raise LLMError(
            "connection_error", f"cannot reach the LLM at {client.base_url}: {exc.message}"
        ) from exc
    except openai.APIError as exc:
        raise LLMError("llm_error", f"LLM error: {_detail(exc)}") from exc


def _detail(exc: openai.APIError) -> str:
    """The server's own error message when the body has one, else the SDK's."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return exc.message


# --- Responses API ----------------------------------------------------------------------


async def _call_responses(
    client: openai.AsyncOpenAI, request: ModelRequest, on_delta: DeltaCallback
) -> ModelAnswer:
    """Stream one Responses answer, sending the conversation and tools as ``extra_body``.

    Passed as keywords, the SDK runs them through its parameter transform
    (``async_maybe_transform`` against ``ResponseCreateParams``), which walks the whole
    conversation against its TypedDict annotations on every call: most of the runner's
    CPU per turn, growing with the history (issue 14). Ours are wire-format JSON
    already (``transcript.py``), so the transform only ever returns an equal copy.
    ``extra_body`` is the SDK's public "additional JSON properties" option: it is merged
    into the body untouched, after the transform, at the same place in the request
    build, so retries, timeouts, headers, auth and the typed event stream
    (``stream=True`` → ``AsyncStream[ResponseStreamEvent]``) stay the SDK's own.
    ``tests/unit/test_llm_wire_body.py`` guards that the bytes sent equal what the
    keyword form sends, so an SDK release whose transform changes these parameters
    fails a test instead of changing the wire silently.
    """
    body: dict[str, Any] = {"input": to_responses_input(request.history)}
    if request.instructions:
        body["instructions"] = request.instructions
    if request.tools:
        body["tools"] = to_responses_tools(request.tools)
    deltas: list[str] = []
    done_items: list[Any] = []
    final_output: list[Any] | None = None
    # Events are read by their ``type`` tag, which mypy cannot narrow the SDK's event
    # union through; the stream object is the SDK's typed ``AsyncStream`` all the same.
    stream: Any = await client.responses.create(model=request.model, stream=True, extra_body=body)
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
    items = done_items or final_output
    if items is None:
        raise LLMError("llm_error", "LLM stream ended before the response was complete")
    return _answer_from_items(items, deltas)


def _answer_from_items(items: Sequence[Any], deltas: Sequence[str]) -> ModelAnswer:
    """Collect message text and function calls from Responses output items."""
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
                    call_id=item.call_id or _new_call_id(),
                    name=item.name,
                    arguments=item.arguments or "{}",
                )
            )
    answer.text = "".join(texts) or "".join(deltas)
    return answer


# --- Chat Completions -------------------------------------------------------------------


async def _call_chat(
    client: openai.AsyncOpenAI, request: ModelRequest, on_delta: DeltaCallback
) -> ModelAnswer:
    """Stream one Chat Completions answer, sending the messages and tools as ``extra_body``.

    Why ``extra_body``: see :func:`_call_responses`. ``messages`` is a required keyword of
    ``create``, so it is given as an empty list (which the transform passes at no
    cost) and ``extra_body`` replaces it: the SDK merges ``extra_body`` over the
    transformed body, its keys taking precedence ("the extra values given here take
    precedence over values defined on the client or passed to this method"), and the
    key keeps its place in the JSON. That is preferred to the SDK's low-level
    ``client.post("/chat/completions", ...)``, which would leave us to repeat what the
    resource method chooses per endpoint (path, auth scheme, response and stream
    types) and to track those SDK internals across releases.
    """
    body: dict[str, Any] = {"messages": to_chat_messages(request.instructions, request.history)}
    if request.tools:
        body["tools"] = list(request.tools)
    texts: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    stream = await client.chat.completions.create(
        model=request.model, messages=[], stream=True, extra_body=body
    )
    async with stream:
        async for chunk in stream:
            for choice in chunk.choices or []:
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
                        # The name comes whole (first chunk); some servers repeat it.
                        call["name"] = call["name"] or part.function.name or ""
                        call["arguments"] += part.function.arguments or ""
    answer = ModelAnswer(text="".join(texts))
    for index in sorted(calls):
        call = calls[index]
        answer.calls.append(
            FunctionCall(
                call_id=call["id"] or _new_call_id(),
                name=call["name"],
                arguments=call["arguments"] or "{}",
            )
        )
    return answer


def _new_call_id() -> str:
    """For servers that omit call ids: the loop needs one to pair a call with its output."""
    return "call_" + uuid.uuid4().hex
