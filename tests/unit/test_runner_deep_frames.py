"""Server frames nesting too deep, through the real runner tunnel (issue 15, item 1).

The runner refuses a frame deeper than ``protocol.SERVER_FRAME_DEPTH`` (the deepest a
server may be configured to accept, plus the frame margin): a command gets its ``nack``
(``invalid_command``) at once, an ``rpc`` its error, and the tunnel keeps serving.
Before, ~1,000 levels raised ``RecursionError`` in the runner's receive loop.
"""

# The fixtures (server, executor, start_tunnel) come from the runner tunnel tests' module.
# ruff: noqa: F811

from __future__ import annotations

import pytest

from omnigent_runner import protocol

from .test_runner_tunnel import (  # noqa: F401  (fixtures)
    FakeServer,
    RecordingExecutor,
    StartTunnel,
    executor,
    handshake,
    recv_frame,
    round_trip,
    server,
    start_tunnel,
)

pytestmark = pytest.mark.timeout(30)


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("depth", [protocol.SERVER_FRAME_DEPTH + 1, 990, 5000])
async def test_a_too_deep_command_is_nacked_and_the_tunnel_keeps_serving(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor, depth: int
) -> None:
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await ws.send(
        '{"type": "turn.start", "id": "d1", "session_id": "s1", "response_id": "r1", '
        '"input": [{"type": "message", "deep": ' + nested(depth) + "}]}"
    )
    nack = await recv_frame(ws)
    assert (nack["type"], nack["id"], nack["error"]["code"]) == ("nack", "d1", "invalid_command")
    assert "deeper than" in nack["error"]["message"]
    await ws.send(
        '{"type": "rpc", "id": "d2", "method": "workspace.diff", "params": ' + nested(depth) + "}"
    )
    result = await recv_frame(ws)
    assert (result["type"], result["id"], result["ok"]) == ("rpc.result", "d2", False), result
    assert executor.calls == []
    await round_trip(ws)


async def test_a_deep_but_allowed_command_runs(
    server: FakeServer, start_tunnel: StartTunnel, executor: RecordingExecutor
) -> None:
    """A body at the server's deepest configurable limit, wrapped in a frame, still runs."""
    await start_tunnel()
    ws = await server.accept()
    await handshake(ws)
    await ws.send(
        '{"type": "turn.start", "id": "d3", "session_id": "s1", "response_id": "r1", '
        '"input": [{"type": "message", "deep": ' + nested(protocol.SERVER_FRAME_DEPTH - 4) + "}]}"
    )
    assert (await recv_frame(ws))["type"] == "ack"
    assert len(executor.calls) == 1
