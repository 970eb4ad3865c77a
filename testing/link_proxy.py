"""A TCP proxy for accidents in tests (operations.md, "Accidents survived"): put between
a process and a service (the server and PostgreSQL or Redis, the runner and the server),
it can

- ``cut()``: reset every connection and refuse new ones until ``restore()``, as a
  service that restarts does (its clients' connections die, new ones are refused);
- ``partition()``: hold every byte in both directions (connections stay open, nothing
  arrives) until ``heal()``, which delivers what was held in order, as TCP does after a
  partition shorter than its retransmission limit; new connections wait too;
- ``impair(delay_s=…, stall_every=…, stall_s=…)``: delay every chunk by ``delay_s`` each
  way, and every ``stall_every``-th chunk (from a seeded counter, so runs repeat) by
  ``stall_s`` more, keeping the order of the bytes, as a slow link with a lost segment
  retransmitted late does.

One asyncio loop in a thread of its own; ``stop()`` closes everything.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from dataclasses import dataclass, field

from .loop_server import LoopThreadServer

CHUNK = 65536


@dataclass
class _Pipe:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    queue: asyncio.Queue[tuple[float, bytes]] = field(default_factory=asyncio.Queue)


class LinkProxy(LoopThreadServer):
    """``LinkProxy(target_port).start()``; point the client at :attr:`port`."""

    name = "link proxy"

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        super().__init__()
        self.target = (target_host, target_port)
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._cut = False
        self._open = asyncio.Event()  # set: bytes flow; clear: partitioned
        self.delay_s = 0.0
        self.stall_every = 0
        self.stall_s = 0.0
        self._chunks = 0
        self.stalls = 0

    # --- control (any thread) ------------------------------------------------------------

    def cut(self) -> None:
        """Reset every connection; refuse new ones until :meth:`restore`."""
        self._call(self._do_cut())

    def restore(self) -> None:
        self._cut = False

    def partition(self) -> None:
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        self._loop.call_soon_threadsafe(self._open.set)

    def impair(self, *, delay_s: float = 0.0, stall_every: int = 0, stall_s: float = 0.0) -> None:
        self.delay_s, self.stall_every, self.stall_s = delay_s, stall_every, stall_s

    # --- the loop ------------------------------------------------------------------------

    async def _listen(self) -> None:
        self._open.set()
        await super()._listen()

    async def _close_all(self) -> None:
        await self._do_cut()
        for task in list(self._tasks):
            task.cancel()

    async def _do_cut(self) -> None:
        self._cut = True
        for writer in list(self._writers):
            _reset(writer)
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            _reset(writer)
            return
        await self._open.wait()  # a partition holds new connections too
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), timeout=10
            )
        except (OSError, TimeoutError):
            _reset(writer)
            return
        if self._cut:
            _reset(writer)
            _reset(up_writer)
            return
        self.connections += 1
        self._writers.update((writer, up_writer))
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pipe = _Pipe(source, sink)
            for coro in (self._read(pipe), self._write(pipe)):
                task = asyncio.ensure_future(coro)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _read(self, pipe: _Pipe) -> None:
        try:
            while True:
                data = await pipe.reader.read(CHUNK)
                if not data:
                    break
                self._chunks += 1
                due = time.monotonic() + self.delay_s
                if self.stall_every and self._chunks % self.stall_every == 0:
                    due += self.stall_s
                    self.stalls += 1
                await pipe.queue.put((due, data))
        except (OSError, asyncio.CancelledError):
            pass
        await pipe.queue.put((0.0, b""))

    async def _write(self, pipe: _Pipe) -> None:
        try:
            while True:
                due, data = await pipe.queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._open.wait()
                pipe.writer.write(data)
                await pipe.writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if pipe.writer in self._writers:
                self._writers.discard(pipe.writer)
                with _quiet():
                    pipe.writer.close()


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dying peer's kernel does."""
    sock = writer.get_extra_info("socket")
    with _quiet():
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
