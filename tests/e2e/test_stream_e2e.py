"""The session stream with real processes: order, fan-out, resume, end, slow readers."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    StreamReader,
    bind,
    create_session,
    is_final_idle,
    send_message,
    wait_turn,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TURN_SCRIPT = [
    {
        "tool_calls": [
            {
                "call_id": "call_1",
                "name": "sys_os_write",
                "arguments": '{"path": "a.txt", "content": "one"}',
            }
        ]
    },
    {"text": "I wrote the file and now I am done.", "stream": True},
]
OS_ENV = "os_env:\n  type: caller_process\n  cwd: .\n"


def expected_order(types: list[str]) -> list[str]:
    """The event types of one turn with consecutive text deltas folded into one."""
    folded: list[str] = []
    for event_type in types:
        if event_type == "response.output_text.delta" and folded and folded[-1] == event_type:
            continue
        folded.append(event_type)
    return folded


def start_turn(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> str:
    session_id = create_session(server, make_bundle(extra=OS_ENV))
    bind(server, session_id, runner.runner_id)
    return session_id


def test_subscriber_sees_the_whole_turn_in_order_and_two_see_the_same(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    mock_llm.configure(TURN_SCRIPT)
    session_id = start_turn(server, runner, mock_llm, make_bundle)
    first = StreamReader(server, session_id, until=is_final_idle)
    second = StreamReader(server, session_id, until=is_final_idle)
    for reader in (first, second):
        reader.wait_for(lambda event: event.type == "session.heartbeat")
        assert reader.status_code == 200
        assert reader.headers["content-type"].startswith("text/event-stream")
        assert reader.headers["cache-control"] == "no-cache"
        assert reader.headers["x-accel-buffering"] == "no"

    accepted = send_message(server, session_id, "write a.txt").json()
    first.wait()
    second.wait()

    assert first.types()[0] == "session.heartbeat"
    assert expected_order([t for t in first.types() if t != "session.heartbeat"]) == [
        "session.input.consumed",
        "session.status",
        "response.created",
        "response.in_progress",
        "response.output_item.done",
        "response.output_item.done",
        "session.changed_files.invalidated",
        "response.output_text.delta",
        "response.output_item.done",
        "session.usage",  # stored before the turn's end (docs/usage.md)
        "response.completed",
        "session.status",
    ]
    statuses = [e.data["status"] for e in first.events if e.type == "session.status"]
    assert statuses == ["running", "idle"]
    ids = [e.id for e in first.events if e.id is not None]
    assert (
        ids == sorted(ids)
        and len(ids) == len(set(ids))
        and ids == list(range(ids[0], ids[0] + len(ids)))
    )
    deltas = "".join(
        e.data["delta"] for e in first.events if e.type == "response.output_text.delta"
    )
    assert deltas == "I wrote the file and now I am done."
    completed = next(e.data for e in first.events if e.type == "response.completed")
    assert completed["response"]["id"] == accepted["response_id"]
    assert completed["response"]["model"] == "mock-model"
    assert isinstance(completed["response"]["created_at"], int)
    status = next(e.data for e in first.events if e.type == "session.status")
    assert status["session_id"] == status["conversation_id"] == session_id
    assert first.payloads() == second.payloads()


def test_reconnect_with_last_event_id_loses_and_repeats_nothing(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    script = [
        dict(TURN_SCRIPT[0]),
        {"text": "Slow answer after a pause.", "stream": True, "delay_s": 1.0},
    ]
    mock_llm.configure(script)
    session_id = start_turn(server, runner, mock_llm, make_bundle)
    steady = StreamReader(server, session_id, until=is_final_idle)
    blinking = StreamReader(
        server, session_id, until=lambda event: event.type == "session.changed_files.invalidated"
    )
    for reader in (steady, blinking):
        reader.wait_for(lambda event: event.type == "session.heartbeat")
    send_message(server, session_id, "write a.txt slowly")
    before = blinking.wait()
    last_id = [e.id for e in before if e.id is not None][-1]
    resumed = StreamReader(server, session_id, last_event_id=last_id, until=is_final_idle)
    resumed.wait()
    steady.wait()
    assert blinking.payloads() + resumed.payloads() == steady.payloads()
    assert resumed.types()[0] == "session.heartbeat"


def test_resume_with_query_after_replays_a_finished_turn(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    mock_llm.configure([{"text": "short"}])
    session_id = start_turn(server, runner, mock_llm, make_bundle)
    accepted = send_message(server, session_id, "hi").json()
    wait_turn(server, session_id, accepted["response_id"])
    replay = StreamReader(server, session_id, last_event_id=0, until=is_final_idle)
    replay.wait()
    ids = [e.id for e in replay.events if e.id is not None]
    assert ids[0] == 1 and ids == list(range(1, len(ids) + 1))
    assert replay.types()[1] == "session.input.consumed"


def test_deleting_the_session_ends_the_stream_and_access_rules(
    server: Server, make_bundle: Callable[..., bytes]
) -> None:
    session_id = create_session(server, make_bundle())
    stranger = StreamReader(server, session_id, user="mallory@example.com")
    stranger.wait()
    assert stranger.status_code == 404
    anonymous = StreamReader(server, session_id, user=None)
    anonymous.wait()
    assert anonymous.status_code == 401

    reader = StreamReader(server, session_id)
    reader.wait_for(lambda event: event.type == "session.heartbeat")
    with server.client() as client:
        assert client.delete(f"/v1/sessions/{session_id}").status_code == 200
    events = reader.wait(deadline_s=30)
    assert events[-1].done


def test_server_shutdown_ends_the_stream_with_done(
    server: Server, make_bundle: Callable[..., bytes]
) -> None:
    session_id = create_session(server, make_bundle())
    reader = StreamReader(server, session_id)
    reader.wait_for(lambda event: event.type == "session.heartbeat")
    server.process.stop()
    events = reader.wait(deadline_s=30)
    assert events[-1].done


@pytest.mark.postgres
@pytest.mark.redis
def test_subscriber_on_process_b_sees_the_runner_on_process_a(
    two_servers: tuple[Server, Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server_a, server_b = two_servers
    runner = launch_runner(server_a)
    mock_llm.configure(TURN_SCRIPT)
    session_id = create_session(server_a, make_bundle(extra=OS_ENV))
    bind(server_a, session_id, runner.runner_id)
    watcher_b = StreamReader(server_b, session_id, until=is_final_idle)
    watcher_a = StreamReader(server_a, session_id, until=is_final_idle)
    for reader in (watcher_a, watcher_b):
        reader.wait_for(lambda event: event.type == "session.heartbeat")
    send_message(server_a, session_id, "write a.txt")
    watcher_b.wait()
    watcher_a.wait()
    assert "response.completed" in watcher_b.types()
    assert watcher_b.payloads() == watcher_a.payloads()


def test_a_slow_subscriber_blocks_nobody_and_is_cut_off_with_a_final_event(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server = launch_server(OMNIGENT_STREAM_MAX_LAG="50", OMNIGENT_EVENT_RETENTION="10000")
    runner_id = launch_runner(server).runner_id
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner_id)
    # Large deltas: enough bytes to fill the socket buffers and Twisted's.
    long_text = " ".join(f"w{i:05d}" + "x" * 2000 for i in range(3000))
    mock_llm.configure([{"text": long_text, "stream": True}])

    # A client that asks for the stream and then does not read, with a tiny window.
    host, port = server.url.removeprefix("http://").split(":")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect((host, int(port)))
    slow.sendall(
        f"GET /v1/sessions/{session_id}/stream HTTP/1.1\r\nHost: {host}\r\n"
        "X-Forwarded-Email: alice@example.com\r\nAccept: text/event-stream\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    steady = StreamReader(server, session_id, until=is_final_idle)
    steady.wait_for(lambda event: event.type == "session.heartbeat")

    accepted = send_message(server, session_id, "talk a lot").json()
    turn = wait_turn(server, session_id, accepted["response_id"], deadline_s=120)
    assert turn["status"] == "completed"
    steady.wait(deadline_s=120)
    deltas = [e for e in steady.events if e.type == "response.output_text.delta"]
    assert "".join(e.data["delta"] for e in deltas) == long_text

    # Now read what the slow client was sent: it ends with the overflow event.
    slow.settimeout(30)
    received = b""
    while not received.endswith(b"0\r\n\r\n"):
        chunk = slow.recv(65536)
        if not chunk:
            break
        received += chunk
    slow.close()
    text = received.decode("utf-8", errors="replace")
    assert "event: stream.overflow" in text
    tail = text[text.rindex("event: stream.overflow") :]
    last_id = int(tail.split('"last_event_id":')[1].split(",")[0].split("}")[0])
    resumed = StreamReader(server, session_id, last_event_id=last_id, until=is_final_idle)
    resumed.wait(deadline_s=60)
    assert resumed.events[-1].data["status"] == "idle"
    steady_ids = [e.id for e in steady.events if e.id is not None]
    assert [e.id for e in resumed.events if e.id is not None] == [
        i for i in steady_ids if i > last_id
    ]


def test_a_resume_point_older_than_retention_starts_with_resync(
    launch_server: Callable[..., Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server = launch_server(OMNIGENT_EVENT_RETENTION="20")
    # One event per word, so the turn outlasts the retention (text is coalesced otherwise).
    runner_id = launch_runner(server, env={"OMNIGENT_RUNNER_DELTA_INTERVAL_MS": "0"}).runner_id
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner_id)
    mock_llm.configure([{"text": " ".join(f"w{i}" for i in range(150)), "stream": True}])
    accepted = send_message(server, session_id, "many deltas").json()
    wait_turn(server, session_id, accepted["response_id"])

    reader = StreamReader(server, session_id, last_event_id=1, until=is_final_idle)
    reader.wait()
    assert reader.types()[:2] == ["session.heartbeat", "session.resync"]
    ids = [e.id for e in reader.events if e.id is not None]
    assert ids[0] > 2 and ids == list(range(ids[0], ids[0] + len(ids)))
    assert len(ids) <= 20 + 100
    assert reader.events[-1].data["status"] == "idle"
