"""The proxy of the lost-command test (testing/frame_drop_proxy.py): every frame the
server sends reaches the client whole, whatever its length, except the one chosen."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from testing.frame_drop_proxy import FrameDropProxy

pytestmark = pytest.mark.timeout(30)

# Lengths in each of the three WebSocket length encodings (7 bits, 16 bits, 64 bits).
SENT = [
    {"type": "welcome"},
    {"type": "turn.start", "response_id": "resp_keep", "pad": "x" * 200},
    {"type": "turn.start", "response_id": "resp_lost"},
    {"type": "session.open", "pad": "y" * 70_000},
    {"type": "turn.start", "response_id": "resp_lost", "again": True},
]


async def test_only_the_chosen_frame_is_dropped_and_only_once() -> None:
    async def talk(ws: ServerConnection) -> None:
        await ws.recv()  # the client is there and the proxy armed
        for frame in SENT:
            await ws.send(json.dumps(frame))
        await ws.send("not json")
        await ws.wait_closed()

    # As daphne: no permessage-deflate, so frames cross the proxy as they are.
    async with serve(talk, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        proxy = FrameDropProxy(port).start()
        try:
            proxy.drop_next(lambda frame: frame["response_id"] == "resp_lost")
            async with connect(f"ws://127.0.0.1:{proxy.port}/tunnel") as ws:
                await ws.send("ready")
                async with asyncio.timeout(10):
                    received = [json.loads(await ws.recv()) for _ in range(len(SENT) - 1)]
                    assert await ws.recv() == "not json"
        finally:
            proxy.stop()
    assert received == [SENT[0], SENT[1], SENT[3], SENT[4]]
    assert proxy.dropped == [SENT[2]]
    assert proxy.tunnels == 1 and not proxy.armed
