"""One model call, streamed, through the official ``openai`` SDK, in either API flavour.

The agent loop only needs three things from a model call: the text deltas as they
arrive, the final text, and the function calls. This module hides how the Responses
API and Chat Completions deliver them, and turns the SDK's exceptions into the two
failure codes of agents.md (``connection_error``, ``llm_error``) so the loop does not
depend on SDK details.

Both directions bypass the SDK's typed models, which cost most of the runner's CPU
per turn (issue 14) for data that is plain JSON at both ends: the conversation and
the tools go out as ``extra_body`` (see :func:`_call_responses`), and the streamed
events come back as plain dicts (see :func:`_open_event_stream`). Requests, retries,
timeouts, auth, Server-Sent Events decoding and HTTP error mapping stay the SDK's.

The SDK's connections go through aiohttp by default (the SDK's own
``DefaultAioHttpClient``, its ``aiohttp`` extra): its C parser and plain asyncio
streams cost about a quarter less of the runner's CPU per turn than the SDK's default
httpx transport (``docs/performance-history.md``, item 26). ``httpx`` keeps the SDK's
default.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx2
import openai

from omnigent_runner.config import DEFAULT_LLM_HTTP_CLIENT, LLM_HTTP_CLIENTS
from omnigent_runner.transcript import to_chat_messages, to_responses_input, to_responses_tools

DeltaCallback = Callable[[str], None]
logger = logging.getLogger(__name__)

# The turn's error when a stream stops short of its end marker (agents.md, Failures).
STREAM_ENDED_EARLY = "the model's stream ended before the answer was complete"
CONNECTION_BROKE = "the connection to the LLM broke during its answer"
TOOL_CHOICE_MODES = ("auto", "required", "none")


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


@dataclass
class CallUsage:
    """What one model call used, as the provider reported it (usage.md, What is counted).

    Filled while the answer streams: ``reported`` stays False when the provider sent no
    usage (a Chat server that ignores ``stream_options``, a stream cut short), which the
    server records as such, never as zero. ``input_tokens`` excludes the cached part
    (``cache_read_input_tokens``), as the server's totals count them; ``model`` is the
    model the provider answered with, when it named one.
    """

    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0
    reported: bool = False
    # The request reached the provider (a 200 came back): only then is the call counted.
    sent: bool = False

    def read_responses(self, usage: Any) -> None:
        """A Responses ``usage`` object: ``input_tokens`` includes the cached tokens."""
        if not isinstance(usage, dict):
            return
        cached = _count(_field(usage.get("input_tokens_details"), "cached_tokens"))
        self._set(
            total_input=_count(usage.get("input_tokens")),
            cached=cached,
            created=_count(usage.get("cache_creation_input_tokens")),
            output=_count(usage.get("output_tokens")),
            reasoning=_count(_field(usage.get("output_tokens_details"), "reasoning_tokens")),
        )

    def read_chat(self, usage: Any) -> None:
        """A Chat Completions ``usage`` object: ``prompt_tokens`` includes the cached ones."""
        if not isinstance(usage, dict):
            return
        self._set(
            total_input=_count(usage.get("prompt_tokens")),
            cached=_count(_field(usage.get("prompt_tokens_details"), "cached_tokens")),
            created=_count(usage.get("cache_creation_input_tokens")),
            output=_count(usage.get("completion_tokens")),
            reasoning=_count(_field(usage.get("completion_tokens_details"), "reasoning_tokens")),
        )

    def _set(self, *, total_input: int, cached: int, created: int, output: int, reasoning: int):
        cached = min(cached, total_input)
        self.input_tokens = total_input - cached
        self.cache_read_input_tokens = cached
        self.cache_creation_input_tokens = created
        self.output_tokens = output
        self.reasoning_tokens = min(reasoning, output) if output else reasoning
        self.reported = True

    def answered_with(self, model: Any) -> None:
        if isinstance(model, str) and model:
            self.model = model


def _count(value: Any) -> int:
    """A token count from the provider's JSON: a non-negative integer, else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(int(value), 0)


@dataclass(frozen=True)
class ModelRequest:
    """Everything one model call needs; ``tools`` are Chat-format function definitions."""

    api: str  # "responses" | "chat_completions"
    model: str
    instructions: str
    history: Sequence[dict[str, Any]]
    tools: Sequence[dict[str, Any]]
    # ``executor.tool_choice``: a mode (``TOOL_CHOICE_MODES``) or a tool name; None: not
    # sent. Sent only with tools, spelt per API (see :func:`tool_choice_body`).
    tool_choice: str | None = None


def tool_choice_body(api: str, choice: str | None) -> str | dict[str, Any] | None:
    """``tool_choice`` as ``api`` spells it: a mode as is, a tool name as the API's
    object naming one function (Chat nests the name under ``function``)."""
    if choice is None or choice in TOOL_CHOICE_MODES:
        return choice
    if api == "chat_completions":
        return {"type": "function", "function": {"name": choice}}
    return {"type": "function", "name": choice}


class ClientPool:
    """One SDK client per (api_key, base_url), so connections are reused across turns.

    ``http_client`` is the SDK's transport (``config.LLM_HTTP_CLIENTS``). Both keep the SDK's
    defaults for timeouts, connection limits, redirects, proxies from the environment
    and certificate checks; the SDK closes the transport with its client.
    """

    def __init__(self, *, max_retries: int, http_client: str = DEFAULT_LLM_HTTP_CLIENT) -> None:
        if http_client not in LLM_HTTP_CLIENTS:
            raise ValueError(f"http_client must be one of {', '.join(LLM_HTTP_CLIENTS)}")
        self._max_retries = max_retries
        self._http_client = http_client
        self._clients: dict[tuple[str, str | None], openai.AsyncOpenAI] = {}

    def get(self, *, api_key: str, base_url: str | None) -> openai.AsyncOpenAI:
        key = (api_key, base_url)
        client = self._clients.get(key)
        if client is None:
            transport = openai.DefaultAioHttpClient() if self._http_client == "aiohttp" else None
            client = openai.AsyncOpenAI(
                api_key=api_key,
                base_url=base_url,
                max_retries=self._max_retries,
                http_client=transport,
            )
            self._clients[key] = client
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()


async def call_model(
    client: openai.AsyncOpenAI,
    request: ModelRequest,
    on_delta: DeltaCallback,
    usage: CallUsage | None = None,
) -> ModelAnswer:
    """Stream one answer, calling ``on_delta`` per text delta; raise :class:`LLMError`.

    ``usage``, when given, is filled with what the call used as the answer streams, so
    the caller can count a call that failed part way as well as one that finished.

    The SDK has already retried what it retries (connection errors, 408/409/429/5xx)
    by the time an exception reaches us, so every failure here is final for the turn.
    A connection that breaks once the answer has begun is told apart from one that
    never opened: the server was reached, and the transport's words for the break
    (aiohttp's "TransferEncodingError: 400") read like an HTTP status.
    """
    progress = _Progress(usage=usage if usage is not None else CallUsage())
    try:
        if request.api == "chat_completions":
            return await _call_chat(client, request, on_delta, progress)
        return await _call_responses(client, request, on_delta, progress)
    except openai.APIStatusError as exc:
        raise LLMError("llm_error", _status_message(exc, request)) from exc
    except openai.APIConnectionError as exc:
        if progress.answering:
            raise LLMError("connection_error", CONNECTION_BROKE) from exc
        raise LLMError(
            "connection_error",
            f"cannot reach the LLM at {client.base_url}: {_connection_detail(exc)}",
        ) from exc
    except openai.APIError as exc:
        raise LLMError("llm_error", f"LLM error: {_detail(exc)}") from exc
    except (httpx2.TransportError, aiohttp.ClientError) as exc:
        # A break while the body streams is raised by the transport as it is (the SDK
        # wraps only what happens before the response).
        if not progress.answering:
            raise
        raise LLMError("connection_error", CONNECTION_BROKE) from exc


@dataclass
class _Progress:
    """How far a call got: ``answering`` once the response's headers said 200; what it
    used so far."""

    usage: CallUsage
    answering: bool = False


def _status_message(exc: openai.APIStatusError, request: ModelRequest) -> str:
    """The HTTP error as the turn's message; a 404 names the URL, and on the Responses
    API the likely cause: a server that only has Chat Completions (llama.cpp, vLLM…)."""
    if exc.status_code != 404:
        return f"LLM returned HTTP {exc.status_code}: {_detail(exc)}"
    url = str(exc.request.url) if exc.request is not None else "the LLM"
    message = f"LLM returned HTTP 404 for {url}: {_detail(exc)}"
    if request.api == "responses":
        message += (
            "; if the server has no Responses API, "
            "`executor.api: chat_completions` is the likely fix"
        )
    return message


def _connection_detail(exc: openai.APIConnectionError) -> str:
    """What the HTTP transport said, else the SDK's own words.

    The SDK's message is generic ("Connection error.", "Request timed out.") and, with
    the aiohttp transport, calls a refused connection a timeout; the transport's
    exception, which the SDK raises from, names the host and the reason.
    """
    said = str(exc.__cause__ or "").strip()
    return said or exc.message


def _detail(exc: openai.APIError) -> str:
    """The server's own error message when the body has one (OpenAI's ``message``, or
    FastAPI's ``detail`` as llama-cpp-python and vLLM answer an unknown path), else the
    SDK's."""
    body = exc.body
    for key in ("message", "detail"):
        if isinstance(body, dict) and isinstance(body.get(key), str):
            return str(body[key])
    return exc.message


# --- The event stream, as plain dicts --------------------------------------------------


@asynccontextmanager
async def _open_event_stream(
    create: Any, progress: _Progress, **params: Any
) -> AsyncIterator[AsyncIterator[Any]]:
    """Send one streamed request and yield its events as decoded JSON, not SDK models.

    ``create`` is a resource's ``with_streaming_response.create`` (the SDK's public
    raw-response API). Entering it sends the request exactly as the plain ``create``
    does (same retries, timeouts, auth; an HTTP error status raises its
    ``openai.APIStatusError`` subclass before any body is read), but returns the
    response unparsed. ``parse(to=openai.AsyncStream[object])`` then asks for the
    SDK's own event stream with ``object`` as the event type: the documented ``to``
    override of ``AsyncAPIResponse.parse`` accepts a stream class, and the SDK hands
    ``object`` events through as the ``json.loads`` of each ``data:`` payload. That is
    the profile's hot spot removed (``construct_type`` building a pydantic model per
    event, about 35% of the runner's CPU per turn) while everything around it stays
    the SDK's: its SSE decoder (``event:``/``data:`` lines, multi-line data, split
    UTF-8, CRLF), ``[DONE]``, an ``{"error": ...}`` payload raised as
    ``openai.APIError``, and read timeouts or transport failures mid-stream raised as
    ``APITimeoutError`` / ``APIConnectionError``. It was chosen over decoding
    ``iter_lines()`` ourselves, which would repeat all of that in this module and
    measured no better (within 0.15 ms per 20-word answer, faster for one API and
    slower for the other). The one visible difference on the wire is the SDK's
    ``X-Stainless-Raw-Response: stream`` marker header.
    ``tests/unit/test_llm_stream_parsing.py`` feeds the same bodies to the typed path
    and to this one and requires the same answers and errors.

    The readers below look only at the fields they use, with ``.get``: a well-formed
    stream reads exactly as it did through the SDK's models, and in a malformed one
    an event that is not an object is skipped and a field that is missing or of the
    wrong type reads as absent, where the models would have raised ``AttributeError``
    or ``TypeError`` out of the turn.
    """
    async with create(stream=True, **params) as response:
        progress.answering = True
        progress.usage.sent = True
        events: openai.AsyncStream[object] = await response.parse(to=openai.AsyncStream[object])
        yield events


# --- Responses API ----------------------------------------------------------------------


async def _call_responses(
    client: openai.AsyncOpenAI, request: ModelRequest, on_delta: DeltaCallback, progress: _Progress
) -> ModelAnswer:
    """Stream one Responses answer, sending the conversation and tools as ``extra_body``.

    Passed as keywords, the SDK runs them through its parameter transform
    (``async_maybe_transform`` against ``ResponseCreateParams``), which walks the whole
    conversation against its TypedDict annotations on every call: most of the runner's
    CPU per turn, growing with the history (issue 14). Ours are wire-format JSON
    already (``transcript.py``), so the transform only ever returns an equal copy.
    ``extra_body`` is the SDK's public "additional JSON properties" option: it is merged
    into the body untouched, after the transform, at the same place in the request
    build, so retries, timeouts, headers and auth stay the SDK's own.
    ``tests/unit/test_llm_wire_body.py`` guards that the bytes sent equal what the
    keyword form sends, so an SDK release whose transform changes these parameters
    fails a test instead of changing the wire silently. The answer is read as plain
    dicts (:func:`_open_event_stream`); of each event only the fields used here are
    looked at, and events of other types are ignored, as they were with the typed
    stream.
    """
    body: dict[str, Any] = {"input": to_responses_input(request.history)}
    if request.instructions:
        body["instructions"] = request.instructions
    if request.tools:
        body["tools"] = to_responses_tools(request.tools)
        if request.tool_choice is not None:
            body["tool_choice"] = tool_choice_body(request.api, request.tool_choice)
    deltas: list[str] = []
    done_items: list[Any] = []
    final_output: list[Any] | None = None
    async with _open_event_stream(
        client.responses.with_streaming_response.create,
        progress,
        model=request.model,
        extra_body=body,
    ) as events:
        async for event in events:
            if not isinstance(event, dict):
                continue
            kind = event.get("type")
            if kind == "response.output_text.delta":
                delta = event.get("delta")
                if isinstance(delta, str):
                    deltas.append(delta)
                    on_delta(delta)
            elif kind == "response.output_item.done":
                done_items.append(event.get("item"))
            elif kind in ("response.completed", "response.incomplete"):
                final = event.get("response")
                final_output = list(_field(final, "output") or [])
                progress.usage.answered_with(_field(final, "model"))
                progress.usage.read_responses(_field(final, "usage"))
            elif kind == "response.failed":
                message = _field(_field(event.get("response"), "error"), "message")
                if not isinstance(message, str):
                    message = "the response failed"
                raise LLMError("llm_error", f"LLM response failed: {message}")
            elif kind == "error":
                raise LLMError("llm_error", f"LLM stream error: {event.get('message')}")
    if final_output is None:
        # Only the end event says the answer is whole: items done before it may be
        # followed by more (llama.cpp-style servers end a failed stream cleanly).
        raise LLMError("llm_error", STREAM_ENDED_EARLY)
    return _answer_from_items(done_items or final_output, deltas)


def _field(value: Any, name: str) -> Any:
    """``value[name]`` when ``value`` is a JSON object, else ``None`` (absent or null)."""
    return value.get(name) if isinstance(value, dict) else None


def _answer_from_items(items: Sequence[Any], deltas: Sequence[str]) -> ModelAnswer:
    """Collect message text and function calls from Responses output items (JSON objects)."""
    answer = ModelAnswer()
    texts: list[str] = []
    for item in items:
        kind = _field(item, "type")
        if kind == "message":
            for part in item.get("content") or []:
                if _field(part, "type") == "output_text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
        elif kind == "function_call":
            answer.calls.append(
                FunctionCall(
                    call_id=item.get("call_id") or _new_call_id(),
                    name=item.get("name") or "",
                    arguments=item.get("arguments") or "{}",
                )
            )
    answer.text = "".join(texts) or "".join(deltas)
    return answer


# --- Chat Completions -------------------------------------------------------------------


async def _call_chat(
    client: openai.AsyncOpenAI, request: ModelRequest, on_delta: DeltaCallback, progress: _Progress
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
    types) and to track those SDK internals across releases. The chunks are read as
    plain dicts (:func:`_open_event_stream`); tool calls are assembled by their
    ``index``, as they arrive in pieces.
    """
    body: dict[str, Any] = {"messages": to_chat_messages(request.instructions, request.history)}
    if request.tools:
        body["tools"] = list(request.tools)
        if request.tool_choice is not None:
            body["tool_choice"] = tool_choice_body(request.api, request.tool_choice)
    texts: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finished = False
    chunk_count = 0
    async with _open_event_stream(
        client.chat.completions.with_streaming_response.create,
        progress,
        model=request.model,
        messages=[],
        stream_options={"include_usage": True},
        extra_body=body,
    ) as chunks:
        async for chunk in chunks:
            chunk_count += 1
            if isinstance(chunk, dict):
                progress.usage.answered_with(chunk.get("model"))
                if chunk.get("usage") is not None:
                    progress.usage.read_chat(chunk.get("usage"))
            for choice in _field(chunk, "choices") or []:
                finished = finished or bool(_field(choice, "finish_reason"))
                delta = _field(choice, "delta")
                if not isinstance(delta, dict):
                    continue
                content = delta.get("content")
                if content and isinstance(content, str):
                    texts.append(content)
                    on_delta(content)
                for part in delta.get("tool_calls") or []:
                    if not isinstance(part, dict):
                        continue
                    call = calls.setdefault(
                        part.get("index") or 0, {"id": "", "name": "", "arguments": ""}
                    )
                    if part.get("id"):
                        call["id"] = part["id"]
                    function = part.get("function")
                    if isinstance(function, dict):
                        # The name comes whole (first chunk); some servers repeat it.
                        call["name"] = call["name"] or function.get("name") or ""
                        call["arguments"] += function.get("arguments") or ""
    if not finished:
        if chunk_count:
            raise LLMError("llm_error", STREAM_ENDED_EARLY)
        raise LLMError("llm_error", await _empty_stream_message(client, request, body))
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


async def _empty_stream_message(
    client: openai.AsyncOpenAI, request: ModelRequest, body: dict[str, Any]
) -> str:
    """Why a Chat stream ended with no data at all, as far as the server says.

    llama-cpp-python reports errors raised after its stream began (a prompt beyond the
    context window, a template error) as a clean, empty 200 stream, while the same
    request without streaming gets the proper 4xx. So the request is sent once more,
    unstreamed and capped at one token, only to read that error; its answer, if any,
    is not used (the turn fails either way).
    """
    try:
        # With the client's retries: the server may close the connection the empty
        # stream came on, and a 4xx is never retried.
        await client.chat.completions.create(
            model=request.model, messages=[], extra_body={**body, "max_tokens": 1}
        )
    except openai.APIStatusError as exc:
        return f"{STREAM_ENDED_EARLY}; without streaming, {_status_message(exc, request)}"
    except openai.APIError as exc:
        logger.info("an empty Chat stream; asking without streaming failed too: %r", exc)
    return STREAM_ENDED_EARLY


def _new_call_id() -> str:
    """For servers that omit call ids: the loop needs one to pair a call with its output."""
    return "call_" + uuid.uuid4().hex
