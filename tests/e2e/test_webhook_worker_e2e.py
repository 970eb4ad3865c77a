"""Webhooks sent by worker processes (``OMNIGENT_WEBHOOK_DELIVERY=worker``), end to end:
real daphne processes, real ``manage.py deliverwebhooks`` processes, the real runner
program, the mock LLM and a real receiver on loopback.

- SQLite: the server process writes a turn's event and sends nothing, however long it
  idles; a worker started afterwards sends it, signed, and stops cleanly on SIGTERM.
- A worker restarted (SIGTERM) while its attempt is at the receiver: the next worker
  sends the event again once the claim expires, with the same id.
- PostgreSQL + Redis: two workers that poll only once a minute are woken through the
  channel layer by two server processes; every event arrives within seconds, once.
- ``runlocal`` starts a worker when the setting asks for one.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from standardwebhooks.webhooks import Webhook as Verifier

from testing.mockllm import MockLLMServer
from testing.processes import (
    Process,
    Runner,
    Server,
    base_env,
    bind,
    create_session,
    free_port,
    migrate,
    send_message,
    spawn,
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

WORKER = {"OMNIGENT_WEBHOOK_DELIVERY": "worker"}
LISTENING = "listening on the channel layer's group webhook-workers"
POLLING = "the channel layer is embedded: finding events every"
EVENTS = 40


def start_worker(env: dict[str, str], log_dir: Path, name: str, *, ready: str) -> Process:
    """A ``manage.py deliverwebhooks`` process, once its log says ``ready``."""
    worker = spawn(name, [sys.executable, "manage.py", "deliverwebhooks"], env=env, log_dir=log_dir)
    wait_until(
        lambda: ready in worker.log() or worker.popen.poll() is not None,
        deadline_s=60,
        what=f"{name} to start",
    )
    assert worker.popen.poll() is None, worker.log()[-2000:]
    return worker


def test_a_worker_sends_what_the_server_process_writes(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    receiver: WebhookReceiver,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # The worker polls every 0.1 s (the embedded channel layer carries no wake-up).
    server = launch_server(OMNIGENT_WEBHOOK_POLL_S="0.1", **WORKER, **LOCAL_RECEIVERS)
    runner = launch_runner(server)
    hook = create_webhook(server, receiver.url, ["turn.completed"])
    mock_llm.configure([{"text": "all done"}])
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    response = send_message(server, session_id, "hello")
    assert response.status_code == 202, response.text
    response_id = response.json()["response_id"]
    assert wait_turn(server, session_id, response_id)["status"] == "completed"
    # Two seconds with no worker: the server process neither fans the event out nor
    # sends it.
    with pytest.raises(AssertionError, match="0 of 1 requests arrived"):
        receiver.wait_for(1, timeout=2)
    with server.client() as client:
        assert client.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"] == []

    worker = start_worker(server.env, tmp_path, "webhook-worker", ready=POLLING)
    try:
        [got] = receiver.wait_for(1, timeout=30)
        body = Verifier(hook["secret"]).verify(got.body, got.headers)
        assert body["type"] == "turn.completed"
        assert body["data"]["response_id"] == response_id

        def recorded() -> list[tuple[str, str, int]] | None:
            with server.client() as client:
                rows = client.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]
            found = [(row["type"], row["status"], row["attempts"]) for row in rows]
            return found if found and all(row[1] != "pending" for row in found) else None

        assert wait_until(recorded, deadline_s=30, what="the delivery's outcome") == [
            ("turn.completed", "delivered", 1)
        ]
    finally:
        code = worker.stop(sig=signal.SIGTERM, timeout=30)
        _dump_logs(request, worker)
    assert code == 0, worker.log()[-2000:]
    assert "stopped delivering webhooks" in worker.log()


def test_a_worker_restarted_mid_delivery_is_followed_by_one_that_sends_again(
    launch_server: Callable[..., Server],
    receiver: WebhookReceiver,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """SIGTERM while an attempt is at the receiver: the worker waits a second for it,
    exits 0 without an outcome, and its successor sends the event again once the claim
    expires (a 2 s timeout makes the lease 11 s; the test idles past it)."""
    server = launch_server(
        OMNIGENT_WEBHOOK_TIMEOUT_S="2", OMNIGENT_WEBHOOK_POLL_S="0.1", **WORKER, **LOCAL_RECEIVERS
    )
    hook = create_webhook(server, receiver.url, ["webhook.test"])
    held = FirstRequestHeld(receiver)
    [event_id] = send_tests([server], hook["id"], 1)
    workers = [start_worker(server.env, tmp_path, "webhook-worker-1", ready=POLLING)]
    try:
        held.wait_arrived()
        assert workers[0].stop(sig=signal.SIGTERM, timeout=30) == 0, workers[0].log()[-2000:]
        held.release()
        workers.append(start_worker(server.env, tmp_path, "webhook-worker-2", ready=POLLING))
        assert_sent_again_then_delivered(server, receiver, hook, event_id)
    finally:
        held.release()
        for worker in workers:
            worker.stop()
        _dump_logs(request, *workers)


@pytest.mark.postgres
@pytest.mark.redis
def test_workers_woken_through_redis_send_each_event_once(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    receiver: WebhookReceiver,
    request: pytest.FixtureRequest,
) -> None:
    # A poll once a minute: what arrives within the test's deadlines was woken.
    env = scale_out_env(tmp_path, postgres_url, redis_url, OMNIGENT_WEBHOOK_POLL_S="60", **WORKER)
    migrate(env, tmp_path)
    processes: list[Process] = []
    try:
        servers = [start_server(env=env, log_dir=tmp_path, name=f"daphne-{n}") for n in "ab"]
        processes += [server.process for server in servers]
        processes += [
            start_worker(env, tmp_path, f"webhook-worker-{n}", ready=LISTENING) for n in "ab"
        ]
        hook = create_webhook(servers[0], receiver.url, ["webhook.test"])
        sent = send_tests(servers, hook["id"], EVENTS)
        assert_each_arrived_once(receiver, sent, hook["secret"], timeout=30)
    finally:
        _dump_logs(request, *processes)
        for process in reversed(processes):
            process.stop()


def test_runlocal_starts_a_worker_when_asked(
    tmp_path: Path, receiver: WebhookReceiver, request: pytest.FixtureRequest
) -> None:
    env = base_env(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        OMNIGENT_DATA_DIR=str(tmp_path / "data"),
        OMNIGENT_WEBHOOK_DELIVERY="worker",
    )
    migrate(env, tmp_path)
    port = free_port()
    runlocal = spawn(
        "runlocal",
        [sys.executable, "manage.py", "runlocal", "--no-runner", "--port", str(port)],
        env=env,
        log_dir=tmp_path,
    )
    try:
        wait_until(
            lambda: "Press Ctrl-C to stop." in runlocal.log() or runlocal.popen.poll() is not None,
            deadline_s=90,
            what="runlocal to start",
        )
        assert "webhooks: sent by a worker process" in runlocal.log(), runlocal.log()[-2000:]
        wait_until(lambda: POLLING in runlocal.log(), deadline_s=60, what="the worker to start")
        # Local single-user mode: no credentials, and loopback receivers are allowed.
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            response = client.post("/v1/webhooks", json={"url": receiver.url, "events": ["*"]})
            assert response.status_code == 201, response.text
            hook = response.json()
            response = client.post(f"/v1/webhooks/{hook['id']}/test")
            assert response.status_code == 202, response.text
        [got] = receiver.wait_for(1, timeout=30)
        assert Verifier(hook["secret"]).verify(got.body, got.headers)["type"] == "webhook.test"
    finally:
        code = runlocal.stop(sig=signal.SIGTERM, timeout=60)
        _dump_logs(request, runlocal)
    assert code == 0, runlocal.log()[-3000:]
    assert "Stopped." in runlocal.log()
