"""Guard for issue 14: ``call_model`` sends the bytes the SDK's keyword form would send.

``omnigent_runner.llm`` hands the conversation and the tools to the SDK as
``extra_body``, so the SDK does not run its per-request parameter transform over them.
That is only right while the transform would leave these parameters as they are. Each
test here sends a representative request twice through an in-memory transport: once
the documented way (every parameter a keyword, so transformed) and once through
``call_model``, and requires the two HTTP bodies to be byte for byte the same. A future
SDK whose transform renames, re-encodes or drops something in them fails here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest
from openai._utils import async_maybe_transform
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params

from omnigent_runner.llm import ModelRequest, call_model
from omnigent_runner.tools import sys_os
from omnigent_runner.transcript import (
    to_chat_messages,
    to_responses_input,
    to_responses_tools,
)
from testing.mockllm import ChatTurn, Reply, ResponsesTurn

MODEL = "gpt-test"
API_KEY = "sk-wire-body"
ANSWER = "Read all three."
INSTRUCTIONS = "You are a careful agent. Réponds brièvement. ✓"


def _data_uri(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


# A turn's history as the runner holds it: user text (non-ASCII too), a user message
# with a text file, a PDF and an image, an assistant answer, and a function call with
# its output (one output a string, one a JSON object, one an MCP tool's with an image).
HISTORY: list[dict[str, Any]] = [
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Hello — can you read these? 日本語"}],
    },
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "Here are the files."},
            {
                "type": "input_file",
                "filename": "notes.txt",
                "file_data": _data_uri("text/plain", "line one\nligne deux é\n".encode()),
            },
            {
                "type": "input_file",
                "filename": "report.pdf",
                "file_data": _data_uri("application/pdf", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n"),
            },
            {
                "type": "input_image",
                "filename": "pixel.png",
                "image_url": _data_uri("image/png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"),
            },
        ],
    },
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "I will list the workspace first."}],
    },
    {
        "type": "function_call",
        "call_id": "call_list",
        "name": "sys_os_list",
        "arguments": json.dumps({"path": "."}),
    },
    {"type": "function_call_output", "call_id": "call_list", "output": "notes.txt\nreport.pdf"},
    {
        "type": "function_call",
        "call_id": "call_client",
        "name": "lookup_ticket",
        "arguments": '{"id": 42, "tags": ["a", "b"]}',
    },
    {
        "type": "function_call_output",
        "call_id": "call_client",
        "output": {"status": "open", "owner": None, "score": 0.5},
    },
    {
        "type": "function_call",
        "call_id": "call_mcp",
        "name": "t__image",
        "arguments": "{}",
    },
    {  # an MCP tool's image output: content parts (Responses), a user message (Chat)
        "type": "function_call_output",
        "call_id": "call_mcp",
        "output": "a pixel\n[image: image/png, 13 bytes]",
        "images": [
            {
                "type": "input_image",
                "image_url": _data_uri("image/png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rI"),
            }
        ],
    },
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Thanks, now summarise."}],
    },
]

CLIENT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup_ticket",
        "description": "Look a ticket up by id.",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "tags": {"type": "array"}},
            "required": ["id"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


def _answer(request: httpx2.Request) -> httpx2.Response:
    """The mock LLM's own streamed answer (``testing.mockllm``) for either API."""
    body = json.loads(request.content)
    reply = Reply(text=ANSWER)
    if request.url.path.endswith("/responses"):
        events = ResponsesTurn(reply=reply, request=body).events()
        frames = [
            f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': n})}\n\n"
            for n, event in enumerate(events)
        ]
    else:
        chunks = ChatTurn(reply=reply, request=body).chunks()
        frames = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content="".join(frames).encode()
    )


class _Capture:
    """An in-memory transport that keeps every request the SDK sends."""

    def __init__(self) -> None:
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        return _answer(request)


@pytest.fixture
async def wire() -> AsyncIterator[tuple[openai.AsyncOpenAI, _Capture]]:
    capture = _Capture()
    client = openai.AsyncOpenAI(
        api_key=API_KEY,
        base_url="http://llm.invalid/v1",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(capture)),
    )
    yield client, capture
    await client.close()


def _request(api: str, *, full: bool) -> ModelRequest:
    return ModelRequest(
        api=api,
        model=MODEL,
        instructions=INSTRUCTIONS if full else "",
        history=HISTORY if full else HISTORY[:1],
        tools=[*sys_os.tool_definitions(), CLIENT_TOOL] if full else [],
    )


def _keyword_params(request: ModelRequest) -> dict[str, Any]:
    """The parameters ``llm.py`` used to pass as keywords (the SDK's transform path)."""
    if request.api == "chat_completions":
        params: dict[str, Any] = {
            "messages": to_chat_messages(request.instructions, request.history),
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            params["tools"] = list(request.tools)
        return params
    params = {"input": to_responses_input(request.history)}
    if request.instructions:
        params["instructions"] = request.instructions
    if request.tools:
        params["tools"] = to_responses_tools(request.tools)
    return params


async def _send_with_keywords(client: openai.AsyncOpenAI, request: ModelRequest) -> None:
    params = _keyword_params(request)
    stream: Any
    if request.api == "chat_completions":
        stream = await client.chat.completions.create(model=request.model, stream=True, **params)
    else:
        stream = await client.responses.create(model=request.model, stream=True, **params)
    async with stream:
        async for _event in stream:
            pass


@pytest.mark.parametrize("full", [True, False], ids=["full", "minimal"])
@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_call_model_sends_the_transformed_body(
    wire: tuple[openai.AsyncOpenAI, _Capture], api: str, full: bool
) -> None:
    client, capture = wire
    request = _request(api, full=full)

    await _send_with_keywords(client, request)
    deltas: list[str] = []
    answer = await call_model(client, request, deltas.append)

    expected, sent = capture.requests
    assert sent.url == expected.url
    assert sent.content == expected.content
    assert sent.headers["authorization"] == expected.headers["authorization"]
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.headers["content-type"] == "application/json"
    # The typed stream is still parsed: the answer and its deltas came through.
    assert answer.text == ANSWER
    assert "".join(deltas) == ANSWER
    assert answer.calls == []


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_the_sdk_transform_leaves_our_parameters_as_they_are(api: str) -> None:
    """The same guard stated directly: the transform is the identity on our parameters."""
    request = _request(api, full=True)
    params = {"model": MODEL, "stream": True, **_keyword_params(request)}
    annotation: Any = (
        completion_create_params.CompletionCreateParamsStreaming
        if api == "chat_completions"
        else response_create_params.ResponseCreateParamsStreaming
    )
    transformed = await async_maybe_transform(params, annotation)
    assert json.dumps(transformed) == json.dumps(params)
    assert transformed == params
