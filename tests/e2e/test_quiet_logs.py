"""What a server and a runner log at the default level (INFO): where to go, and no
routine lines (the runtime's report, daphne's own start line, answered health checks,
one line per LLM call); all of those come back at DEBUG."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, bind, create_session, send_message, wait_turn

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_at_info_the_logs_say_where_to_go_and_nothing_routine(
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    mock_llm.configure([{"text": "Hello."}])
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    response = send_message(server, session_id, "Say hello")
    assert response.status_code == 202, response.text
    turn = wait_turn(server, session_id, response.json()["response_id"], deadline_s=60)
    assert turn["status"] == "completed", turn
    assert mock_llm.requests, "the runner never called the LLM"
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200

    log = server.process.log()
    assert (
        f"INFO omnigent_site.runtime.server: Omnigent on {server.url}/ (web page), API at /v1/"
        in log
    )
    assert "server runtime:" not in log
    assert "Starting server at" not in log
    assert '"GET /health"' not in log  # start_server's health checks and the one above
    assert '"POST /v1/sessions"' in log  # the access log itself is still there

    runner_log = runner.process.log()  # type: ignore[union-attr]
    assert "tunnel up for runner" in runner_log
    assert "HTTP Request:" not in runner_log, runner_log[-2000:]
