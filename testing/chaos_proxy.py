"""A TCP proxy that a test controls, put between the runner and the server to break the
tunnel on purpose (docs/testing.md, "Forced tunnel drops").

Every connection is piped both ways by an asyncio loop in a thread of its own. A test
*arms* a drop with :meth:`ChaosProxy.arm`; the proxy carries it out at a random point of
the live connection: after a random number of further bytes (``after_bytes``, drawn by
the caller from a seeded ``random.Random``) in either direction, so cuts land between
frames and in the middle of them, or after ``idle_s`` if that many bytes never flow.
The kinds:

- ``rst``: both sockets closed with ``SO_LINGER`` 0, so each peer gets a TCP reset;
- ``fin``: both sockets closed normally (FIN), without a WebSocket close frame;
- ``blackhole_up`` / ``blackhole_down``: bytes from the runner to the server (up) or
  from the server to the runner (down) are dropped from then on, while the other
  direction still flows, until a peer's heartbeat deadline notices the silence and
  closes its side (the proxy then closes the other). ``blackhole_limit_s`` bounds it:
  a black hole nobody noticed by then is recorded as ``unnoticed`` (a test fails on
  it) and reset;
- ``resend``: a reset now, and the next connection reset again right after the server's
  first message to it (its ``welcome``), once the runner has sent ``after_bytes`` more
  bytes (the events it resends) or ``idle_s`` has passed.

Each executed drop is appended to :attr:`ChaosProxy.drops` (kind, connection number,
when), which a test counts.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

from .loop_server import LoopThreadServer

DropKind = Literal["rst", "fin", "blackhole_up", "blackhole_down", "resend"]
DROP_KINDS: tuple[DropKind, ...] = ("rst", "fin", "blackhole_up", "blackhole_down", "resend")
CHUNK = 65536
UP = "up"  # runner -> server
DOWN = "down"  # server -> runner


@dataclass
class Drop:
    kind: str
    connection: int
    at: float
    noticed_after_s: float | None = None


@dataclass
class _Armed:
    kind: DropKind
    after_bytes: int
    idle_s: float
    # ``resend``'s second cut: on the next connection, after the welcome went down.
    on_next_connection: bool = False


@dataclass
class _Connection:
    number: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    budget: int | None = None  # bytes left before the armed cut
    black_hole: str | None = None  # direction whose bytes are dropped
    black_hole_since: float = 0.0
    welcomed: bool = False
    down_messages: int = 0
    closed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class ChaosProxy(LoopThreadServer):
    """``ChaosProxy(port).start()``; point the runner at :attr:`url`; ``arm()`` drops."""

    name = "chaos proxy"

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        blackhole_limit_s: float = 30.0,
    ) -> None:
        super().__init__()
        self.target = (target_host, target_port)
        self.blackhole_limit_s = blackhole_limit_s
        self.drops: list[Drop] = []
        self.unnoticed: list[Drop] = []
        self.connections = 0
        self._armed: _Armed | None = None
        self._current: _Connection | None = None
        self._lock = threading.Lock()
        self._idle_timer: asyncio.TimerHandle | None = None

    # ----------------------------------------------------------------- control

    def arm(self, kind: DropKind, *, after_bytes: int, idle_s: float = 1.0) -> None:
        """Cut the live connection (or the next one) ``after_bytes`` bytes from now."""
        self._call(self._arm(_Armed(kind, max(0, after_bytes), idle_s)))

    @property
    def armed(self) -> bool:
        with self._lock:
            return self._armed is not None

    @property
    def black_hole_open(self) -> bool:
        with self._lock:
            conn = self._current
            return conn is not None and not conn.closed and conn.black_hole is not None

    # ------------------------------------------------------------------- loop

    async def _close_all(self) -> None:
        if self._current is not None:
            self._close(self._current, reset=False)

    async def _arm(self, armed: _Armed) -> None:
        with self._lock:
            self._armed = armed
        conn = self._current
        if conn is not None and not conn.closed and conn.black_hole is None:
            self._start_budget(conn, armed)

    def _start_budget(self, conn: _Connection, armed: _Armed) -> None:
        if armed.on_next_connection and not conn.welcomed:
            return  # counted from the welcome on (see _pump)
        conn.budget = armed.after_bytes
        self._schedule_idle(conn, armed.idle_s)
        if conn.budget == 0:
            self._fire(conn)

    def _schedule_idle(self, conn: _Connection, idle_s: float) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = self._loop.call_later(idle_s, self._on_idle, conn)

    def _on_idle(self, conn: _Connection) -> None:
        if not conn.closed and conn.budget is not None and conn is self._current:
            self._fire(conn)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        conn = _Connection(number=0, client=writer, upstream=up_writer)
        conn.tasks = [
            asyncio.create_task(self._pump(conn, reader, up_writer, UP)),
            asyncio.create_task(self._pump(conn, up_reader, writer, DOWN)),
        ]
        await asyncio.gather(*conn.tasks, return_exceptions=True)

    async def _pump(
        self,
        conn: _Connection,
        source: asyncio.StreamReader,
        target: asyncio.StreamWriter,
        direction: str,
    ) -> None:
        try:
            while not conn.closed:
                data = await source.read(CHUNK)
                if not data:
                    break
                if direction == UP and conn.number == 0:
                    self._classify(conn, data)
                if conn.number < 0:  # not the tunnel: piped as it is
                    target.write(data)
                    await target.drain()
                    continue
                if conn.black_hole is not None:
                    if conn.black_hole == direction:
                        self._check_black_hole(conn)
                        continue
                elif conn.budget is not None:
                    if conn.budget < len(data):
                        head, data = data[: conn.budget], data[conn.budget :]
                        if head:
                            target.write(head)
                        self._fire(conn)
                        if conn.closed or conn.black_hole == direction:
                            continue
                    else:
                        conn.budget -= len(data)
                target.write(data)
                await target.drain()
                if direction == DOWN and not conn.welcomed:
                    # The first message down is the HTTP 101, the second the welcome.
                    conn.down_messages += 1
                    conn.welcomed = conn.down_messages >= 2
                    if not conn.welcomed:
                        continue
                    with self._lock:
                        armed = self._armed
                    if armed is not None and armed.on_next_connection:
                        self._start_budget(conn, armed)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._on_peer_closed(conn)

    def _classify(self, conn: _Connection, first: bytes) -> None:
        """The tunnel is the connection that asks for a WebSocket upgrade; the runner's
        other requests (if any) pass untouched."""
        if b"upgrade: websocket" not in first.lower():
            conn.number = -1
            return
        self.connections += 1
        conn.number = self.connections
        self._current = conn
        with self._lock:
            armed = self._armed
        if armed is not None:
            self._start_budget(conn, armed)

    def _check_black_hole(self, conn: _Connection) -> None:
        if time.monotonic() - conn.black_hole_since > self.blackhole_limit_s:
            self._record_unnoticed(conn)

    def _record_unnoticed(self, conn: _Connection) -> None:
        self.unnoticed.append(Drop(f"{conn.black_hole}", conn.number, time.monotonic()))
        self._close(conn, reset=True)

    def _on_peer_closed(self, conn: _Connection) -> None:
        """One side ended: close the other too (a black hole noticed, or a peer's close)."""
        if conn.closed:
            return
        if conn.black_hole is not None and self.drops:
            last = self.drops[-1]
            if last.connection == conn.number and last.noticed_after_s is None:
                last.noticed_after_s = time.monotonic() - conn.black_hole_since
        self._close(conn, reset=False)

    def _fire(self, conn: _Connection) -> None:
        """Carry out the armed drop on ``conn`` now (a closed one keeps it armed for the
        next connection)."""
        conn.budget = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if conn.closed:
            return
        with self._lock:
            armed, self._armed = self._armed, None
        if armed is None:
            return
        kind = armed.kind
        label = "resend" if armed.on_next_connection else kind
        self.drops.append(Drop(label, conn.number, time.monotonic()))
        if kind in ("blackhole_up", "blackhole_down"):
            conn.black_hole = UP if kind == "blackhole_up" else DOWN
            conn.black_hole_since = time.monotonic()
            self._loop.call_later(self.blackhole_limit_s, self._black_hole_deadline, conn)
            return
        if kind == "resend" and not armed.on_next_connection:
            # The first half: reset now, and the next connection right after its welcome.
            self.drops.pop()
            with self._lock:
                self._armed = _Armed(
                    "resend", armed.after_bytes, armed.idle_s, on_next_connection=True
                )
            self._close(conn, reset=True)
            return
        self._close(conn, reset=kind in ("rst", "resend"))

    def _black_hole_deadline(self, conn: _Connection) -> None:
        if not conn.closed and conn.black_hole is not None:
            self._record_unnoticed(conn)

    def _close(self, conn: _Connection, *, reset: bool) -> None:
        if conn.closed:
            return
        conn.closed = True
        for writer in (conn.client, conn.upstream):
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    try:
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                    except OSError:
                        pass
                writer.transport.abort()
            else:
                writer.close()
        for task in conn.tasks:
            if task is not asyncio.current_task():
                task.cancel()

    def drops_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for drop in self.drops:
            counts[drop.kind] = counts.get(drop.kind, 0) + 1
        return dict(sorted(counts.items()))
