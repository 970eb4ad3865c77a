"""The openai SDK's two HTTP transports (``OMNIGENT_RUNNER_LLM_HTTP_CLIENT``) read the
same answers and fail the same way.

The runner sends its model calls through aiohttp by default (the SDK's
``DefaultAioHttpClient``) because it costs less CPU per streamed token than the SDK's
default httpx transport (issue 14). Each case here runs against the project's mock LLM
over real sockets, once per transport: streamed text and tool calls in both API
flavours, an HTTP error, a refused connection, a call cancelled mid-way (the pool must
still serve the next one), and the choice itself.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from omnigent_runner.llm import ClientPool, LLMError, ModelAnswer, ModelRequest, call_model
from testing.mockllm import MockLLMServer

pytestmark = pytest.mark.timeout(60)

TRANSPORTS = ("aiohttp", "httpx")
TEXT = "Twenty words would be more than we need here, so this reply has eleven."
HISTORY: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}
]
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_ticket",
        "description": "Find a ticket.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
    },
}


@pytest.fixture
async def pools() -> AsyncIterator[dict[str, ClientPool]]:
    made = {name: ClientPool(max_retries=0, http_client=name) for name in TRANSPORTS}
    try:
        yield made
    finally:
        for pool in made.values():
            await pool.aclose()


def request(api: str) -> ModelRequest:
    return ModelRequest(
        api=api, model="mock-model", instructions="Be brief.", history=HISTORY, tools=[TOOL]
    )


async def answer(
    pool: ClientPool, base_url: str, api: str
) -> tuple[ModelAnswer | None, list[str], tuple[str, str] | None]:
    client = pool.get(api_key="sk-transport", base_url=base_url)
    deltas: list[str] = []
    try:
        return await call_model(client, request(api), deltas.append), deltas, None
    except LLMError as exc:
        return None, deltas, (exc.code, exc.message)


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_both_transports_read_the_same_streamed_text_and_calls(
    api: str, mock_llm: MockLLMServer, pools: dict[str, ClientPool]
) -> None:
    outcomes = {}
    for name, pool in pools.items():
        mock_llm.configure(
            [
                {"text": TEXT, "stream": True},
                {"tool_calls": [{"name": "lookup_ticket", "arguments": '{"id": "T-1"}'}]},
            ]
        )
        text_answer, deltas, error = await answer(pool, mock_llm.base_url, api)
        assert error is None, error
        assert text_answer is not None and text_answer.text == TEXT
        assert len(deltas) > 1 and "".join(deltas) == TEXT
        call_answer, _deltas, error = await answer(pool, mock_llm.base_url, api)
        assert error is None, error
        assert call_answer is not None
        assert [(c.name, c.arguments) for c in call_answer.calls] == [
            ("lookup_ticket", '{"id": "T-1"}')
        ]
        outcomes[name] = (text_answer, deltas, [(c.name, c.arguments) for c in call_answer.calls])
    assert outcomes["aiohttp"] == outcomes["httpx"]


async def test_an_http_error_is_the_same_llm_error(
    mock_llm: MockLLMServer, pools: dict[str, ClientPool]
) -> None:
    errors = {}
    for name, pool in pools.items():
        mock_llm.configure([{"error": {"status_code": 400, "message": "No such model ✗"}}])
        _answer, _deltas, errors[name] = await answer(pool, mock_llm.base_url, "responses")
    assert (
        errors["aiohttp"]
        == errors["httpx"]
        == ("llm_error", "LLM returned HTTP 400: No such model ✗")
    )


async def test_a_refused_connection_is_a_connection_error_that_names_the_cause(
    pools: dict[str, ClientPool],
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}/v1"
    for name, pool in pools.items():
        _answer, _deltas, error = await answer(pool, base_url, "responses")
        assert error is not None, name
        code, message = error
        assert code == "connection_error", (name, error)
        assert message.startswith(f"cannot reach the LLM at {base_url}/: "), (name, message)
        # The SDK calls a refused aiohttp connection "Request timed out."; the message
        # says what the transport saw instead.
        assert "timed out" not in message, (name, message)
        assert ("Cannot connect to host" if name == "aiohttp" else "connection") in message


async def test_a_cancelled_call_leaves_the_pool_usable(pools: dict[str, ClientPool]) -> None:
    loop = asyncio.get_running_loop()
    asked = asyncio.Event()

    def picked(_what: str) -> None:
        # The mock tells (from its own thread) when it picked a reply, before its delay.
        loop.call_soon_threadsafe(asked.set)

    with MockLLMServer(announce=picked) as mock:
        for name, pool in pools.items():
            mock.configure([{"text": "too late", "delay_s": 2}, {"text": TEXT, "stream": True}])
            asked.clear()
            slow = asyncio.create_task(answer(pool, mock.base_url, "responses"))
            await asyncio.wait_for(asked.wait(), 10)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            next_answer, deltas, error = await asyncio.wait_for(
                answer(pool, mock.base_url, "responses"), 10
            )
            assert error is None, (name, error)
            assert next_answer is not None and next_answer.text == TEXT, name
            assert "".join(deltas) == TEXT


async def test_the_pool_uses_the_sdks_aiohttp_client_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Any] = []

    class Spy(openai.DefaultAioHttpClient):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            made.append(self)

    monkeypatch.setattr(openai, "DefaultAioHttpClient", Spy)
    default = ClientPool(max_retries=0)
    httpx_pool = ClientPool(max_retries=0, http_client="httpx")
    try:
        first = default.get(api_key="k", base_url="http://127.0.0.1:9/v1")
        assert default.get(api_key="k", base_url="http://127.0.0.1:9/v1") is first
        assert len(made) == 1
        httpx_pool.get(api_key="k", base_url="http://127.0.0.1:9/v1")
        assert len(made) == 1  # the httpx pool leaves the SDK its own client
    finally:
        await default.aclose()
        await httpx_pool.aclose()
    assert made[0].is_closed


def test_an_unknown_transport_is_refused() -> None:
    with pytest.raises(ValueError, match="aiohttp, httpx"):
        ClientPool(max_retries=0, http_client="curl")


@pytest.mark.parametrize("chosen", TRANSPORTS)
def test_the_configured_transport_reaches_the_executors_pool(
    chosen: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from omnigent_runner import agent
    from omnigent_runner.__main__ import build_executor
    from omnigent_runner.config import RunnerConfig

    pools: list[ClientPool] = []

    class RecordingPool(ClientPool):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            pools.append(self)
            self.http_client = kwargs["http_client"]

    monkeypatch.setattr(agent, "ClientPool", RecordingPool)
    config = RunnerConfig(
        server_url="http://127.0.0.1:8000",
        token="t",
        runner_id="runner_token_x",
        workspace=tmp_path,
        llm_http_client=chosen,
    )
    build_executor(config)
    assert [getattr(pool, "http_client", None) for pool in pools] == [chosen]


async def test_both_transports_go_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bytes] = []
    arrived = asyncio.Event()

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readline())
        arrived.set()
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    try:
        for transport in TRANSPORTS:
            pool = ClientPool(max_retries=0, http_client=transport)
            seen.clear()
            arrived.clear()
            try:
                _answer, _deltas, error = await answer(pool, "http://llm.invalid/v1", "responses")
            finally:
                await pool.aclose()
            await asyncio.wait_for(arrived.wait(), 10)
            assert seen == [b"POST http://llm.invalid/v1/responses HTTP/1.1\r\n"], transport
            assert error == ("llm_error", "LLM returned HTTP 502: Error code: 502"), transport
    finally:
        server.close()
        await server.wait_closed()
