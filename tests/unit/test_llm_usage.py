"""What one model call used, as ``call_model`` reads it from either API (usage.md).

The answers are the mock LLM's own streams (``testing.mockllm``) served through an
in-memory transport, so the SDK's SSE decoding runs as it does against a real server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import openai
import pytest

from omnigent_runner.llm import CallUsage, ModelRequest, call_model
from testing.mockllm import ChatTurn, Reply, ResponsesTurn

SCRIPTED = {
    "input_tokens": 1200,
    "output_tokens": 80,
    "cached_tokens": 1000,
    "reasoning_tokens": 30,
}


def _streamed(reply: Reply, *, report_usage: bool = True) -> Callable[[httpx2.Request], Any]:
    def answer(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/responses"):
            turn = ResponsesTurn(reply=reply, request=body, report_usage=report_usage)
            frames = [
                f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in turn.events()
            ]
        else:
            chat = ChatTurn(reply=reply, request=body, report_usage=report_usage)
            frames = [f"data: {json.dumps(chunk)}\n\n" for chunk in chat.chunks()]
            frames.append("data: [DONE]\n\n")
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content="".join(frames).encode()
        )

    return answer


@pytest.fixture
def client_for() -> AsyncIterator[Callable[..., openai.AsyncOpenAI]]:
    clients: list[openai.AsyncOpenAI] = []

    def make(handler: Callable[[httpx2.Request], Any]) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(
            api_key="sk-usage",
            base_url="http://llm.invalid/v1",
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
        )
        clients.append(client)
        return client

    yield make  # type: ignore[misc]


def _request(api: str) -> ModelRequest:
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ]
    return ModelRequest(api=api, model="gpt-4o-mini", instructions="", history=history, tools=[])


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_reported_usage_is_read_with_the_cached_part_apart(
    client_for: Callable[..., openai.AsyncOpenAI], api: str
) -> None:
    client = client_for(_streamed(Reply(text="Hello.", usage=tuple(SCRIPTED.items()))))
    usage = CallUsage()
    answer = await call_model(client, _request(api), lambda _d: None, usage)
    await client.close()
    assert answer.text == "Hello."
    assert usage.reported and usage.sent
    assert usage.model == "gpt-4o-mini"
    assert usage.input_tokens == 200  # 1200 sent, 1000 of them cached
    assert usage.cache_read_input_tokens == 1000
    assert usage.output_tokens == 80
    assert usage.reasoning_tokens == 30
    assert usage.cache_creation_input_tokens == 0


async def test_chat_asks_for_the_usage_chunk(client_for: Callable[..., openai.AsyncOpenAI]) -> None:
    sent: list[dict[str, Any]] = []
    answer = _streamed(Reply(text="Hi."))

    def capture(request: httpx2.Request) -> httpx2.Response:
        sent.append(json.loads(request.content))
        return answer(request)

    client = client_for(capture)
    await call_model(client, _request("chat_completions"), lambda _d: None, CallUsage())
    await client.close()
    assert sent[0]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_a_provider_that_reports_nothing_leaves_the_call_unreported(
    client_for: Callable[..., openai.AsyncOpenAI], api: str
) -> None:
    client = client_for(_streamed(Reply(text="Hello."), report_usage=False))
    usage = CallUsage()
    await call_model(client, _request(api), lambda _d: None, usage)
    await client.close()
    assert usage.sent
    assert not usage.reported
    assert (usage.input_tokens, usage.output_tokens) == (0, 0)


async def test_an_error_status_is_not_a_call_that_was_answered(
    client_for: Callable[..., openai.AsyncOpenAI],
) -> None:
    client = client_for(lambda _r: httpx2.Response(400, json={"error": {"message": "no"}}))
    usage = CallUsage()
    with pytest.raises(Exception, match="400"):
        await call_model(client, _request("responses"), lambda _d: None, usage)
    await client.close()
    assert not usage.sent


def test_odd_counts_read_as_zero() -> None:
    usage = CallUsage()
    usage.read_chat({"prompt_tokens": "12", "completion_tokens": -3, "prompt_tokens_details": None})
    assert usage.reported
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens) == (0, 0, 0)
