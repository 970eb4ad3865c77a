"""Shared helpers for the benchmark scripts in ``bench/`` (not tests, not a library).

Everything here has a deadline, and every resource it creates is handed to an
``ExitStack`` so a script cleans it up on normal exit, on an error and on Ctrl-C
(SIGTERM is turned into ``KeyboardInterrupt`` for the same effect).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
import tempfile
import time
import timeit
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from bench._stats import fmt, summary_ms  # noqa: F401 - re-exported
from omnigent_runner.bundles import build_bundle
from testing.processes import (
    REDIS_URL,
    Server,
    base_env,
    drop_redis_keys,
    migrate,
    postgres_database,
    runner_env,
    start_server,
)
from testing.processes import wait_runner_online as wait_owned_runner_online

REPO = Path(__file__).resolve().parents[1]
USER = "bench@example.com"
TOKEN_HEADER = "X-Omnigent-Runner-Tunnel-Token"
MAX_FRAME = 16 * 1024 * 1024
MIB = 1024 * 1024
COMMAND_TYPES = {"session.open", "turn.start", "tool_result", "turn.interrupt", "session.close"}


# --------------------------------------------------------------------------- process hygiene


def sigterm_as_interrupt() -> None:
    """SIGTERM behaves like Ctrl-C, so ``finally`` blocks and the ExitStack run."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def run_main(main: Callable[[], int]) -> int:
    """Run a benchmark's ``main``; on Ctrl-C/SIGTERM report that everything was cleaned up.

    ``main`` holds its resources in an ExitStack, so by the time the interrupt leaves it
    every process it started is stopped and every database it created is dropped.
    """
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted: started processes stopped, created databases dropped", file=sys.stderr)
        return 130


def log_dir(stack: contextlib.ExitStack, keep: bool) -> Path:
    """A private folder for process logs, SQLite files and data (removed unless ``keep``)."""
    if keep:
        path = Path(tempfile.mkdtemp(prefix="omnigent-bench-"))
        print(f"logs kept in {path}", file=sys.stderr)
        return path
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="omnigent-bench-")))


def common_env(tmp: Path, *, debug: bool, **extra: str) -> dict[str, str]:
    """Server environment: quiet logs; ``DJANGO_DEBUG=0`` unless ``debug`` (production-like)."""
    env = base_env(
        OMNIGENT_DATA_DIR=str(tmp / "data"),
        OMNIGENT_LOG_LEVEL="WARNING",
        **extra,
    )
    if not debug:
        env["DJANGO_DEBUG"] = "0"
        env["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(48)
    return env


def bench_runner_env(
    *,
    server_url: str,
    token: str,
    workspace: Path,
    llm_url: str | None = None,
    max_turns: int | None = None,
) -> dict[str, str]:
    """A benchmark's runner program: quiet logs, the mock LLM at ``llm_url`` (if any),
    and ``max_turns`` turns at once if given (``OMNIGENT_RUNNER_MAX_TURNS``)."""
    llm = {"OPENAI_BASE_URL": llm_url, "OPENAI_API_KEY": "bench"} if llm_url else {}
    if max_turns is not None:
        llm["OMNIGENT_RUNNER_MAX_TURNS"] = str(max_turns)
    return runner_env(
        server_url=server_url,
        token=token,
        workspace=workspace,
        OMNIGENT_RUNNER_LOG_LEVEL="WARNING",
        **llm,
    )


def sqlite_env(tmp: Path, *, debug: bool, name: str = "db") -> dict[str, str]:
    return common_env(tmp, debug=debug, DATABASE_URL=f"sqlite:///{tmp / (name + '.sqlite3')}")


def start_daphne(
    stack: contextlib.ExitStack, *, env: dict[str, str], tmp: Path, name: str
) -> Server:
    """One daphne process (``python -m omnigent_site.serve``); stopped by the ExitStack.

    Its stdout (daphne's per-request access log included) and stderr go to
    ``<tmp>/<name>.log``, never to the terminal.
    """
    return start_server(env=env, log_dir=tmp, name=name, stack=stack)


def single_server(stack: contextlib.ExitStack, tmp: Path, *, debug: bool, name: str) -> Server:
    """A daphne process on a fresh SQLite file with the in-memory channel layer."""
    env = sqlite_env(tmp, debug=debug, name=name)
    migrate(env, tmp)
    return start_daphne(stack, env=env, tmp=tmp, name=name)


def scale_out_env(
    stack: contextlib.ExitStack, tmp: Path, *, debug: bool, settings: str | None = None
) -> dict[str, str]:
    """Server environment of a scaled-out deployment, migrated: a new PostgreSQL database
    and the Redis channel layer under a fresh key prefix.

    Both are private to this run (the database is dropped and the prefix's keys deleted
    by the ExitStack), so runs never see each other's rows or messages. ``settings``
    sets ``DJANGO_SETTINGS_MODULE`` (e.g. ``bench.server_settings`` for SQL counting).
    """
    pg_url = stack.enter_context(postgres_database("omnigent_bench_"))
    prefix = f"omnigent-bench-{secrets.token_hex(4)}"
    stack.callback(drop_redis_keys, prefix)
    env = common_env(tmp, debug=debug, DATABASE_URL=pg_url, REDIS_URL=REDIS_URL)
    env["OMNIGENT_CHANNEL_PREFIX"] = prefix
    if settings is not None:
        env["DJANGO_SETTINGS_MODULE"] = settings
    migrate(env, tmp)
    return env


def two_servers(stack: contextlib.ExitStack, tmp: Path, *, debug: bool) -> tuple[Server, Server]:
    """Two daphne processes on one new PostgreSQL database and one Redis."""
    env = scale_out_env(stack, tmp, debug=debug)
    first = start_daphne(stack, env=env, tmp=tmp, name="daphne-a")
    second = start_daphne(stack, env=env, tmp=tmp, name="daphne-b")
    return first, second


def wait_runner_online(
    server: Server, runner_id: str, process: Any, deadline_s: float = 60.0
) -> None:
    """Poll the runner's status as :data:`USER` (its owner) until it reads online."""
    wait_owned_runner_online(server, runner_id, process=process, user=USER, deadline_s=deadline_s)


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc (VmRSS, in kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time ``pid`` has used, all threads (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mib(value: int | float) -> float:
    return round(value / MIB, 2)


def final_json(payload: dict[str, Any]) -> None:
    payload = {**payload, "cpu_reference_us_at_end": cpu_reference_us()}
    print(json.dumps(payload, sort_keys=True), flush=True)


# --------------------------------------------------------------------------- HTTP helpers


def agent_bundle(*, os_env: bool) -> bytes:
    spec = "name: bench-agent\nprompt: You are a benchmark agent.\nexecutor:\n  model: mock-model\n"
    if os_env:
        spec += "os_env:\n  type: caller_process\n  cwd: .\n"
    return build_bundle({"agent.yaml": spec})


def async_client(
    base_url: str, *, connections: int = 20, timeout: float = 30.0
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"X-Forwarded-Email": USER},
        timeout=timeout,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def register_runner(client: httpx.AsyncClient, name: str = "bench") -> tuple[str, str]:
    response = await client.post("/v1/runners", json={"name": name})
    response.raise_for_status()
    body = response.json()
    return body["runner_id"], body["binding_token"]


async def wait_online(client: httpx.AsyncClient, runner_id: str, deadline_s: float = 30.0) -> None:
    async with asyncio.timeout(deadline_s):
        while True:
            body = (await client.get(f"/v1/runners/{runner_id}/status")).json()
            if body.get("online") is True:
                return
            await asyncio.sleep(0.05)


async def create_session(client: httpx.AsyncClient, bundle: bytes, title: str = "bench") -> str:
    response = await client.post(
        "/v1/sessions",
        files={"bundle": ("agent.tar.gz", bundle, "application/gzip")},
        data={"metadata": json.dumps({"title": title})},
    )
    response.raise_for_status()
    return str(response.json()["session_id"])


async def bind(client: httpx.AsyncClient, session_id: str, runner_id: str) -> None:
    response = await client.patch(f"/v1/sessions/{session_id}", json={"runner_id": runner_id})
    response.raise_for_status()


async def post_message(client: httpx.AsyncClient, session_id: str, text: str) -> dict[str, Any]:
    response = await client.post(
        f"/v1/sessions/{session_id}/events",
        json={"type": "message", "data": {"role": "user", "content": text}},
    )
    if response.status_code != 202:
        raise RuntimeError(f"message → HTTP {response.status_code}: {response.text[:300]}")
    return dict(response.json())


async def within(coro: Awaitable[Any], deadline_s: float, what: str) -> Any:
    try:
        async with asyncio.timeout(deadline_s):
            return await coro
    except TimeoutError:
        raise TimeoutError(f"timed out after {deadline_s:g} s waiting for {what}") from None


# --------------------------------------------------------------------------- stub runner


class StubRunner:
    """A minimal tunnel client: hello, then ack every command and answer every ping.

    Not an agent: it never runs a turn, so what a benchmark measures around it is the
    server's relay path. ``on_command(frame, t_recv)`` is called for each command
    before its ack is sent.
    """

    def __init__(
        self,
        server_url: str,
        runner_id: str,
        token: str,
        *,
        on_command: Callable[[dict[str, Any], float], None] | None = None,
        on_ack: Callable[[str, int, float], None] | None = None,
    ) -> None:
        self.url = server_url.replace("http://", "ws://", 1) + f"/v1/runners/{runner_id}/tunnel"
        self.runner_id = runner_id
        self.token = token
        self.on_command = on_command
        self.on_ack = on_ack
        self.ws: ClientConnection | None = None
        self.reader: asyncio.Task[None] | None = None
        self.commands: dict[str, int] = {}
        self.pings = 0
        self.acked: dict[str, int] = {}
        self.ack_waiters: list[tuple[str, int, asyncio.Future[None]]] = []
        self.closed: str | None = None
        self.command_waiters: list[tuple[str, asyncio.Future[dict[str, Any]]]] = []

    async def start(self, deadline_s: float = 30.0) -> None:
        async with asyncio.timeout(deadline_s):
            self.ws = await connect(
                self.url,
                additional_headers={TOKEN_HEADER: self.token},
                max_size=MAX_FRAME,
                ping_interval=None,  # liveness is the server's ping/pong frames
                open_timeout=deadline_s,
                close_timeout=5,
            )
            await self.ws.send(
                json.dumps(
                    {
                        "type": "hello",
                        "protocol": 1,
                        "runner_version": "bench",
                        "workspace": {"root": "/tmp", "vcs": "none"},
                        "capabilities": {},
                        "open_sessions": [],
                    }
                )
            )
            while True:
                frame = json.loads(await self.ws.recv())
                if frame.get("type") == "welcome":
                    break
                if frame.get("type") == "ping":
                    await self.ws.send(json.dumps({"type": "pong", "ts": frame.get("ts")}))
        self.reader = asyncio.create_task(self._read(), name=f"stub-{self.runner_id[-6:]}")

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for raw in self.ws:
                t_recv = time.perf_counter()
                if not isinstance(raw, str):
                    continue
                frame = json.loads(raw)
                kind = frame.get("type")
                if kind == "ping":
                    self.pings += 1
                    await self.ws.send(json.dumps({"type": "pong", "ts": frame.get("ts")}))
                elif kind in COMMAND_TYPES:
                    self.commands[kind] = self.commands.get(kind, 0) + 1
                    if self.on_command is not None:
                        self.on_command(frame, t_recv)
                    await self.ws.send(json.dumps({"type": "ack", "id": frame.get("id")}))
                    self._wake_commands(kind, frame)
                elif kind == "rpc":
                    await self.ws.send(
                        json.dumps(
                            {"type": "rpc.result", "id": frame.get("id"), "ok": True, "result": {}}
                        )
                    )
                elif kind == "event.ack":
                    self.acked[frame["session_id"]] = int(frame["seq"])
                    if self.on_ack is not None:
                        self.on_ack(frame["session_id"], int(frame["seq"]), t_recv)
                    self._wake_acks()
        except ConnectionClosed as exc:
            self.closed = f"closed: {exc}"
        except Exception as exc:  # noqa: BLE001 - reported by the benchmark
            self.closed = f"reader failed: {exc!r}"
        else:
            self.closed = "closed"

    def _wake_commands(self, kind: str, frame: dict[str, Any]) -> None:
        for waiter in [w for w in self.command_waiters if w[0] == kind]:
            self.command_waiters.remove(waiter)
            if not waiter[1].done():
                waiter[1].set_result(frame)

    def _wake_acks(self) -> None:
        for waiter in list(self.ack_waiters):
            session_id, seq, future = waiter
            if self.acked.get(session_id, 0) >= seq:
                self.ack_waiters.remove(waiter)
                if not future.done():
                    future.set_result(None)

    def expect_command(self, kind: str) -> asyncio.Future[dict[str, Any]]:
        """A future for the next command of ``kind`` (register it before causing it)."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.command_waiters.append((kind, future))
        return future

    async def wait_acked(self, session_id: str, seq: int, deadline_s: float) -> None:
        if self.acked.get(session_id, 0) >= seq:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ack_waiters.append((session_id, seq, future))
        await within(future, deadline_s, f"event.ack {seq} of {session_id}")

    async def send_event(self, session_id: str, seq: int, event: dict[str, Any]) -> None:
        assert self.ws is not None
        await self.ws.send(
            json.dumps({"type": "event", "session_id": session_id, "seq": seq, "event": event})
        )

    async def send_events(
        self, session_id: str, first_seq: int, events: list[dict[str, Any]], *, batched: bool
    ) -> None:
        """``events`` numbered from ``first_seq``: one ``events`` message, or one ``event``
        message each, as a runner without batches sends them."""
        assert self.ws is not None
        frames = [
            {"type": "event", "session_id": session_id, "seq": first_seq + n, "event": event}
            for n, event in enumerate(events)
        ]
        if batched:
            await self.ws.send(json.dumps({"type": "events", "events": frames}))
            return
        for frame in frames:
            await self.ws.send(json.dumps(frame))

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self.ws.close()
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(BaseException):
                await self.reader


# --------------------------------------------------------------------------- SSE subscriber


class SSESubscriber:
    """Reads ``/v1/sessions/{id}/stream`` and calls ``on_event(type, data_text, t_recv)``.

    ``connected`` is set when the first ``session.heartbeat`` arrives. Parsing is kept
    light (the JSON is decoded by the callback only when it needs it) because a single
    benchmark process may read hundreds of streams.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        session_id: str,
        on_event: Callable[[str, str, float], None],
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.on_event = on_event
        self.connected = asyncio.Event()
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async with self.client.stream(
                "GET",
                f"/v1/sessions/{self.session_id}/stream",
                headers={"Accept": "text/event-stream"},
                timeout=httpx.Timeout(30.0, read=None),
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise RuntimeError(
                        f"stream → HTTP {response.status_code}: {response.text[:200]}"
                    )
                event_type = "message"
                async for line in response.aiter_lines():
                    if line.startswith("event:"):
                        event_type = line[6:].strip()
                    elif line.startswith("data:"):
                        t_recv = time.perf_counter()
                        data = line[5:].lstrip()
                        if data == "[DONE]":
                            return
                        if event_type == "session.heartbeat":
                            self.connected.set()
                        self.on_event(event_type, data, t_recv)
                    elif line == "":
                        event_type = "message"
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark
            self.error = exc
        finally:
            self.connected.set()

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task


async def gather_limited(coros: list[Awaitable[Any]], limit: int) -> list[Any]:
    """``asyncio.gather`` with at most ``limit`` coroutines running at a time."""
    semaphore = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[Any]) -> Any:
        async with semaphore:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))


def cpu_reference_us() -> float:
    """Microseconds for a fixed pure-Python loop (best of 5): this machine's speed now.

    On a shared or throttled machine single-core speed drifts, by half on the
    machine these numbers were first taken on; the same code then measures that
    much slower. Comparing this figure tells whether two runs saw the same machine.
    """
    loops = 1000
    best = min(timeit.repeat("sum(i * i for i in range(1000))", number=loops, repeat=5, globals={}))
    return round(best / loops * 1e6, 1)


def env_summary() -> dict[str, Any]:
    """The machine, its load and its speed at the start (other work skews every number)."""
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "cpu_reference_us_at_start": cpu_reference_us(),
    }
