"""A bare ``daphne omnigent_site.asgi:application`` behaves like ``python -m omnigent_site.serve``.

The server runtime (``omnigent_site/runtime``) is applied when the application is
built, not by the launcher. These tests start real daphne processes both ways and
check what the launcher used to do on its own: the tunnel's 16 MiB frame limit (a
runner's 2 MiB answer passes; daphne's default would close the tunnel at 1 MiB),
the garbage-collector freeze, Twisted's form parsing off and the background tasks
(the runtime's start-up line in the log at DEBUG, which also names the event loop:
uvloop under ``serve``, asyncio's under bare daphne; at INFO the line that says where
to go), ``[DONE]`` on SIGTERM and SIGINT on either
loop, and the stale-runner sweep of a process that holds no tunnel.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    START_DEADLINE_S,
    Runner,
    Server,
    StreamReader,
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
from tests.e2e.conftest import orphan_a_turn, server_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MIB = 1024 * 1024
# Stale after 3 × heartbeat + 5 s of silence, plus the grace: about 9 s here.
FAST = {"OMNIGENT_HEARTBEAT_S": "1", "OMNIGENT_RECONNECT_GRACE_S": "1"}
RUNTIME_LINE = re.compile(
    r"server runtime: (?P<frozen>\d+) startup objects frozen out of full collections; "
    r"Twisted form parsing off: (?P<formless>\w+); WebSocket message/frame limit: "
    r"(?P<message>\d+)/(?P<frame>\d+) bytes; background tasks: (?P<tasks>.*); "
    r"event loop: (?P<loop>\w+)"
)


def start_bare_daphne(*, env: dict[str, str], log_dir: Path, name: str) -> Server:
    """``daphne -b 127.0.0.1 -p PORT omnigent_site.asgi:application``, nothing else."""
    port = free_port()
    daphne = Path(sys.executable).with_name("daphne")
    process = spawn(
        name,
        [str(daphne), "-b", "127.0.0.1", "-p", str(port), "omnigent_site.asgi:application"],
        env=env,
        log_dir=log_dir,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.popen.poll() is not None:
            raise RuntimeError(f"{name} exited: {process.log()[-2000:]}")
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200

    try:
        wait_until(healthy, deadline_s=START_DEADLINE_S, what=f"{name} to answer /health")
    except BaseException:
        process.stop()
        raise
    return Server(url=url, process=process, env=env)


@pytest.fixture
def launch(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Server]]:
    """Start servers on one fresh SQLite database, as ``serve`` or bare ``daphne``."""
    started: list[Server] = []

    def start(how: str, **settings: str) -> Server:
        env = server_env(tmp_path, **settings)
        migrate(env, tmp_path)
        name = f"{how}-{len(started)}"
        if how == "daphne":
            srv = start_bare_daphne(env=env, log_dir=tmp_path, name=name)
        else:
            srv = start_server(env=env, log_dir=tmp_path, name=name)
        started.append(srv)
        return srv

    try:
        yield start
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for srv in started:
                print(f"\n===== {srv.process.name} log =====\n{srv.process.log()[-6000:]}")
        for srv in started:
            srv.process.stop()


def runtime_line(server: Server) -> re.Match[str]:
    return wait_until(
        lambda: RUNTIME_LINE.search(server.process.log()),
        deadline_s=10,
        what="the server runtime's start-up line",
    )


@pytest.mark.parametrize("how", ["daphne", "serve"])
def test_the_runtime_applies_however_the_server_starts(
    how: str,
    launch: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server = launch(how, OMNIGENT_LOG_LEVEL="DEBUG")
    line = runtime_line(server)
    log = server.process.log()
    assert f"Omnigent on {server.url}/ (web page), API at /v1/" in log
    assert '"GET /health" 200' in log  # answered health checks show at DEBUG
    assert int(line["frozen"]) > 10_000
    assert line["formless"] == "True"
    assert (int(line["message"]), int(line["frame"])) == (16 * MIB, 16 * MIB)
    assert set(line["tasks"].strip().split(", ")) == {
        "runners.liveness.beat_forever",
        "runners.upkeep.sweep_stale_runners_forever",
        "runners.upkeep.resend_unacked_starts_forever",
        "runners.verdicts.sweep_expired_approvals_forever",
        "sessions.retention.retention_forever",
        "webhooks.delivery.deliver_forever",
        "schedules.upkeep.fire_due_forever",
    }
    assert "below OMNIGENT_MAX_FRAME_BYTES" not in server.process.log()
    # serve chooses uvloop before daphne creates its loop; bare daphne keeps asyncio's.
    assert line["loop"] == ("asyncio" if how == "daphne" else "uvloop")

    # A runner's answer in one 2 MiB frame: over daphne's own 1 MiB limit.
    runner = launch_runner(server)
    answer = "x" * (2 * MIB)
    mock_llm.configure([{"text": answer}])
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    response = send_message(server, session_id, "answer at length")
    assert response.status_code == 202, response.text
    turn = wait_turn(server, session_id, response.json()["response_id"], deadline_s=60)
    assert turn["status"] == "completed", turn
    texts = [
        part["text"]
        for item in turn["output"]
        if item["type"] == "message"
        for part in item["content"]
    ]
    assert texts == [answer]

    # An open stream ends with [DONE] when the process is asked to stop.
    reader = StreamReader(server, session_id)
    reader.wait_for(lambda event: event.type == "session.heartbeat")
    server.process.stop(sig=signal.SIGTERM)
    events = reader.wait(deadline_s=30)
    assert events[-1].done


@pytest.mark.parametrize("how", ["daphne", "serve"])
def test_streams_end_with_done_on_sigint_on_either_loop(
    how: str, launch: Callable[..., Server], make_bundle: Callable[..., bytes]
) -> None:
    server = launch(how)
    session_id = create_session(server, make_bundle())
    reader = StreamReader(server, session_id)
    reader.wait_for(lambda event: event.type == "session.heartbeat")
    server.process.stop(sig=signal.SIGINT)
    events = reader.wait(deadline_s=30)
    assert events[-1].done


def test_bare_daphne_without_tunnels_fails_the_turn_of_a_runner_whose_server_died(
    launch: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    """As ``test_stale_runner_sweep.py``, with bare daphne: only the second process's
    background sweep can notice, since no runner ever connects to it."""
    first = launch("daphne", **FAST)
    runner = launch_runner(first)
    session_id, response_id = orphan_a_turn(first, runner, mock_llm, make_bundle())

    second = launch("daphne", **FAST)
    turn = wait_turn(second, session_id, response_id, statuses=("failed",), deadline_s=60)
    assert turn["error"]["code"] == "runner_disconnected", turn
