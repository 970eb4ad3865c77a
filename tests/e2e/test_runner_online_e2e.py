"""A runner reads online only while its tunnel is connected (tunnel.md, Liveness).

Right after the server process restarts, the runner is still backing off: until it has
dialled in again it must read offline, and a message to it must get 503 at once rather
than after the relay's 10 s deadline. The runner program is held stopped (SIGSTOP)
across the restart, so "before it reconnects" is certain; then it is let go and must
read online again and take a turn.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    bind,
    create_session,
    restart_on_same_port,
    send_message,
    wait_runner_online,
    wait_turn,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# Well under the relay deadline (OMNIGENT_RELAY_TIMEOUT_S, 10 s).
QUICK_S = 3.0


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "crashed"])
def test_after_a_server_restart_the_runner_is_offline_until_it_reconnects(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    make_bundle: Callable[..., bytes],
    mock_llm: MockLLMServer,
    tmp_path: Path,
    stop: signal.Signals,
) -> None:
    # A message waits this long for a runner that dropped moments ago (the restart).
    server = launch_server(OMNIGENT_RUNNER_RECONNECT_WAIT_S="0.5")
    runner = launch_runner(server)
    assert runner.process is not None
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    status_path = f"/v1/runners/{runner.runner_id}/status"

    os.kill(runner.process.popen.pid, signal.SIGSTOP)  # it cannot dial in until SIGCONT
    try:
        restarted = restart_on_same_port(server, tmp_path, "daphne-restarted", sig=stop)
    except BaseException:
        os.kill(runner.process.popen.pid, signal.SIGCONT)
        raise
    try:
        try:
            with restarted.client() as client:
                assert client.get(status_path).json() == {
                    "runner_id": runner.runner_id,
                    "online": False,
                }
                (listed,) = client.get("/v1/runners").json()["data"]
                assert listed["online"] is False
                snapshot = client.get(f"/v1/sessions/{session_id}").json()
                assert snapshot["runner_online"] is False
            started = time.monotonic()
            response = send_message(restarted, session_id, "anyone there?")
            elapsed = time.monotonic() - started
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "runner_unavailable"
            assert elapsed < QUICK_S, f"503 after {elapsed:.1f} s"
        finally:
            os.kill(runner.process.popen.pid, signal.SIGCONT)

        wait_runner_online(restarted, runner.runner_id, process=runner.process)
        mock_llm.configure([{"text": "back again"}])
        response = send_message(restarted, session_id, "and now?")
        assert response.status_code == 202, response.text
        turn = wait_turn(restarted, session_id, response.json()["response_id"])
        assert turn["status"] == "completed", turn
    finally:
        restarted.process.stop()
