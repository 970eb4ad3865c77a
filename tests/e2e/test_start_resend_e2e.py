"""A ``turn.start`` lost while the tunnel stays up (issue 42): real daphne, the real
runner program behind a proxy that drops one command frame on its way to the runner,
the mock LLM. The server's sweep sends it again and the turn completes, on the same
tunnel and once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from testing.frame_drop_proxy import FrameDropProxy
from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    bind,
    create_session,
    send_message,
    wait_turn,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_lost_turn_start_is_sent_again_and_the_turn_completes_on_the_same_tunnel(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    # Sent again 6 s (2 x the relay deadline) after it went out, looked for every 0.5 s.
    server = launch_server(OMNIGENT_START_RESEND_S="0.5", OMNIGENT_RELAY_TIMEOUT_S="3")
    proxy = FrameDropProxy(int(server.url.rsplit(":", 1)[1])).start()
    try:
        runner = launch_runner(server, via_url=proxy.url, env={"OMNIGENT_RUNNER_MAX_TURNS": "1"})
        mock_llm.configure([{"text": "slow answer", "delay_s": 1.0}], match="slow")
        first, second = [create_session(server, make_bundle()) for _ in range(2)]
        for session_id in (first, second):
            bind(server, session_id, runner.runner_id)

        response = send_message(server, first, "slow please")
        assert response.status_code == 202, response.text
        running = response.json()["response_id"]
        wait_until(lambda: mock_llm.requests, deadline_s=30, what="the first turn at the LLM")
        # Over the runner's one slot: waits in the server's queue, started (fire and
        # forget) when the first ends. That turn.start never reaches the runner.
        response = send_message(server, second, "quick please")
        assert response.status_code == 202, response.text
        waiting = response.json()["response_id"]
        proxy.drop_next(
            lambda frame: frame.get("type") == "turn.start" and frame["response_id"] == waiting
        )

        assert wait_turn(server, first, running)["status"] == "completed"
        assert wait_turn(server, second, waiting, deadline_s=60)["status"] == "completed"
        assert [frame["response_id"] for frame in proxy.dropped] == [waiting]
        assert proxy.tunnels == 1  # no reconnect: the sweep sent it, not a hello
        assert len(mock_llm.requests) == 2  # each turn ran once
        assert "sent again 1 turn.start" in server.process.log()
    finally:
        proxy.stop()
