"""A server process that dies holding a tunnel: another process fails the runner's turn.

The second process holds no tunnel at all, so only its process-wide sweep
(``runners/upkeep.py``, started in every server process) can notice.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, wait_turn
from tests.e2e.conftest import orphan_a_turn

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# Stale after 3 × heartbeat + 5 s of silence, plus the grace: about 9 s here.
FAST = {"OMNIGENT_HEARTBEAT_S": "1", "OMNIGENT_RECONNECT_GRACE_S": "1"}


def test_a_process_without_tunnels_fails_the_turn_of_a_runner_whose_server_died(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    first = launch_server(**FAST)
    runner = launch_runner(first)
    session_id, response_id = orphan_a_turn(first, runner, mock_llm, make_bundle())

    second = launch_server(**FAST)  # the same database; no runner ever connects here
    turn = wait_turn(second, session_id, response_id, statuses=("failed",), deadline_s=60)
    assert turn["error"]["code"] == "runner_disconnected", turn
    with second.client() as client:
        session = client.get(f"/v1/sessions/{session_id}").json()
        status = client.get(f"/v1/runners/{runner.runner_id}/status").json()
    assert session["status"] == "failed"
    assert session["last_task_error"]["code"] == "runner_disconnected"
    assert status == {"runner_id": runner.runner_id, "online": False}
