"""The runner's tunnel client against a scripted in-process WebSocket server.

The fake server and the recording executor exist only here: they let each test play the
server's side of tunnel.md frame by frame and check exactly what the runner sends and
which executor calls it makes. Every wait has a deadline; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from omnigent_runner import PROTOCOL_VERSION, RUNNER_VERSION
from omnigent_runner.agent import AgentExecutor
from omnigent_runner.config import RunnerConfig
from omnigent_runner.executor import CommandRejected, EventSink
from omnigent_runner.identity import derive_runner_id
from omnigent_runner.protocol import AgentRef, BudgetLine, Budgets, PolicyRule, Pong, Verdict
from omnigent_runner.tunnel import TOKEN_HEADER, RunnerTunnel

pytestmark = pytest.mark.timeout(30)

TOKEN = "tunnel-test-token-0123456789"
RUNNER_ID = derive_runner_id(TOKEN)
REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 5.0


# --------------------------------------------------------------------- fakes


class RecordingExecutor:
    """Records every call; ``errors[method]`` makes that method raise."""

    def __init__(self) -> None:
        self.sink: EventSink | None = None
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.open_ids: list[str] = []
        self.errors: dict[str, Exception] = {}
        self.rpc_results: dict[str, Any] = {}
        self.shutdowns = 0

    def bind(self, sink: EventSink) -> None:
        self.sink = sink

    def open_session_ids(self) -> list[str]:
        return list(self.open_ids)

    async def _record(self, name: str, /, **kwargs: Any) -> None:
        self.calls.append((name, kwargs))
        if name in self.errors:
            raise self.errors[name]

    async def open_session(
        self, *, session_id: str, agent: AgentRef, history: list[dict[str, Any]]
    ) -> None:
        await self._record("open_session", session_id=session_id, agent=agent, history=history)

    async def start_turn(
        self,
        *,
        session_id: str,
        response_id: str,
        input: list[dict[str, Any]],
        tools: list[dict[str, Any]],
    ) -> None:
        await self._record(
            "start_turn", session_id=session_id, response_id=response_id, input=input, tools=tools
        )

    async def tool_result(self, *, session_id: str, call_id: str, output: str) -> None:
        await self._record("tool_result", session_id=session_id, call_id=call_id, output=output)

    async def update_policies(self, *, session_id: str, rules: list[PolicyRule]) -> None:
        await self._record("update_policies", session_id=session_id, rules=rules)

    async def update_budgets(self, *, session_id: str, budgets: Budgets) -> None:
        await self._record("update_budgets", session_id=session_id, budgets=budgets)

    async def approval_verdict(self, *, session_id: str, verdict: Verdict) -> None:
        await self._record("approval_verdict", session_id=session_id, verdict=verdict)

    async def interrupt(self, *, session_id: str) -> None:
        await self._record("interrupt", session_id=session_id)

    async def close_session(self, *, session_id: str) -> None:
        await self._record("close_session", session_id=session_id)

    async def rpc(self, *, method: str, params: dict[str, Any]) -> Any:
        await self._record("rpc", method=method, params=params)
        return self.rpc_results.get(method)

    async def shutdown(self) -> None:
        self.shutdowns += 1


class FakeServer:
    """Accepts tunnels and hands each connection to the test, which scripts it."""

    def __init__(self) -> None:
        self.connections: asyncio.Queue[ServerConnection] = asyncio.Queue()
        self.refuse_status: int | None = None
        self.port = 0

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if self.refuse_status is not None:
            return connection.respond(self.refuse_status, "refused\n")
        return None

    async def handler(self, ws: ServerConnection) -> None:
        await self.connections.put(ws)
        await ws.wait_closed()

    async def accept(self) -> ServerConnection:
        return await asyncio.wait_for(self.connections.get(), DEADLINE)


async def recv_frame(ws: ServerConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), DEADLINE))


async def send_frame(ws: ServerConnection, frame: dict[str, Any]) -> None:
    await ws.send(json.dumps(frame))


async def handshake(
    ws: ServerConnection,
    sessions: list[dict[str, Any]] | None = None,
    heartbeat_s: float = 20,
    event_batches: bool | None = None,
) -> dict[str, Any]:
    """Play the server's side of hello/welcome; return the runner's hello. Without
    ``event_batches`` the welcome is an older server's, which takes single events."""
    hello = await recv_frame(ws)
    assert hello["type"] == "hello"
    welcome: dict[str, Any] = {
        "type": "welcome",
        "runner_id": RUNNER_ID,
        "heartbeat_s": heartbeat_s,
        "sessions": sessions or [],
    }
    if event_batches is not None:
        welcome["event_batches"] = event_batches
    await send_frame(ws, welcome)
    return hello


async def round_trip(ws: ServerConnection, ts: int = 1) -> None:
    """Ping and wait for the pong: frames are handled in order, so everything sent
    before the ping has been handled by then."""
    await send_frame(ws, {"type": "ping", "ts": ts})
    assert await recv_frame(ws) == {"type": "pong", "ts": ts}


# ------------------------------------------------------------------ fixtures


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    fake = FakeServer()
    async with serve(fake.handler, "127.0.0.1", 0, process_request=fake.process_request) as srv:
        fake.port = srv.sockets[0].getsockname()[1]
        yield fake


@pytest.fixture
def executor() -> RecordingExecutor:
    return RecordingExecutor()


StartTunnel = Callable[..., Awaitable[tuple[RunnerTunnel, "asyncio.Task[int]"]]]


@pytest.fixture
async def start_tunnel(
    server: FakeServer, executor: RecordingExecutor, tmp_path: Path
) -> AsyncIterator[StartTunnel]:
    started: list[tuple[RunnerTunnel, asyncio.Task[int]]] = []

    async def start(
        *, parent_pid: int | None = None, run: bool = True, **kwargs: Any
    ) -> tuple[RunnerTunnel, asyncio.Task[int]]:
        config = RunnerConfig(
            server_url=f"http://127.0.0.1:{server.port}",
            token=TOKEN,
            runner_id=RUNNER_ID,
            workspace=tmp_path,
            parent_pid=parent_pid,
        )
        options: dict[str, Any] = {
            "workspace_info": {"root": str(tmp_path), "vcs": "none"},
            "capabilities": {"isolate_sessions": False},
            "backoff_initial": 0.01,
            "backoff_max": 0.05,
            "open_timeout": 2.0,
            "close_timeout": 1.0,
            **kwargs,
        }
        tunnel = RunnerTunnel(config, executor, **options)
        task = asyncio.create_task(tunnel.run())
        started.append((tunnel, task))
        return tunnel, task

    yield start
    for tunnel, task in started:
        await asyncio.wait_for(tunnel.stop(), DEADLINE)
        await asyncio.wait_for(task, DEADLINE)


# --------------------------------------------------------------- handshake


async def test_hello_carries_identity_workspace_and_open_sessions(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor, tmp_path: Path
) -> None:
    executor.open_ids = ["sess_held"]
    await start_tunnel()
    ws = await server.accept()
    assert ws.request is not None
    assert ws.request.path == f"/v1/runners/{RUNNER_ID}/tunnel"
    assert ws.request.headers[TOKEN_HEADER] == TOKEN
    hello = await handshake(ws)
    assert hello == {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "runner_version": RUNNER_VERSION,
        "workspace": {"root": str(tmp_path), "vcs": "none"},
        "capabilities": {"isolate_sessions": False, "event_batches": True},
        "open_sessions": ["sess_held"],
        "max_turns": 8,  # OMNIGENT_RUNNER_MAX_TURNS's default
    }
    assert executor.sink is not None


async def test_ping_is_answered_with_pong(server: FakeServer, start_tunnel: StartTunnel) -> None:
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await send_frame(ws, {"type": "ping", "ts": 1234.5})
    assert await recv_frame(ws) == {"type": "pong", "ts": 1234.5}


# ------------------------------------------------------------------ commands


async def test_commands_are_dispatched_and_acked_in_order(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    agent = {"id": "agent_1", "version": 2, "bundle_b64": "UEsDBA=="}
    history = [{"type": "message", "role": "user", "content": "hi"}]
    rule: dict[str, Any] = {
        "name": "ask",
        "tools": ["sys_os_*"],
        "action": "ask",
        "ask_timeout": 60.0,
    }
    verdict: dict[str, Any] = {
        "elicitation_id": "elicit_1",
        "response_id": "resp_0",
        "call_id": "call_0",
        "action": "decline",
        "reason": "no",
        "resolved_by": "alice",
    }
    commands = [
        {
            "type": "session.open",
            "id": "c1",
            "session_id": "s1",
            "agent": agent,
            "history": history,
            "policies": [rule],
            "verdicts": [verdict],
        },
        {
            "type": "turn.start",
            "id": "c2",
            "session_id": "s1",
            "response_id": "resp_1",
            "input": [{"type": "message", "role": "user", "content": "go"}],
            "tools": [{"type": "function", "name": "pick"}],
        },
        {
            "type": "tool_result",
            "id": "c3",
            "session_id": "s1",
            "call_id": "call_1",
            "output": "42",
        },
        {"type": "turn.interrupt", "id": "c4", "session_id": "s1"},
        {"type": "policy.update", "id": "c5", "session_id": "s1", "rules": []},
        {
            "type": "approval.verdict",
            "id": "c6",
            "session_id": "s1",
            "elicitation_id": "elicit_2",
            "response_id": "resp_1",
            "call_id": "call_1",
            "action": "accept",
        },
        {"type": "session.close", "id": "c7", "session_id": "s1"},
    ]
    for command in commands:
        await send_frame(ws, command)
    for command in commands:
        assert await recv_frame(ws) == {"type": "ack", "id": command["id"]}
    assert executor.calls == [
        (
            "open_session",
            {"session_id": "s1", "agent": AgentRef(**agent), "history": history},
        ),
        ("update_policies", {"session_id": "s1", "rules": [PolicyRule(**rule)]}),
        ("approval_verdict", {"session_id": "s1", "verdict": Verdict(**verdict)}),
        (
            "start_turn",
            {
                "session_id": "s1",
                "response_id": "resp_1",
                "input": commands[1]["input"],
                "tools": commands[1]["tools"],
            },
        ),
        ("tool_result", {"session_id": "s1", "call_id": "call_1", "output": "42"}),
        ("interrupt", {"session_id": "s1"}),
        ("update_policies", {"session_id": "s1", "rules": []}),
        (
            "approval_verdict",
            {
                "session_id": "s1",
                "verdict": Verdict(
                    elicitation_id="elicit_2",
                    response_id="resp_1",
                    call_id="call_1",
                    action="accept",
                ),
            },
        ),
        ("close_session", {"session_id": "s1"}),
    ]


async def test_budgets_reach_the_executor_and_a_budgets_only_update_keeps_the_rules(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    """usage.md: budgets come in session.open, turn.start and policy.update; a frame
    without them changes nothing, and a policy.update with only budgets keeps the rules."""
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    line = {"scope": "session", "limit_nano": 10, "spent_nano": 3}
    user_line = {"scope": "user", "limit_nano": 50, "spent_nano": 7, "on_budget": "deny"}
    agent = {"id": "a1", "version": 1, "bundle_b64": ""}
    commands = [
        {
            "type": "session.open",
            "id": "b1",
            "session_id": "s1",
            "agent": agent,
            "budgets": {"session": line},
        },
        {
            "type": "turn.start",
            "id": "b2",
            "session_id": "s1",
            "response_id": "r1",
            "budgets": {"session": line, "user": user_line},
        },
        {"type": "policy.update", "id": "b3", "session_id": "s1", "budgets": {"user": user_line}},
        {"type": "turn.start", "id": "b4", "session_id": "s1", "response_id": "r2"},
    ]
    for command in commands:
        await send_frame(ws, command)
    for command in commands:
        assert await recv_frame(ws) == {"type": "ack", "id": command["id"]}
    session_line = BudgetLine(scope="session", limit_nano=10, spent_nano=3)
    user = BudgetLine(scope="user", limit_nano=50, spent_nano=7, on_budget="deny")
    assert [(name, kwargs.get("budgets")) for name, kwargs in executor.calls] == [
        ("open_session", None),
        ("update_policies", None),
        ("update_budgets", Budgets(session=session_line)),
        ("update_budgets", Budgets(session=session_line, user=user)),
        ("start_turn", None),
        ("update_budgets", Budgets(user=user)),
        ("start_turn", None),
    ]


async def test_rejected_and_failing_commands_are_nacked(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    executor.errors["start_turn"] = CommandRejected("session_busy", "a turn is running")
    executor.errors["interrupt"] = RuntimeError("boom")
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await send_frame(
        ws, {"type": "turn.start", "id": 7, "session_id": "s1", "response_id": "r", "input": []}
    )
    assert await recv_frame(ws) == {
        "type": "nack",
        "id": 7,
        "error": {"code": "session_busy", "message": "a turn is running"},
    }
    await send_frame(ws, {"type": "turn.interrupt", "id": 8, "session_id": "s1"})
    assert await recv_frame(ws) == {
        "type": "nack",
        "id": 8,
        "error": {"code": "internal_error", "message": "boom"},
    }
    await send_frame(ws, {"type": "session.open", "id": 9, "agent": {}})  # no session_id
    nack = await recv_frame(ws)
    assert nack["type"] == "nack" and nack["id"] == 9
    assert nack["error"]["code"] == "invalid_command"
    await round_trip(ws)  # the tunnel is still serving


async def test_unknown_and_invalid_commands_are_nacked_with_a_clear_code(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    """docs/protocol.md: a command this runner cannot run is answered at once, never
    left to the server's deadline; the code says why."""
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    # A type this runner does not know (a newer server's command).
    await send_frame(ws, {"type": "workspace.snapshot", "id": "u1", "session_id": "s1"})
    nack = await recv_frame(ws)
    assert nack["type"] == "nack" and nack["id"] == "u1", nack
    assert nack["error"]["code"] == "unknown_command"
    assert "workspace.snapshot" in nack["error"]["message"]
    # A known command whose rule is not a rule (an unknown action).
    rule = {"name": "ask_on_os_tools", "tools": ["sys_os_*"], "action": "maybe"}
    await send_frame(ws, {"type": "policy.update", "id": "u2", "session_id": "s1", "rules": [rule]})
    nack = await recv_frame(ws)
    assert (nack["id"], nack["error"]["code"]) == ("u2", "invalid_command"), nack
    # A known command with a field of the wrong type.
    await send_frame(ws, {"type": "turn.start", "id": "u3", "session_id": "s1", "response_id": 5})
    nack = await recv_frame(ws)
    assert (nack["id"], nack["error"]["code"]) == ("u3", "invalid_command"), nack
    assert "response_id" in nack["error"]["message"]
    # An rpc without a method gets its error as an rpc.result, like any rpc failure.
    await send_frame(ws, {"type": "rpc", "id": "u4", "params": {}})
    result = await recv_frame(ws)
    assert (result["type"], result["id"], result["ok"]) == ("rpc.result", "u4", False), result
    assert result["error"]["code"] == "invalid_command"
    assert "method" in result["error"]["message"]
    assert executor.calls == []
    await round_trip(ws)  # the tunnel is still serving


async def test_rpc_results(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    executor.rpc_results["workspace.diff"] = {"diff": "+x"}
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await send_frame(
        ws, {"type": "rpc", "id": "r1", "method": "workspace.diff", "params": {"path": "a"}}
    )
    assert await recv_frame(ws) == {
        "type": "rpc.result",
        "id": "r1",
        "ok": True,
        "result": {"diff": "+x"},
    }
    assert executor.calls[-1] == ("rpc", {"method": "workspace.diff", "params": {"path": "a"}})

    executor.errors["rpc"] = CommandRejected("unknown_method", "no such method")
    await send_frame(ws, {"type": "rpc", "id": "r2", "method": "nope", "params": {}})
    assert await recv_frame(ws) == {
        "type": "rpc.result",
        "id": "r2",
        "ok": False,
        "error": {"code": "unknown_method", "message": "no such method"},
    }


async def test_an_unexpected_os_error_is_answered_without_the_machines_path(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    """An ``OSError``'s text names the absolute path; the server may show the answer to an
    API client, so the rpc error and a command's nack carry only the reason."""
    secret = "/home/someone/projects/ws/" + "n" * 300
    executor.errors["rpc"] = OSError(36, "File name too long", secret)
    executor.errors["interrupt"] = FileNotFoundError(2, "No such file or directory", secret)
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await send_frame(ws, {"type": "rpc", "id": "r1", "method": "workspace.read", "params": {}})
    assert await recv_frame(ws) == {
        "type": "rpc.result",
        "id": "r1",
        "ok": False,
        "error": {"code": "internal_error", "message": "File name too long"},
    }
    await send_frame(ws, {"type": "turn.interrupt", "id": 2, "session_id": "s1"})
    assert await recv_frame(ws) == {
        "type": "nack",
        "id": 2,
        "error": {"code": "internal_error", "message": "No such file or directory"},
    }


async def test_malformed_and_binary_frames_are_ignored(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await ws.send("{not json")
    await ws.send(b"\x00\x01binary")
    await ws.send("[1, 2, 3]")
    await send_frame(ws, {"no": "type"})
    await send_frame(ws, {"type": "mystery"})
    await send_frame(ws, {"type": "event.ack", "session_id": 5, "seq": "x"})
    await send_frame(ws, {"type": "turn.interrupt", "session_id": "s"})  # no id
    await round_trip(ws, ts=99)
    await send_frame(ws, {"type": "session.close", "id": "after", "session_id": "s1"})
    assert await recv_frame(ws) == {"type": "ack", "id": "after"}
    assert executor.calls == [("close_session", {"session_id": "s1"})]


# -------------------------------------------------------------------- events


async def test_unacked_events_are_resent_after_reconnect_and_acked_ones_are_not(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    tunnel, _ = await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    tunnel.emit("s1", {"type": "response.created", "response_id": "r1"})
    tunnel.emit("s1", {"type": "response.completed", "response_id": "r1"})
    first = [await recv_frame(ws), await recv_frame(ws)]
    assert [(f["type"], f["session_id"], f["seq"]) for f in first] == [
        ("event", "s1", 1),
        ("event", "s1", 2),
    ]
    assert first[0]["event"] == {"type": "response.created", "response_id": "r1"}
    await ws.close(1011, "server restarting")  # before acknowledging anything

    ws = await server.accept()
    await handshake(ws, sessions=[{"session_id": "s1", "last_acked_seq": 0}])
    again = [await recv_frame(ws), await recv_frame(ws)]
    assert again == first
    await send_frame(ws, {"type": "event.ack", "session_id": "s1", "seq": 2})
    await round_trip(ws)
    await ws.close(1011)

    ws = await server.accept()
    await handshake(ws, sessions=[{"session_id": "s1", "last_acked_seq": 2}])
    await round_trip(ws)  # a resend would have arrived before the pong


async def test_welcome_resync_continues_numbering_after_a_runner_restart(
    server: FakeServer, start_tunnel: StartTunnel
) -> None:
    tunnel, _ = await start_tunnel()
    ws = await server.accept()
    await handshake(ws, sessions=[{"session_id": "s9", "last_acked_seq": 5}])
    await round_trip(ws)
    tunnel.emit("s9", {"type": "session.status", "status": "running", "response_id": "r"})
    frame = await recv_frame(ws)
    assert (frame["session_id"], frame["seq"]) == ("s9", 6)


async def test_events_emitted_while_disconnected_are_delivered_after_connect(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    server.refuse_status = 503  # retryable: the runner keeps trying
    tunnel, task = await start_tunnel()
    assert executor.sink is tunnel
    tunnel.emit("s1", {"type": "response.created", "response_id": "r1"})
    executor.sink.emit("s2", {"type": "response.created", "response_id": "r2"})
    assert not task.done()
    server.refuse_status = None
    ws = await server.accept()
    await handshake(ws)
    frames = [await recv_frame(ws), await recv_frame(ws)]
    assert [(f["session_id"], f["seq"]) for f in frames] == [("s1", 1), ("s2", 1)]


# ------------------------------------------------------------- event batches


def created(response_id: str) -> dict[str, Any]:
    return {"type": "response.created", "response_id": response_id}


def emit_created(tunnel: RunnerTunnel, *turns: tuple[str, str]) -> None:
    """``response.created`` for each ``(session_id, response_id)``, in one step of the loop."""
    for session_id, response_id in turns:
        tunnel.emit(session_id, created(response_id))


async def connected_with_batches(
    server: FakeServer, start_tunnel: StartTunnel
) -> tuple[RunnerTunnel, ServerConnection]:
    """A runner welcomed by a server that takes ``events`` frames, its sender idle."""
    tunnel, _ = await start_tunnel()
    ws = await server.accept()
    await handshake(ws, event_batches=True)
    await round_trip(ws)
    return tunnel, ws


async def test_events_queued_together_leave_as_one_batch_in_order(
    server: FakeServer, start_tunnel: StartTunnel
) -> None:
    tunnel, ws = await connected_with_batches(server, start_tunnel)
    # Emitted in one step of the loop: the sender finds all three queued.
    emit_created(tunnel, ("s1", "r1"), ("s2", "r2"))
    tunnel.emit("s1", {"type": "response.completed", "response_id": "r1"})
    batch = await recv_frame(ws)
    assert batch["type"] == "events"
    assert [(f["type"], f["session_id"], f["seq"]) for f in batch["events"]] == [
        ("event", "s1", 1),
        ("event", "s2", 1),
        ("event", "s1", 2),
    ]
    assert batch["events"][1]["event"] == created("r2")
    # A lone event leaves at once, as a plain event frame.
    tunnel.emit("s2", {"type": "response.completed", "response_id": "r2"})
    alone = await recv_frame(ws)
    assert (alone["type"], alone["session_id"], alone["seq"]) == ("event", "s2", 2)


async def test_an_older_server_gets_one_event_frame_per_event(
    server: FakeServer, start_tunnel: StartTunnel
) -> None:
    tunnel, _ = await start_tunnel()
    ws = await server.accept()
    await handshake(ws)  # no event_batches in the welcome
    await round_trip(ws)
    for n in range(3):
        tunnel.emit("s1", created(f"r{n}"))
    frames = [await recv_frame(ws) for _ in range(3)]
    assert [(f["type"], f["seq"]) for f in frames] == [("event", 1), ("event", 2), ("event", 3)]


async def test_other_frames_keep_their_place_between_batched_events(
    server: FakeServer, start_tunnel: StartTunnel
) -> None:
    """A frame queued between events (here a pong) leaves between them."""
    tunnel, ws = await connected_with_batches(server, start_tunnel)
    # All of it is queued in one step of the loop, before the sender wakes.
    emit_created(tunnel, ("s1", "r1"), ("s1", "r2"))
    queue = tunnel._live
    assert queue is not None
    queue.put_nowait(Pong(ts=5))
    emit_created(tunnel, ("s1", "r3"), ("s1", "r4"))
    got = [await recv_frame(ws) for _ in range(3)]
    assert [f["type"] for f in got] == ["events", "pong", "events"]
    assert [f["seq"] for f in got[0]["events"]] == [1, 2]
    assert [f["seq"] for f in got[2]["events"]] == [3, 4]


async def test_event_acks_acknowledge_several_sessions_at_once(
    server: FakeServer, start_tunnel: StartTunnel
) -> None:
    tunnel, ws = await connected_with_batches(server, start_tunnel)
    emit_created(tunnel, ("s1", "r1"), ("s2", "r2"), ("s3", "r3"))
    assert len((await recv_frame(ws))["events"]) == 3
    await send_frame(
        ws,
        {
            "type": "event.acks",
            "acks": [
                {"type": "event.ack", "session_id": "s1", "seq": 1},
                {"type": "event.ack", "session_id": "s3", "seq": 1},
            ],
        },
    )
    await round_trip(ws)
    await ws.close(1011)
    # Only the event no ack covered is resent after the reconnect.
    ws = await server.accept()
    await handshake(ws, event_batches=True)
    resent = await recv_frame(ws)
    assert (resent["type"], resent["session_id"], resent["seq"]) == ("event", "s2", 1)


async def test_a_reconnect_resends_the_backlog_in_batches(
    server: FakeServer, start_tunnel: StartTunnel
) -> None:
    server.refuse_status = 503
    tunnel, _ = await start_tunnel()
    for n in range(600):  # more than one batch holds
        tunnel.emit(f"s{n % 3}", created(f"r{n}"))
    server.refuse_status = None
    ws = await server.accept()
    await handshake(ws, event_batches=True)
    seen: list[tuple[str, int]] = []
    batches = 0
    while len(seen) < 600:
        frame = await recv_frame(ws)
        assert frame["type"] == "events"
        batches += 1
        seen += [(f["session_id"], f["seq"]) for f in frame["events"]]
    assert batches == 3  # 256 + 256 + 88
    for session in ("s0", "s1", "s2"):
        assert [seq for s, seq in seen if s == session] == list(range(1, 201))


# ------------------------------------------------------------------ closures


@pytest.mark.parametrize("code", [4001, 4002])
async def test_fatal_close_codes_end_the_runner(
    code: int,
    server: FakeServer,
    start_tunnel: StartTunnel,
    executor: RecordingExecutor,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="runners")
    _, task = await start_tunnel()
    ws = await server.accept()
    await recv_frame(ws)  # hello
    await ws.close(code, "refused")
    assert await asyncio.wait_for(task, DEADLINE) != 0
    assert str(code) in caplog.text
    assert executor.shutdowns == 1
    assert server.connections.empty()


async def test_refused_upgrade_is_fatal_and_never_logs_the_token(
    server: FakeServer, start_tunnel: StartTunnel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="runners")
    server.refuse_status = 403
    _, task = await start_tunnel()
    assert await asyncio.wait_for(task, DEADLINE) == 2
    assert "HTTP 403" in caplog.text
    assert any(r.levelno == logging.ERROR for r in caplog.records)
    assert TOKEN not in caplog.text


async def test_replaced_connection_reconnects(
    server: FakeServer, start_tunnel: StartTunnel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runners")
    _, task = await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await ws.close(4000, "replaced")
    ws = await server.accept()
    await handshake(ws)
    await round_trip(ws)
    assert not task.done()
    assert "4000" in caplog.text


async def test_a_turn_start_sent_again_is_acknowledged_and_runs_once(
    server: FakeServer, tmp_path: Path
) -> None:
    """The server sends a ``turn.start`` again when it has no record of the runner's
    ack (a tunnel that closed on its way, docs/protocol.md): the real executor behind
    the tunnel acknowledges every copy, queued, running or finished, and runs the turn
    once. (Its bundle does not load, so the turn ends at once without a model.)"""
    config = RunnerConfig(
        server_url=f"http://127.0.0.1:{server.port}",
        token=TOKEN,
        runner_id=RUNNER_ID,
        workspace=tmp_path,
    )
    executor = AgentExecutor(workspace=tmp_path, env={})
    tunnel = RunnerTunnel(
        config,
        executor,
        workspace_info={"root": str(tmp_path), "vcs": "none"},
        backoff_initial=0.01,
        backoff_max=0.05,
    )
    task = asyncio.create_task(tunnel.run())
    try:
        ws = await server.accept()
        await handshake(ws)
        bundle = {"id": "agent_1", "version": 1, "bundle_b64": "anVuaw=="}
        start = {"type": "turn.start", "session_id": "s1", "response_id": "resp_1", "input": []}
        await send_frame(
            ws,
            {
                "type": "session.open",
                "id": "c1",
                "session_id": "s1",
                "agent": bundle,
                "history": [],
            },
        )
        for command_id in ("c2", "c3"):
            await send_frame(ws, {**start, "id": command_id})
        acks: list[str] = []
        events: list[dict[str, Any]] = []
        while not any(event["type"] == "response.failed" for event in events):
            frame = await recv_frame(ws)
            if frame["type"] == "ack":
                acks.append(frame["id"])
            elif frame["type"] == "event":
                events.append(frame["event"])
        await send_frame(ws, {**start, "id": "c4"})  # once more, after the turn's end
        await send_frame(ws, {"type": "ping", "ts": 1})
        while (frame := await recv_frame(ws))["type"] != "pong":
            if frame["type"] == "ack":
                acks.append(frame["id"])
            elif frame["type"] == "event":
                events.append(frame["event"])
        assert acks == ["c1", "c2", "c3", "c4"]
        ran = [event["type"] for event in events if event.get("response_id") == "resp_1"]
        assert ran.count("response.created") == 1 and ran.count("response.failed") == 1, ran
    finally:
        await asyncio.wait_for(tunnel.stop(), DEADLINE)
        await asyncio.wait_for(task, DEADLINE)


async def test_a_server_stopping_again_and_again_is_redialled_at_the_first_backoff_step(
    server: FakeServer, start_tunnel: StartTunnel
) -> None:
    """During a rolling restart a proxy can hand the new tunnel to the stopping process
    again (a kept-alive upstream connection), which closes it with 4005 before its
    welcome. Each 4005 means "another process is there": the next dial comes after the
    first backoff step, not after a delay that doubled with each of them (here 2^12
    times the first step, far past the deadline)."""
    _, task = await start_tunnel(backoff_max=600.0)
    for _ in range(12):
        ws = await server.accept()
        assert (await recv_frame(ws))["type"] == "hello"
        await ws.close(4005, "server stopping")
    ws = await server.accept()
    await handshake(ws)
    await round_trip(ws)
    assert not task.done()


async def test_silent_server_is_abandoned_after_three_heartbeats(
    server: FakeServer, start_tunnel: StartTunnel
) -> None:
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws, heartbeat_s=0.2)
    # Say nothing: after 0.6 s the runner gives up on this connection and dials again.
    await asyncio.wait_for(ws.wait_closed(), DEADLINE)
    ws = await server.accept()
    await handshake(ws)
    await round_trip(ws)


async def test_stop_closes_with_1000_and_run_returns_zero(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    tunnel, task = await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await round_trip(ws)
    await asyncio.wait_for(tunnel.stop(), DEADLINE)
    await asyncio.wait_for(ws.wait_closed(), DEADLINE)
    assert ws.close_code == 1000
    assert await asyncio.wait_for(task, DEADLINE) == 0
    assert executor.shutdowns == 1


async def test_runner_stops_when_its_parent_exits(
    server: FakeServer, start_tunnel: StartTunnel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runners")
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; sys.stdin.read()", stdin=subprocess.PIPE
    )
    try:
        _, task = await start_tunnel(parent_pid=parent.pid, parent_poll_s=0.05)
        ws = await server.accept()
        await handshake(ws)
        await round_trip(ws)
        assert not task.done()
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        await asyncio.wait_for(parent.wait(), DEADLINE)
    assert await asyncio.wait_for(task, DEADLINE) == 0
    assert f"parent process {parent.pid} exited" in caplog.text
    await asyncio.wait_for(ws.wait_closed(), DEADLINE)
    assert ws.close_code == 1000


# --------------------------------------------------------------- subprocesses


def _run_python(args: list[str], env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMNIGENT_", "RUNNER_"))}
    env.update(env_extra)
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_cli_rejects_a_mismatched_runner_id_without_printing_the_token(tmp_path: Path) -> None:
    result = _run_python(
        ["-m", "omnigent_runner"],
        {
            "OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN": TOKEN,
            "OMNIGENT_RUNNER_ID": "runner_token_" + "f" * 32,
            "OMNIGENT_RUNNER_WORKSPACE": str(tmp_path),
        },
    )
    assert result.returncode == 2
    assert "OMNIGENT_RUNNER_ID" in result.stderr
    assert TOKEN not in result.stderr
    assert TOKEN not in result.stdout


def test_tunnel_module_does_not_import_django() -> None:
    code = (
        "import sys\n"
        "import omnigent_runner.tunnel, omnigent_runner.__main__, omnigent_runner.identity\n"
        "assert not any(m == 'django' or m.startswith('django.') for m in sys.modules), "
        "sorted(m for m in sys.modules if m.startswith('django'))\n"
    )
    _assert_runs(code)


def test_startup_objects_are_frozen_out_of_full_collections() -> None:
    """Once the executor's modules are loaded (the ``openai`` SDK above all), what was
    loaded is frozen: full collections during turns no longer walk it."""
    code = (
        "import gc\n"
        "import omnigent_runner.agent  # what build_executor imports\n"
        "from omnigent_runner.__main__ import freeze_startup_objects\n"
        "import openai\n"
        "frozen = freeze_startup_objects()\n"
        "assert frozen > 10_000 and frozen == gc.get_freeze_count(), frozen\n"
        "gc.collect()\n"
        "walked = {id(o) for o in gc.get_objects(generation=2)}\n"
        "assert id(vars(openai)) not in walked\n"
        "assert id(vars(omnigent_runner.agent)) not in walked\n"
    )
    _assert_runs(code)


def _assert_runs(code: str) -> None:
    """``code`` runs to its end in a fresh interpreter (its asserts all hold)."""
    result = _run_python(["-c", code], {})
    assert result.returncode == 0, result.stderr


async def test_stop_while_disconnected_returns_zero(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    server.refuse_status = 503
    tunnel, task = await start_tunnel(backoff_initial=0.5, backoff_max=0.5)
    await asyncio.wait_for(tunnel.stop(), DEADLINE)
    assert await asyncio.wait_for(task, DEADLINE) == 0
    assert executor.shutdowns == 1


_CLI_WITH_FAKE_EXECUTOR = """
import sys
import omnigent_runner.__main__ as cli

class Executor:
    def bind(self, sink): pass
    def open_session_ids(self): return []
    async def shutdown(self): print("executor shut down", file=sys.stderr)

cli.build_executor = lambda config: Executor()
sys.exit(cli.main(sys.argv[1:]))
"""


async def test_cli_runs_the_tunnel_and_stops_cleanly_on_sigterm(
    server: FakeServer, tmp_path: Path
) -> None:
    (tmp_path / ".git").mkdir()
    workspace = tmp_path / "sub"
    workspace.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMNIGENT_", "RUNNER_"))}
    env.update(
        PYTHONPATH=str(REPO_ROOT),
        RUNNER_SERVER_URL=f"http://127.0.0.1:{server.port}",
        OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN=TOKEN,
        OMNIGENT_RUNNER_WORKSPACE=str(workspace),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CLI_WITH_FAKE_EXECUTOR,
        "--log-level",
        "DEBUG",
        cwd=REPO_ROOT,
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        ws = await server.accept()
        hello = await handshake(ws)
        assert hello["workspace"] == {
            "root": str(workspace.resolve()),
            "vcs": "git",
            "host": socket.gethostname(),
        }
        await round_trip(ws)
        proc.terminate()
        await asyncio.wait_for(ws.wait_closed(), DEADLINE)
        assert ws.close_code == 1000
        assert await asyncio.wait_for(proc.wait(), DEADLINE) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    stderr = (await proc.stderr.read()).decode()
    assert RUNNER_ID in stderr
    assert "executor shut down" in stderr
    assert TOKEN not in stderr


async def test_an_rpc_error_carries_its_http_status_and_a_slow_rpc_holds_nothing_up(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    """workspace.* rpc (files.md §2): the status reaches the server; a search that takes
    seconds runs beside the receive loop, so a ping behind it is answered first."""
    release = asyncio.Event()
    answered = executor.rpc

    async def rpc(*, method: str, params: dict[str, Any]) -> Any:
        if method == "workspace.search":
            await release.wait()
            return {"object": "list", "data": [], "truncated": False}
        if method == "workspace.read":
            raise CommandRejected("not_found", "'x' not found", status=404)
        return await answered(method=method, params=params)

    executor.rpc = rpc  # type: ignore[method-assign]
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await send_frame(ws, {"type": "rpc", "id": "s1", "method": "workspace.search", "params": {}})
    await round_trip(ws, ts=7)  # answered while the search waits
    await send_frame(ws, {"type": "rpc", "id": "r1", "method": "workspace.read", "params": {}})
    assert await recv_frame(ws) == {
        "type": "rpc.result",
        "id": "r1",
        "ok": False,
        "error": {"code": "not_found", "message": "'x' not found"},
        "status": 404,
    }
    release.set()
    result = await recv_frame(ws)
    assert (result["id"], result["ok"], result["result"]["truncated"]) == ("s1", True, False)
