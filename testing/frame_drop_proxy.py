"""A TCP proxy between the runner and the server that loses one command on purpose
while the tunnel stays up, as a full or restarting channel layer does (docs/testing.md).

It reads the server's WebSocket frames to the runner (unmasked, and uncompressed:
daphne accepts no ``permessage-deflate``) and forwards each whole, except the next text
frame whose JSON a test's predicate accepts (:meth:`FrameDropProxy.drop_next`), which is
dropped and recorded in :attr:`FrameDropProxy.dropped`. Bytes from the runner, and
connections that are not a WebSocket upgrade, are piped as they are. One asyncio loop
in a thread of its own; ``stop()`` closes everything.
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import Callable
from typing import Any

from .loop_server import LoopThreadServer

CHUNK = 65536
TEXT = 0x1

Predicate = Callable[[dict[str, Any]], bool]


class FrameDropProxy(LoopThreadServer):
    """``FrameDropProxy(port).start()``; point the runner at :attr:`url`."""

    name = "frame-drop proxy"

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        super().__init__()
        self.target = (target_host, target_port)
        self.tunnels = 0  # WebSocket connections through the proxy
        self.dropped: list[dict[str, Any]] = []
        self._match: Predicate | None = None
        self._lock = threading.Lock()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    def drop_next(self, match: Predicate) -> None:
        """Drop the next frame to the runner whose JSON ``match`` accepts (once)."""
        with self._lock:
            self._match = match

    @property
    def armed(self) -> bool:
        with self._lock:
            return self._match is not None

    async def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            first = await reader.read(CHUNK)
            if not first:
                return
            tunnel = b"upgrade: websocket" in first.lower()
            if tunnel:
                self.tunnels += 1
            up_writer.write(first)
            await up_writer.drain()
            down = self._frames(up_reader, writer) if tunnel else _pipe(up_reader, writer)
            await asyncio.gather(_pipe(reader, up_writer), down, return_exceptions=True)
        finally:
            for end in (writer, up_writer):
                end.close()
                self._writers.discard(end)

    async def _frames(self, source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
        """The server's side of a tunnel: the HTTP 101, then frame by frame."""
        try:
            target.write(await source.readuntil(b"\r\n\r\n"))
            while True:
                head = await source.readexactly(2)
                size = head[1] & 0x7F
                extended = b""
                if size == 126:
                    extended = await source.readexactly(2)
                    size = struct.unpack("!H", extended)[0]
                elif size == 127:
                    extended = await source.readexactly(8)
                    size = struct.unpack("!Q", extended)[0]
                mask = await source.readexactly(4) if head[1] & 0x80 else b""
                payload = await source.readexactly(size)
                whole_text = head[0] & 0x80 and head[0] & 0x0F == TEXT and not mask
                if whole_text and self._drops(payload):
                    continue
                target.write(head + extended + mask + payload)
                await target.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            target.close()

    def _drops(self, payload: bytes) -> bool:
        with self._lock:
            match = self._match
            if match is None:
                return False
            try:
                frame = json.loads(payload)
            except ValueError:
                return False
            try:
                chosen = isinstance(frame, dict) and match(frame)
            except Exception:
                chosen = False  # a predicate that cannot read the frame did not choose it
            if not chosen:
                return False
            self._match = None
            self.dropped.append(frame)
            return True


async def _pipe(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(CHUNK):
            target.write(data)
            await target.drain()
    except OSError:
        pass
    finally:
        target.close()
