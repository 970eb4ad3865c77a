"""Usage end to end (docs/usage.md): real daphne, the real runner program and the mock
LLM reporting usage on both APIs. Every call's tokens arrive, the totals match them to
the token, and the cost is the price file's."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    bind,
    create_session,
    send_message,
    wait_turn,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

OS_ENV = "os_env:\n  type: caller_process\n  cwd: .\n"
APIS = {"responses": "  api: responses\n", "chat_completions": "  api: chat_completions\n"}
WRITE_NOTE = {
    "call_id": "call_note",
    "name": "sys_os_write",
    "arguments": json.dumps({"path": "note.txt", "content": "noted\n"}),
}
# Provider counts (cached tokens are part of input_tokens, as providers report them).
FIRST = {"input_tokens": 1000, "cached_tokens": 400, "output_tokens": 50}
SECOND = {"input_tokens": 1500, "cached_tokens": 1000, "output_tokens": 100, "reasoning_tokens": 20}
# The conftest's PRICES: (600 × 1 + 400 × 0.5 + 50 × 2) + (500 × 1 + 1000 × 0.5 + 100 × 2) micro-dollars.
COST_USD = (900 + 1200) / 1e6


def get(server: Server, path: str) -> Any:
    with server.client("alice@example.com") as client:
        response = client.get(path)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("api", list(APIS))
def test_each_call_is_counted_and_priced(
    priced_server: Server,
    priced_runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    api: str,
) -> None:
    server = priced_server
    mock_llm.configure(
        [{"tool_calls": [WRITE_NOTE], "usage": FIRST}, {"text": "Written.", "usage": SECOND}]
    )
    session_id = create_session(server, make_bundle(extra=APIS[api] + OS_ENV))
    bind(server, session_id, priced_runner.runner_id)
    sent = send_message(server, session_id, "write a note")
    assert sent.status_code == 202, sent.text
    turn = wait_turn(server, session_id, sent.json()["response_id"])
    assert turn["status"] == "completed", turn

    assert turn["usage"] == {
        "model": "mock-model",
        "llm_calls": 2,
        "input_tokens": 600 + 500,
        "output_tokens": 150,
        "total_tokens": 1100 + 1400 + 150,
        "cache_read_input_tokens": 1400,
        "cache_creation_input_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 20},
        "cost_usd": COST_USD,
    }
    snapshot = get(server, f"/v1/sessions/{session_id}")
    assert snapshot["total_cost_usd"] == COST_USD
    assert snapshot["usage"]["total_cost_usd"] == COST_USD
    assert snapshot["usage"]["by_model"]["mock-model"]["input_tokens"] == 1100
    assert snapshot["usage"]["by_model"]["mock-model"]["llm_calls"] == 2
    by_model = get(server, "/v1/usage?group_by=model")["data"]
    assert by_model == [
        {
            "key": "mock-model",
            "input_tokens": 1100,
            "output_tokens": 150,
            "total_tokens": 2650,
            "cost_usd": COST_USD,
        }
    ]
    report = get(server, "/v1/usage")
    assert report["cost_today"] == COST_USD
    assert [row["id"] for row in report["sessions"]] == [session_id]


@pytest.mark.parametrize("api", list(APIS))
def test_a_provider_without_usage_counts_calls_only(
    priced_server: Server,
    priced_runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    api: str,
) -> None:
    server = priced_server
    mock_llm.set_quirks(no_usage=True)
    mock_llm.configure([{"text": "Hello."}])
    session_id = create_session(server, make_bundle(extra=APIS[api]))
    bind(server, session_id, priced_runner.runner_id)
    sent = send_message(server, session_id, "hi")
    turn = wait_turn(server, session_id, sent.json()["response_id"])
    assert turn["status"] == "completed", turn
    assert turn["usage"] == {"model": "mock-model", "llm_calls": 1}
    snapshot = get(server, f"/v1/sessions/{session_id}")
    assert snapshot["total_cost_usd"] is None
    assert "total_cost_usd" not in snapshot["usage"]
