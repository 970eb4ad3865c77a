"""Webhooks end to end (automation.md): real daphne processes, the real runner program,
the mock LLM and a real receiver on loopback.

- A turn's ``turn.completed`` reaches the receiver signed (checked with the
  ``standardwebhooks`` library), with the turn's ids.
- Two server processes on PostgreSQL + Redis, both delivering and polling fast: every
  event arrives, none twice (each attempt is claimed by one process).
- A server killed while its request is at the receiver: the process started in its
  place sends the event again once the claim expires (same id, so the receiver can
  drop the duplicate), and the delivery ends ``delivered`` after two attempts.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook as Verifier

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    bind,
    create_session,
    migrate,
    restart_on_same_port,
    send_message,
    start_server,
    wait_turn,
    wait_until,
)
from testing.webhook_receiver import WebhookReceiver
from tests.e2e.conftest import _dump_logs
from tests.e2e.webhook_support import (
    LOCAL_RECEIVERS,
    FirstRequestHeld,
    assert_each_arrived_once,
    assert_sent_again_then_delivered,
    create_webhook,
    scale_out_env,
    send_tests,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EVENTS = 40


def test_a_completed_turn_arrives_signed(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    receiver: WebhookReceiver,
) -> None:
    server = launch_server(**LOCAL_RECEIVERS)
    runner = launch_runner(server)
    hook = create_webhook(server, receiver.url, ["turn.completed"])
    mock_llm.configure([{"text": "all done"}])
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    response = send_message(server, session_id, "hello")
    assert response.status_code == 202, response.text
    response_id = response.json()["response_id"]
    assert wait_turn(server, session_id, response_id)["status"] == "completed"
    [got] = receiver.wait_for(1, timeout=30)
    body = Verifier(hook["secret"]).verify(got.body, got.headers)
    assert body["type"] == "turn.completed"
    assert body["data"]["session_id"] == session_id
    assert body["data"]["response_id"] == response_id
    assert body["data"]["status"] == "completed" and body["data"]["error"] is None

    def recorded() -> list[tuple[str, str, int]] | None:
        # The outcome is stored after the receiver answers (batched with others).
        with server.client() as client:
            rows = client.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]
        found = [(row["type"], row["status"], row["attempts"]) for row in rows]
        return found if all(status != "pending" for _, status, _ in found) else None

    assert wait_until(recorded, deadline_s=10, what="the delivery's outcome") == [
        ("turn.completed", "delivered", 1)
    ]


@pytest.mark.postgres
@pytest.mark.redis
def test_two_processes_send_each_event_once(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    receiver: WebhookReceiver,
    request: pytest.FixtureRequest,
) -> None:
    # Both processes look for work every 50 ms: they race for the same rows.
    env = scale_out_env(tmp_path, postgres_url, redis_url, OMNIGENT_WEBHOOK_POLL_S="0.05")
    migrate(env, tmp_path)
    servers: list[Server] = []
    try:
        servers.append(start_server(env=env, log_dir=tmp_path, name="daphne-a"))
        servers.append(start_server(env=env, log_dir=tmp_path, name="daphne-b"))
        hook = create_webhook(servers[0], receiver.url, ["webhook.test"])
        sent = send_tests(servers, hook["id"], EVENTS)
        assert_each_arrived_once(receiver, sent, hook["secret"], timeout=60)
    finally:
        _dump_logs(request, *(server.process for server in servers))
        for server in servers:
            server.process.stop()


def test_a_server_killed_mid_delivery_is_followed_by_one_that_sends_again(
    launch_server: Callable[..., Server],
    receiver: WebhookReceiver,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # A 2 s request timeout makes the claim's lease 11 s (3 × timeout + 5): the new
    # process may retry only after that, so the test idles past it.
    server = launch_server(
        OMNIGENT_WEBHOOK_TIMEOUT_S="2", OMNIGENT_WEBHOOK_POLL_S="0.05", **LOCAL_RECEIVERS
    )
    hook = create_webhook(server, receiver.url, ["webhook.test"])
    held = FirstRequestHeld(receiver)
    [event_id] = send_tests([server], hook["id"], 1)
    held.wait_arrived()
    restarted = restart_on_same_port(server, tmp_path, "daphne-restarted", sig=signal.SIGKILL)
    try:
        held.release()
        assert_sent_again_then_delivered(restarted, receiver, hook, event_id)
    finally:
        _dump_logs(request, restarted.process)
        restarted.process.stop()
