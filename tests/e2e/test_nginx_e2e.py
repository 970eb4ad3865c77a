"""The production deployment end to end (operations.md, "The deployment, shipped and
tested"): Debian's nginx, started from what ``deployconfig nginx`` renders, in front of
three server processes on PostgreSQL + Redis, with the runner connected *through
nginx*; turns, a stream, uploads and an idle tunnel go through it.

Two things differ from the shipped configuration, both to keep the test short: nginx's
read timeouts are 4 s (the tunnel and stream locations included) instead of 120 s and
1 h, and the server's heartbeats (tunnel and stream) are 1 s and Redis's read timeout
6 s; the idle period (8 s) outlasts every one of them, as an idle of minutes outlasts
the shipped ones. And nginx passes the identity header on (``identity_header=""``), as
a deployment's authenticating layer would set it.

The rolling restart (operations.md), with nginx's shipped read timeout: the three
processes are restarted one at a time (SIGTERM, then a new process on the same address)
while 20 sessions run turns back to back on a runner that runs 8 at once (the others
wait for a slot, and the scheduler sends their ``turn.start`` without waiting for the
answer), and a client per session follows its stream, reconnecting with
``Last-Event-ID`` whenever a restart ends it. No turn fails, every message is accepted,
and each client holds every event of its session once, in order, with no gap, and each
turn's end once.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from testing import nginx
from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    StreamReader,
    base_env,
    bind,
    create_session,
    drop_redis_keys,
    is_final_idle,
    migrate,
    register_runner,
    restart_on_same_port,
    send_message,
    start_runner,
    start_server,
    wait_turn,
    wait_until,
)
from tests.conftest import IN_CI

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]

NGINX_TIMEOUT_S = 4
IDLE_S = 8.0


@dataclass
class Deployment:
    front: Server  # the servers as seen through nginx
    servers: list[Server]
    proxy: nginx.Nginx
    log_dir: Path


@pytest.fixture
def deployment(
    tmp_path: Path, postgres_url: str, redis_url: str, request: pytest.FixtureRequest
) -> Iterator[Deployment]:
    if nginx.nginx_path() is None:
        if IN_CI:
            pytest.fail("nginx is not installed (CI=true requires it; .ci/run installs it)")
        pytest.skip("nginx is not installed")
    prefix = f"omnigent-nginx-{secrets.token_hex(4)}"
    env = base_env(
        DATABASE_URL=postgres_url,
        REDIS_URL=redis_url,
        OMNIGENT_CHANNEL_PREFIX=prefix,
        OMNIGENT_DATA_DIR=str(tmp_path / "data"),
        OMNIGENT_TRUSTED_PROXIES="127.0.0.1",
        OMNIGENT_HEARTBEAT_S="1",
        OMNIGENT_STREAM_HEARTBEAT_S="1",
        OMNIGENT_REDIS_SOCKET_TIMEOUT_S="6",
        OMNIGENT_METRICS="1",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
        OMNIGENT_LOG_FORMAT="json",
    )
    migrate(env, tmp_path)
    with contextlib.ExitStack() as stack:
        with ThreadPoolExecutor(3) as pool:
            starting = [
                pool.submit(start_server, env=env, log_dir=tmp_path, name=f"daphne-{n}")
                for n in range(3)
            ]
            servers = [future.result() for future in starting]
        for server in servers:
            stack.callback(server.process.stop)
        proxy = nginx.start(
            upstreams=[server.url.removeprefix("http://") for server in servers],
            prefix=tmp_path / "nginx",
            log_dir=tmp_path,
            identity_header="",
            read_timeout_s=getattr(request, "param", NGINX_TIMEOUT_S),
            long_read_timeout_s=getattr(request, "param", NGINX_TIMEOUT_S),
        )
        stack.callback(proxy.stop)
        stack.callback(drop_redis_keys, prefix)
        try:
            yield Deployment(
                front=replace(servers[0], url=proxy.url),
                servers=servers,
                proxy=proxy,
                log_dir=tmp_path,
            )
        finally:
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.failed:
                for process in [server.process for server in servers] + [proxy.process]:
                    print(f"\n===== {process.name} =====\n{process.log()[-4000:]}")


@pytest.fixture
def runner_behind(
    deployment: Deployment, mock_llm: MockLLMServer, tmp_path: Path
) -> Iterator[Runner]:
    runner_id, token = register_runner(deployment.front)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    runner = start_runner(
        server=deployment.front,
        token=token,
        runner_id=runner_id,
        workspace=workspace,
        log_dir=tmp_path,
        # The default capacity (8 turns at once): most of the rolling restart's turns wait
        # for a slot and are started by the scheduler, fire and forget.
        extra_env={"OPENAI_BASE_URL": mock_llm.base_url, "OPENAI_API_KEY": "test-key"},
    )
    assert runner.process is not None
    try:
        yield runner
    finally:
        runner.process.stop()


def tunnel_connections(deployment: Deployment) -> int:
    """How many times a server process took the runner's tunnel (``runner … online``)."""
    return sum(
        len(re.findall(r"runner \S+ online \(generation", server.process.log()))
        for server in deployment.servers
    )


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_turns_streams_uploads_and_an_idle_tunnel_through_nginx(
    deployment: Deployment,
    runner_behind: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    front = deployment.front
    session_id = create_session(front, make_bundle())  # a multipart bundle upload
    bind(front, session_id, runner_behind.runner_id)
    with front.client() as client:
        # Larger than nginx's default body limit (1 MiB) and its in-memory body buffer.
        data = b"".join(b"line %07d of the notes\n" % n for n in range(120_000))
        uploaded = client.post(
            f"/v1/sessions/{session_id}/resources/files",
            files={"file": ("notes.txt", data, "text/plain")},
        )
        assert uploaded.status_code == 201, uploaded.text
        assert uploaded.json()["metadata"]["bytes"] == len(data)

    stream = StreamReader(front, session_id)
    stream.wait_connected()
    assert stream.status_code == 200
    assert stream.headers.get("x-request-id")
    first = send_message(front, session_id, "hello through nginx")
    assert first.status_code == 202, first.text
    assert first.headers.get("x-request-id")
    assert wait_turn(front, session_id, first.json()["response_id"])["status"] == "completed"
    stream.wait_for(is_final_idle, deadline_s=30)

    # Idle longer than nginx's read timeouts and Redis's: the tunnel and the stream
    # stay up on their heartbeats.
    connections = tunnel_connections(deployment)
    heartbeats = stream.types().count("session.heartbeat")
    time.sleep(IDLE_S)
    assert tunnel_connections(deployment) == connections == 1
    assert stream.types().count("session.heartbeat") >= heartbeats + int(IDLE_S) - 2
    assert not stream._finished.is_set(), stream.types()

    mock_llm.configure([{"text": "still here"}])
    second = send_message(front, session_id, "after the idle")
    assert second.status_code == 202, second.text
    done = wait_turn(front, session_id, second.json()["response_id"])
    assert done["status"] == "completed", done
    stream.wait_for(
        lambda event: (
            event.type == "response.completed"
            and event.data.get("response", {}).get("id") == second.json()["response_id"]
        ),
        deadline_s=30,
    )

    # Metrics through nginx: any process answers for all three.
    with front.client() as client:
        texts = [client.get("/metrics").text for _ in range(3)]
    for text in texts:
        assert metric(text, "omnigent_connected_runners") == 1.0
        assert metric(text, "omnigent_open_streams") == 1.0
    # nginx logged each request with its id.
    access = (deployment.proxy.prefix / "access.log").read_text()
    assert second.headers["x-request-id"] in access


ROLLING_SESSIONS = 20
ENDS = ("response.completed", "response.failed", "response.cancelled")


class FollowedStream:
    """A client following one session's stream the way a browser's EventSource does:
    when the stream ends (a server process shutting down ends it with ``[DONE]``, or
    the connection drops) it reconnects with the last event id it holds."""

    def __init__(self, front: Server, session_id: str) -> None:
        self.front = front
        self.session_id = session_id
        self.events: list[tuple[int, str, dict]] = []
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            last = self.events[-1][0] if self.events else None
            reader = StreamReader(self.front, self.session_id, last_event_id=last)
            while not reader._finished.wait(0.2):
                self._take(reader)
                if self._stop.is_set():
                    return
            self._take(reader)
            self.reconnects += 1

    def _take(self, reader: StreamReader) -> None:
        taken = {event_id for event_id, _, _ in self.events}
        for event in list(reader.events):
            if (
                event.id is not None
                and event.id not in taken
                and (not self.events or event.id > self.events[-1][0])
            ):
                self.events.append((event.id, event.type, event.data))
                taken.add(event.id)

    def completed(self) -> set[str]:
        return {
            data["response"]["id"] for _, kind, data in self.events if kind == "response.completed"
        }

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# nginx's read timeouts as shipped for the API (120 s): a message waits for its runner's
# acknowledgement, and for the runner to reconnect when its tunnel moved.
@pytest.mark.parametrize("deployment", [120], indirect=True)
def test_a_rolling_restart_under_twenty_sessions_loses_nothing(
    deployment: Deployment,
    runner_behind: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    front = deployment.front
    # Every turn streams its answer over about half a second, so restarts land mid-turn.
    mock_llm.configure(
        [{"text": "an answer in several words", "stream": True, "delay_s": 0.5}] * 400
    )
    sessions = [create_session(front, make_bundle()) for _ in range(ROLLING_SESSIONS)]
    for session_id in sessions:
        bind(front, session_id, runner_behind.runner_id)
    streams = {session_id: FollowedStream(front, session_id) for session_id in sessions}
    sent: dict[str, list[str]] = {session_id: [] for session_id in sessions}
    outcomes: list[tuple[str, str, str]] = []  # (session, response, status or error)
    done = threading.Event()

    def run_turns(session_id: str) -> None:
        number = 0
        while not done.is_set():
            number += 1
            accepted = send_message(front, session_id, f"turn {number}")
            if accepted.status_code != 202:
                outcomes.append((session_id, "", f"{accepted.status_code} {accepted.text}"))
                return
            response_id = accepted.json()["response_id"]
            sent[session_id].append(response_id)
            try:
                turn = wait_turn(front, session_id, response_id, deadline_s=120)
            except TimeoutError as exc:  # a turn left waiting: reported, not swallowed
                outcomes.append((session_id, response_id, str(exc)))
                return
            outcomes.append((session_id, response_id, turn["status"]))

    def turns_done() -> int:
        return sum(1 for _, _, status in outcomes if status == "completed")

    workers = [threading.Thread(target=run_turns, args=(sid,), daemon=True) for sid in sessions]
    for worker in workers:
        worker.start()
    restarted: list[Server] = []
    try:
        wait_until(lambda: turns_done() >= ROLLING_SESSIONS, deadline_s=120, what="first turns")
        for index, server in enumerate(list(deployment.servers)):
            before = turns_done()
            new = restart_on_same_port(
                server, deployment.log_dir, f"daphne-{index}-restarted", sig=signal.SIGTERM
            )
            restarted.append(new)
            deployment.servers[index] = new
            # Turns go on after each restart: a full round of them completes.
            wait_until(
                lambda before=before: turns_done() >= before + ROLLING_SESSIONS,
                deadline_s=120,
                what=f"turns to go on after restarting process {index}",
            )
        done.set()
        for worker in workers:
            worker.join(timeout=150)
        assert not any(worker.is_alive() for worker in workers)
        failed = [outcome for outcome in outcomes if outcome[2] != "completed"]
        assert failed == [], failed
        for session_id, stream in streams.items():
            wait_until(
                lambda stream=stream, session_id=session_id: (
                    stream.completed() >= set(sent[session_id])
                ),
                deadline_s=60,
                what=f"the stream of {session_id} to hold every turn's completion",
            )
            ids = [event_id for event_id, _, _ in stream.events]
            assert ids == list(range(ids[0], ids[0] + len(ids))), f"a gap in {session_id}"
            # Each turn ended once, in the order it was sent: none lost or run twice.
            ends = [data["response"]["id"] for _, kind, data in stream.events if kind in ENDS]
            assert ends == sent[session_id], f"turn ends of {session_id}"
        assert sum(stream.reconnects for stream in streams.values()) >= 1
    finally:
        done.set()
        for stream in streams.values():
            stream.stop()
        for server in restarted:
            server.process.stop()
