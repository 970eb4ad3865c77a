"""Micro benchmark: the runner's CPU cost of one model call, without network or server.

``omnigent_runner.llm.call_model`` is timed against an in-memory HTTP transport that
answers with the mock LLM's own event stream (``testing.mockllm``), a ``--words``-word
text streamed one word per delta, for a conversation of ``--items`` history items
(user and assistant messages, function calls with file-sized outputs) and the
runner's built-in tools, in both API flavours. Each distinct answer is encoded once
and replayed, so the mock's own JSON work is not timed. What is left is the client
side of a call: building and encoding the request, and parsing the streamed answer —
the first grows with the history, the second with the answer (issue 14).

For comparison it also times, on the same parameters and answer, the two SDK steps
``llm.py`` skips: the per-request parameter transform (``async_maybe_transform``,
avoided by sending the parameters as ``extra_body``) and the typed event stream
(the same request through the plain ``create``, every event built as the SDK's
pydantic model, avoided by reading the events as plain dicts).

Run: ``.venv/bin/python -m bench.runner_llm [--items 40] [--calls 200] [--words 20]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import httpx2  # the SDK's own HTTP library
import openai
from openai._utils import async_maybe_transform
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params

from bench._stats import fmt, summary_ms
from omnigent_runner.llm import ModelRequest, call_model
from omnigent_runner.tools import sys_os
from omnigent_runner.transcript import (
    to_chat_messages,
    to_responses_input,
    to_responses_tools,
)
from testing.mockllm import ChatTurn, Reply, ResponsesTurn

INSTRUCTIONS = "You are a careful coding agent. Read before you write; keep answers short."


def history(items: int) -> list[dict[str, Any]]:
    """A coding-agent conversation: per round a user ask, a call, its output, an answer."""
    file_text = "".join(f"line {n}: value = compute({n}, flag=True)\n" for n in range(40))
    result: list[dict[str, Any]] = []
    n = 0
    while len(result) < items:
        call_id = f"call_{n}"
        result += [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"Please look at module_{n}.py."}],
            },
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "sys_os_read",
                "arguments": json.dumps({"path": f"module_{n}.py"}),
            },
            {"type": "function_call_output", "call_id": call_id, "output": file_text},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"module_{n}.py computes values."}],
            },
        ]
        n += 1
    return result[:items]


def answer_text(words: int) -> str:
    """``words`` words of an answer, the first ones a plausible sentence."""
    base = "Done: the modules compute values and the tests cover every branch of them.".split()
    return " ".join(base[n] if n < len(base) else f"word{n}" for n in range(words))


def transport(words: int) -> httpx2.MockTransport:
    """Answers every model call with a ``words``-word text streamed word by word."""
    reply = Reply(text=answer_text(words), stream_words=True)
    encoded: dict[tuple[str, bytes], bytes] = {}

    def encode(request: httpx2.Request) -> bytes:
        body = json.loads(request.content)
        if request.url.path.endswith("/responses"):
            frames = [
                f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': i})}\n\n"
                for i, event in enumerate(ResponsesTurn(reply=reply, request=body).events())
            ]
        else:
            frames = [
                f"data: {json.dumps(chunk)}\n\n"
                for chunk in ChatTurn(reply=reply, request=body).chunks()
            ]
            frames.append("data: [DONE]\n\n")
        return "".join(frames).encode()

    def handle(request: httpx2.Request) -> httpx2.Response:
        key = (request.url.path, request.content)
        content = encoded.get(key)
        if content is None:
            content = encoded[key] = encode(request)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=content)

    return httpx2.MockTransport(handle)


async def time_calls(client: openai.AsyncOpenAI, request: ModelRequest, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        answer = await call_model(client, request, lambda _delta: None)
        samples.append(time.perf_counter() - started)
        assert answer.text, "the mock answered no text"
    return samples


async def time_typed_stream(
    client: openai.AsyncOpenAI, request: ModelRequest, calls: int
) -> list[float]:
    """The same request and answer through the SDK's typed event stream (plain ``create``)."""
    if request.api == "chat_completions":
        body: dict[str, Any] = {
            "messages": to_chat_messages(request.instructions, request.history),
            "tools": list(request.tools),
        }
    else:
        body = {
            "input": to_responses_input(request.history),
            "instructions": request.instructions,
            "tools": to_responses_tools(request.tools),
        }
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        stream: Any
        if request.api == "chat_completions":
            stream = await client.chat.completions.create(
                model=request.model, messages=[], stream=True, extra_body=body
            )
        else:
            stream = await client.responses.create(
                model=request.model, stream=True, extra_body=body
            )
        async with stream:
            async for _event in stream:
                pass
        samples.append(time.perf_counter() - started)
    return samples


async def time_transform(request: ModelRequest, calls: int) -> list[float]:
    """The SDK's parameter transform alone, on the parameters ``call_model`` sends."""
    if request.api == "chat_completions":
        params: dict[str, Any] = {
            "model": request.model,
            "stream": True,
            "messages": to_chat_messages(request.instructions, request.history),
            "tools": list(request.tools),
        }
        annotation: Any = completion_create_params.CompletionCreateParamsStreaming
    else:
        params = {
            "model": request.model,
            "stream": True,
            "input": to_responses_input(request.history),
            "instructions": request.instructions,
            "tools": to_responses_tools(request.tools),
        }
        annotation = response_create_params.ResponseCreateParamsStreaming
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await async_maybe_transform(params, annotation)
        samples.append(time.perf_counter() - started)
    return samples


async def run(items: int, calls: int, words: int) -> dict[str, Any]:
    client = openai.AsyncOpenAI(
        api_key="bench",
        base_url="http://mock.invalid/v1",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=transport(words)),
    )
    results: dict[str, Any] = {"items": items, "calls": calls, "words": words}
    try:
        for api in ("responses", "chat_completions"):
            request = ModelRequest(
                api=api,
                model="mock-model",
                instructions=INSTRUCTIONS,
                history=history(items),
                tools=sys_os.tool_definitions(),
            )
            await time_calls(client, request, 10)  # warm-up: imports, connection, caches
            call_stats = summary_ms(await time_calls(client, request, calls))
            await time_typed_stream(client, request, 10)
            typed_stats = summary_ms(await time_typed_stream(client, request, calls))
            transform_stats = summary_ms(await time_transform(request, calls))
            print(f"{api:17} call_model            {fmt(call_stats)}")
            print(f"{api:17} SDK typed stream      {fmt(typed_stats)}")
            print(f"{api:17} SDK transform (alone) {fmt(transform_stats)}")
            results[api] = {
                "call_model": call_stats,
                "sdk_typed_stream": typed_stats,
                "sdk_transform": transform_stats,
            }
    finally:
        await client.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=40, help="history items per call")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per API")
    parser.add_argument("--words", type=int, default=20, help="words in the streamed answer")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.items, args.calls, args.words))))


if __name__ == "__main__":
    main()
