"""Soak tests of the channel layers: idle longer than every timeout in the stack, then
streams, relays and commands at once; many turns across two processes; fail-over.

Timeouts these idle past (all shorter than ``SOAK_IDLE_S``): the Redis socket timeout
(15 s) and the layer's blocking receive (5 s), the tunnel heartbeat (20 s), the stream
heartbeat (15 s), the relay deadline (10 s), the reconnect grace (3 s here). Before the
scale-out fix, the tunnel consumer died 5 s into the idle period and a stream on the
process holding the tunnel received nothing live.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from testing.balancer import TcpBalancer
from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    StreamEvent,
    StreamReader,
    bind,
    create_session,
    is_final_idle,
    send_message,
    wait_turn,
    wait_until,
)

from .test_tunnel_e2e import WEATHER_TOOL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SOAK_IDLE_S = 35.0
CONCURRENT_TURNS = 20


def _call(call_id: str) -> dict:
    return {"tool_calls": [{"call_id": call_id, "name": "get_weather", "arguments": "{}"}]}


def _no_reconnect(runner: Runner) -> None:
    assert runner.process is not None
    log = runner.process.log()
    assert log.count("tunnel open to") == 1 and "reconnecting" not in log, log[-3000:]


def _wait_status(server: Server, session_id: str, status: str) -> None:
    with server.client() as client:
        wait_until(
            lambda: client.get(f"/v1/sessions/{session_id}").json()["status"] == status,
            deadline_s=60,
            what=f"session {session_id} to be {status}",
        )


def _answer(server: Server, session_id: str, call_id: str) -> httpx.Response:
    with server.client() as client:
        return client.post(
            f"/v1/sessions/{session_id}/events",
            json={"type": "function_call_output", "data": {"call_id": call_id, "output": "7"}},
        )


def _assert_gap_free(events: list[StreamEvent]) -> list[int]:
    ids = [event.id for event in events if event.id is not None]
    assert ids, "no numbered events"
    assert ids == list(range(ids[0], ids[0] + len(ids))), ids
    return ids


def _replay(server: Server, session_id: str, upto: int) -> list[tuple[int | None, str, object]]:
    """The log from the start up to event ``upto``, read back through ``server``."""
    reader = StreamReader(
        server, session_id, last_event_id=0, until=lambda event: (event.id or 0) >= upto
    )
    reader.wait()
    return reader.payloads()


def _idle_then_relay_turn(server: Server, runner: Runner, session_id: str) -> None:
    """Idle past every timeout, then a turn whose client tool result is relayed."""
    time.sleep(SOAK_IDLE_S)  # deliberately idle: the point of the test
    _no_reconnect(runner)
    accepted = send_message(server, session_id, "after the idle", tools=[WEATHER_TOOL])
    assert accepted.status_code == 202, accepted.text
    _wait_status(server, session_id, "waiting")
    forwarded = _answer(server, session_id, "call_idle")
    assert forwarded.status_code == 202, forwarded.text
    turn = wait_turn(server, session_id, accepted.json()["response_id"])
    assert turn["status"] == "completed", turn


@pytest.mark.postgres
@pytest.mark.redis
def test_idle_tunnel_then_streams_relays_and_commands_on_both_processes(
    two_servers: tuple[Server, Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server_a, server_b = two_servers
    runner = launch_runner(server_a)
    stalled = launch_runner(server_a)  # its relays will wait on process A
    mock_llm.configure([_call("call_a"), _call("call_b"), {"text": "both answered"}])
    session_id = create_session(server_b, make_bundle())
    bind(server_b, session_id, runner.runner_id)
    stalled_session = create_session(server_a, make_bundle())
    bind(server_a, stalled_session, stalled.runner_id)

    # One subscriber on the process holding the tunnel, one on the other.
    watchers = [StreamReader(server, session_id, until=is_final_idle) for server in two_servers]
    for watcher in watchers:
        watcher.wait_for(lambda event: event.type == "session.heartbeat")

    time.sleep(SOAK_IDLE_S)  # deliberately idle: the point of the test
    _no_reconnect(runner)

    # A relay that waits on process A for its whole deadline (the runner is stopped).
    assert stalled.process is not None
    stalled.process.popen.send_signal(signal.SIGSTOP)
    waiting: dict[str, httpx.Response] = {}
    waiter = threading.Thread(
        target=lambda: waiting.update(response=send_message(server_a, stalled_session, "hi")),
        daemon=True,
    )
    waiter.start()
    try:
        # Commands on A while A's streams and that relay wait, then on B.
        accepted = send_message(server_a, session_id, "two calls", tools=[WEATHER_TOOL])
        assert accepted.status_code == 202, accepted.text
        _wait_status(server_a, session_id, "waiting")
        forwarded = _answer(server_a, session_id, "call_a")
        assert forwarded.status_code == 202, forwarded.text
        assert waiter.is_alive(), "the stalled relay should still be waiting"
        _wait_status(server_b, session_id, "waiting")
        forwarded = _answer(server_b, session_id, "call_b")
        assert forwarded.status_code == 202, forwarded.text
        turn = wait_turn(server_b, session_id, accepted.json()["response_id"])
        assert turn["status"] == "completed", turn
    finally:
        waiter.join(timeout=60)
        stalled.process.popen.send_signal(signal.SIGCONT)
    assert waiting["response"].status_code == 503, waiting["response"].text
    assert waiting["response"].json()["error"]["code"] == "runner_unavailable"

    streamed = [watcher.wait() for watcher in watchers]
    assert "response.completed" in [event.type for event in streamed[0]]
    ids = _assert_gap_free(streamed[0])
    assert watchers[0].payloads() == watchers[1].payloads()
    replayed = [entry for entry in _replay(server_a, session_id, ids[-1]) if entry[0] in set(ids)]
    assert replayed == watchers[0].payloads()
    _no_reconnect(runner)


@pytest.mark.postgres
@pytest.mark.redis
def test_twenty_concurrent_turns_through_alternating_processes(
    two_servers: tuple[Server, Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    runner = launch_runner(two_servers[0])
    sessions: list[tuple[Server, str]] = []
    for index in range(CONCURRENT_TURNS):
        server = two_servers[index % 2]
        session_id = create_session(server, make_bundle())
        bind(server, session_id, runner.runner_id)
        sessions.append((server, session_id))

    def one_turn(entry: tuple[Server, str]) -> dict:
        server, session_id = entry
        accepted = send_message(server, session_id, "hello")
        assert accepted.status_code == 202, accepted.text
        other = two_servers[1] if server is two_servers[0] else two_servers[0]
        return wait_turn(other, session_id, accepted.json()["response_id"], deadline_s=120)

    with ThreadPoolExecutor(max_workers=CONCURRENT_TURNS) as pool:
        turns = list(pool.map(one_turn, sessions))
    assert [turn["status"] for turn in turns] == ["completed"] * CONCURRENT_TURNS
    for server, session_id in sessions:
        with server.client() as client:
            items = client.get(f"/v1/sessions/{session_id}/items").json()["data"]
        assert [item["type"] for item in items] == ["message", "message"], items
    _no_reconnect(runner)


@pytest.mark.postgres
@pytest.mark.redis
def test_killing_the_tunnel_process_mid_turn_fails_over_without_loss_or_duplicates(
    two_servers: tuple[Server, Server],
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    server_a, server_b = two_servers
    balancer = TcpBalancer(
        [("127.0.0.1", int(server.url.rsplit(":", 1)[1])) for server in two_servers]
    ).start()
    runner: Runner | None = None
    try:
        runner = launch_runner(server_b, via_url=balancer.url)
        runner_id = runner.runner_id
        assert balancer.routed[-1] == 0, "the tunnel should start on process A"
        mock_llm.configure(
            [_call("call_before"), {"text": "finished after the fail-over", "delay_s": 3}]
        )
        session_id = create_session(server_b, make_bundle())
        bind(server_b, session_id, runner_id)
        watcher = StreamReader(server_b, session_id, until=is_final_idle)
        watcher.wait_for(lambda event: event.type == "session.heartbeat")
        accepted = send_message(server_b, session_id, "survive", tools=[WEATHER_TOOL])
        assert accepted.status_code == 202, accepted.text
        _wait_status(server_b, session_id, "waiting")
        assert _answer(server_b, session_id, "call_before").status_code == 202
        # The runner is now inside the slow LLM call: kill the process holding its tunnel.
        wait_until(lambda: len(mock_llm.requests) >= 2, deadline_s=30, what="the second LLM call")
        server_a.process.kill()

        turn = wait_turn(server_b, session_id, accepted.json()["response_id"], deadline_s=90)
        assert turn["status"] == "completed", turn
        assert balancer.routed[-1] == 1, "the runner should have reconnected to process B"
        streamed = watcher.wait()
    finally:
        if runner is not None and runner.process is not None:
            runner.process.stop()
        balancer.stop()

    with server_b.client() as client:
        items = client.get(f"/v1/sessions/{session_id}/items").json()["data"]
    assert [(item["type"], item.get("call_id")) for item in items] == [
        ("message", None),
        ("function_call", "call_before"),
        ("function_call_output", "call_before"),
        ("message", None),
    ], items
    assert len({item["id"] for item in items}) == len(items)
    ids = _assert_gap_free(streamed)
    replayed = _replay(server_b, session_id, ids[-1])
    _assert_gap_free([StreamEvent(seq, kind, data) for seq, kind, data in replayed])
    assert [entry for entry in replayed if entry[0] in set(ids)] == watcher.payloads()
    done = [
        data["item"]["id"]
        for _, kind, data in replayed
        if kind == "response.output_item.done" and data["item"].get("status") != "action_required"
    ]
    assert len(done) == len(set(done)), done


def test_embedded_layer_idle_tunnel_then_relay(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    mock_llm.configure([_call("call_idle"), {"text": "still here"}])
    session_id = create_session(server, make_bundle())
    bind(server, session_id, runner.runner_id)
    _idle_then_relay_turn(server, runner, session_id)
    _no_reconnect(runner)
