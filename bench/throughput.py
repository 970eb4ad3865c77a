"""Benchmark: many sessions' text turns at once (issue 14), the floor, and a profile.

One run starts the server — by default one daphne process on SQLite with the in-memory
channel layer; with ``--servers N`` (N > 1, or ``--database postgres``) N daphne
processes sharing a new PostgreSQL database and the Redis channel layer under a fresh
key prefix — always with production settings plus SQL counting
(``bench/server_settings.py``). Then the mock LLM, one tunnel meter per runner (a
counting TCP proxy, ``bench/tunnel_meter.py``) as processes of their own, and N real
runner programs: runner i dials server i (through its meter). Every turn is one
streamed text reply of ``--words`` words. It measures:

1. the floor: a trivial async view (``GET /bench/noop``), ``GET /health``, a bare
   WebSocket ping/pong through the tunnel, one runner event → ``event.ack`` (a text
   delta, from a stub runner), and a turn's worth of events at once as eight ``event``
   messages against one ``events`` message (server CPU per event); below them, daphne alone serving ``bench/bare_asgi.py``
   (no Django), which the trivial view is compared with;
2. one snapshot ``GET /v1/sessions/{id}`` of a session with 10 and with 100 items, and
   the ``304`` path: the 100-item GET with ``If-None-Match`` of the ETag a first GET
   gave (``snapshot.304``; left out when the server sends no ETag);
3. single turns: fresh sessions one after another, first turn and second turn
   (POST → ``session.status`` idle on the stream) and the second turn's POST → 202;
4. ``--sessions`` sessions (20) each running one turn at the same time, then a second
   turn each, with clients polling the snapshot every ``--poll-ms`` (20) until it reads
   idle with the reply (with ``--poll-etag`` each poll sends ``If-None-Match`` with the
   last ETag it got, and the 304s are counted) — and the same with clients following
   each session's stream.

Sections 1-3 use server 0 and runner 0. In section 4 session i is bound to runner
i mod N and all its clients (POST, poller, stream) talk to the server that runner is
connected to, as behind a sticky balancer; with ``--cross`` they talk to the next
server instead, so every command and every event crosses Redis. Before the rounds, each
runner that has not run a turn yet (all of them when sections 1-3 are skipped) runs one
untimed turn, so round 1 measures warm processes at every N.

For every round: turns/s, per-turn p50/p95, CPU per turn by role (``server``: all server
processes, ``runner``: all runners, the mock, the meters, this process; with N > 1 also
each process apart), SQL statements per turn summed over the servers (by verb, with
their time; PostgreSQL opens transactions without a ``BEGIN`` statement, so that verb
counts only on SQLite), tunnel messages and bytes per turn (by frame type), and per
turn on each stream (or of polling). ``--runs N`` repeats everything on fresh processes
and prints min/median/max of every number; ``--profile DIR`` adds a run with ``py-spy``
on the servers and the runners during the idle pollers and during the concurrent rounds
and prints their top functions.

``--scaling 1,2,3`` runs only the concurrent rounds, for each server count in turn on
fresh processes and always on PostgreSQL + Redis (so 1 compares like for like with 2
and 3), ``--runs`` times each, and prints a table: turns/s of both rounds polling and
streaming, and the server and runner CPU per turn. On a machine with fewer cores than
processes the extra processes cannot add CPU: the table then shows what scaling out
costs rather than what it gains.

The servers run with the client rate limits off, as every test server does;
``--throttles`` turns them on at rates nothing reaches, so that every request reads and
writes its count in the shared cache as in production (on Redis with PostgreSQL).

Run: ``.venv/bin/python -m bench.throughput [--runs 5] [--profile /tmp/prof]``,
``... --servers 2 [--cross] [--poll-etag]``, ``... --scaling 1,2,3``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._common import (
    USER,
    Server,
    StubRunner,
    agent_bundle,
    async_client,
    bench_runner_env,
    bind,
    cpu_seconds,
    create_session,
    env_summary,
    final_json,
    log_dir,
    post_message,
    register_runner,
    run_main,
    scale_out_env,
    sigterm_as_interrupt,
    sqlite_env,
    start_daphne,
    summary_ms,
    wait_online,
    wait_runner_online,
    within,
)
from bench._load import (
    CountingStream,
    CpuClock,
    MockLLM,
    Profiler,
    TunnelMeter,
    merge_meter_reports,
    meter_delta,
    open_streams,
    summarise_profile,
)
from omnigent_site.runtime.event_loop import EVENT_LOOPS
from testing.processes import Process, base_env, free_port, migrate, spawn
from testing.webhook_receiver import WebhookReceiver

TURN_END = ("response.completed", "response.failed", "response.cancelled")
SETTINGS = "bench.server_settings"
THROTTLE_RATES = (
    "OMNIGENT_THROTTLE_USER_RATE",
    "OMNIGENT_THROTTLE_RUNNER_RATE",
    "OMNIGENT_THROTTLE_POLL_RATE",
)


@dataclass
class Stack:
    """The processes of one run: ``servers[i]`` is the server ``runners[i]`` dials."""

    servers: list[Server]
    runners: list[Process]
    runner_ids: list[str]
    mock: MockLLM
    meters: list[TunnelMeter]
    log_dir: Path
    cross: bool = False
    # ``--webhook-worker``: the ``manage.py deliverwebhooks`` process.
    webhook_workers: list[Process] = field(default_factory=list)

    @property
    def server(self) -> Server:
        return self.servers[0]

    @property
    def runner(self) -> Process:
        return self.runners[0]

    @property
    def runner_id(self) -> str:
        return self.runner_ids[0]

    def pids(self) -> dict[str, list[int]]:
        """Process ids by role (the CPU of a role is the sum over its processes)."""
        pids = {
            "server": [server.process.popen.pid for server in self.servers],
            "runner": [runner.popen.pid for runner in self.runners],
            "mock": [self.mock.pid],
        }
        if self.meters:
            pids["meter"] = [meter.pid for meter in self.meters]
        if self.webhook_workers:
            pids["webhook_worker"] = [worker.popen.pid for worker in self.webhook_workers]
        return pids

    def meter_report(self) -> dict[str, Any] | None:
        if not self.meters:
            return None
        return merge_meter_reports([meter.report() for meter in self.meters])

    def client_server(self, runner_index: int) -> int:
        """The server a session's clients use when the session is on runner ``runner_index``:
        the one that runner dials (a sticky balancer), or with ``cross`` the next one."""
        if self.cross:
            return (runner_index + 1) % len(self.servers)
        return runner_index


def process_name(base: str, index: int, count: int) -> str:
    """``daphne`` for a lone process (the names of earlier runs), ``daphne-1`` of several."""
    return base if count == 1 else f"{base}-{index}"


def start_stack(stack: contextlib.ExitStack, tmp: Path, args: argparse.Namespace) -> Stack:
    count = args.servers
    if args.database == "postgres":
        env = scale_out_env(stack, tmp, debug=False, settings=SETTINGS)
    else:
        env = sqlite_env(tmp, debug=False, name="db")
        env["DJANGO_SETTINGS_MODULE"] = SETTINGS
        migrate(env, tmp)
    env["OMNIGENT_EVENT_LOOP"] = args.event_loop
    env["OMNIGENT_MAX_RUNNING_TURNS_PER_USER"] = str(max(args.user_max_turns or args.sessions, 20))
    if args.throttles:
        # Every request checks its rates in the shared cache, as in production, at rates
        # far above the benchmark's so that nothing is refused.
        for rate in THROTTLE_RATES:
            env[rate] = "1000000/min"
    if args.webhooks:
        # Webhooks to a receiver on loopback (automation.md): every turn's events go out.
        env["OMNIGENT_WEBHOOK_ALLOW_HTTP"] = "1"
        env["OMNIGENT_WEBHOOK_ALLOW_PRIVATE"] = "1"
        if args.webhook_worker:
            # Deliveries from a process of their own (docs/automation.md); the servers
            # wake it through the channel layer, or with SQLite's embedded layer it polls.
            env["OMNIGENT_WEBHOOK_DELIVERY"] = "worker"
            env["OMNIGENT_WEBHOOK_POLL_S"] = "0.2"
    webhook_workers = []
    if args.webhooks and args.webhook_worker:
        worker = spawn(
            "webhook-worker", [sys.executable, "manage.py", "deliverwebhooks"], env=env, log_dir=tmp
        )
        stack.callback(worker.stop)
        webhook_workers.append(worker)
    servers = [
        start_daphne(stack, env=env, tmp=tmp, name=process_name("daphne", i, count))
        for i in range(count)
    ]
    if args.webhooks:
        receiver = stack.enter_context(WebhookReceiver())
        args.webhook_receiver = receiver
        with servers[0].client(USER) as client:
            for _ in range(args.webhooks):
                response = client.post("/v1/webhooks", json={"url": receiver.url, "events": ["*"]})
                response.raise_for_status()
    mock = MockLLM(tmp)
    stack.callback(mock.stop)
    meters: list[TunnelMeter] = []
    if not args.no_tunnel_meter:
        for i, server in enumerate(servers):
            meter = TunnelMeter(
                int(server.url.rsplit(":", 1)[1]), tmp, process_name("tunnel-meter", i, count)
            )
            stack.callback(meter.stop)
            meters.append(meter)
    runners, runner_ids = [], []
    for i, server in enumerate(servers):
        with server.client(USER) as client:
            response = client.post("/v1/runners", json={"name": f"bench-throughput-{i}"})
            response.raise_for_status()
            runner_id, token = response.json()["runner_id"], response.json()["binding_token"]
        workspace = tmp / process_name("workspace", i, count)
        workspace.mkdir(exist_ok=True)
        runner = spawn(
            process_name("runner", i, count),
            [sys.executable, "-m", "omnigent_runner"],
            env=bench_runner_env(
                server_url=meters[i].url if meters else server.url,
                token=token,
                workspace=workspace,
                llm_url=mock.base_url,
                max_turns=args.runner_max_turns or args.sessions,
            ),
            log_dir=tmp,
        )
        stack.callback(runner.stop)
        runners.append(runner)
        runner_ids.append(runner_id)
    for server, runner, runner_id in zip(servers, runners, runner_ids, strict=True):
        wait_runner_online(server, runner_id, process=runner)
    return Stack(
        servers=servers,
        runners=runners,
        runner_ids=runner_ids,
        mock=mock,
        meters=meters,
        log_dir=tmp,
        cross=args.cross,
        webhook_workers=webhook_workers,
    )


@dataclass
class Clients:
    """HTTP clients per server: ``api`` (POSTs, setup, counters), ``pollers``, ``readers``."""

    api: list[httpx.AsyncClient]
    pollers: list[httpx.AsyncClient]
    readers: list[httpx.AsyncClient]


@dataclass
class Placed:
    """A session of the concurrent rounds: its runner, and the server its clients use."""

    session_id: str
    runner: int
    server: int


# --------------------------------------------------------------------------- measuring aids


async def sql_counters(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/bench/queries")
    response.raise_for_status()
    return dict(response.json())


async def sql_counters_all(clients: list[httpx.AsyncClient]) -> dict[str, Any]:
    """The SQL counters of every server, summed (each process counts its own)."""
    merged: dict[str, Any] = {
        "statements": 0,
        "by_verb": {},
        "seconds_by_verb": {},
        "by_thread": {},
        "seconds_by_thread": {},
    }
    for counters in await asyncio.gather(*(sql_counters(client) for client in clients)):
        merged["statements"] += counters["statements"]
        for key in ("by_verb", "seconds_by_verb", "by_thread", "seconds_by_thread"):
            table = merged[key]
            for name, value in counters[key].items():
                table[name] = table.get(name, 0) + value
    return merged


def sql_delta(before: dict[str, Any], after: dict[str, Any], n: int) -> dict[str, Any]:
    """Statements (by verb) and their milliseconds per unit, and seconds by thread kind."""
    verbs = after["by_verb"]
    by_verb = {
        k: round((verbs[k] - before["by_verb"].get(k, 0)) / n, 2)
        for k in sorted(verbs)
        if verbs[k] - before["by_verb"].get(k, 0)
    }
    ms = sum(after["seconds_by_verb"].values()) - sum(before["seconds_by_verb"].values())
    threads = after["seconds_by_thread"]
    return {
        "statements": round((after["statements"] - before["statements"]) / n, 2),
        "by_verb": by_verb,
        "sql_ms": round(ms * 1000 / n, 3),
        # Wall time inside the statements, lock waits included (BEGIN IMMEDIATE on SQLite
        # waits for the write lock).
        "sql_ms_by_verb": {
            k: round((v - before["seconds_by_verb"].get(k, 0.0)) * 1000 / n, 3)
            for k, v in sorted(after["seconds_by_verb"].items())
            if v - before["seconds_by_verb"].get(k, 0.0) > 0
        },
        "sql_ms_by_thread": {
            k: round((threads[k] - before["seconds_by_thread"].get(k, 0.0)) * 1000 / n, 3)
            for k in sorted(threads)
            if threads[k] - before["seconds_by_thread"].get(k, 0.0) > 0
        },
    }


class TurnWatch:
    """Per session, the turn-end and status events seen on its stream since the last POST;
    a turn is over once both its ``response.completed`` and a ``session.status`` idle
    have arrived."""

    def __init__(self) -> None:
        self.logs: dict[str, list[tuple[str, str, float]]] = {}
        self.waiting: dict[str, tuple[str, asyncio.Future[float]]] = {}
        # The longest silence on each session's stream while its turn ran, between two
        # of its events (a stall shows up here), and apart from it the wait from the
        # POST to the turn's first event (the queue of a round's POSTs shows up there).
        self.last_seen: dict[str, float] = {}
        self.max_gap: dict[str, float] = {}
        self.first_wait: dict[str, float] = {}
        self.seen_any: set[str] = set()
        self.last_type: dict[str, str] = {}
        self.gap_between: dict[str, tuple[str, str]] = {}

    def longest_gap_between(self) -> str:
        """The two event types around the longest stall of all streams."""
        session_id = max(self.max_gap, key=lambda k: self.max_gap[k])
        return " -> ".join(self.gap_between.get(session_id, ("", "")))

    def reset(self, session_id: str) -> None:
        self.logs[session_id] = []
        self.waiting.pop(session_id, None)
        self.last_seen[session_id] = time.perf_counter()
        self.max_gap[session_id] = 0.0
        self.first_wait[session_id] = 0.0
        self.seen_any.discard(session_id)

    def listener(self, session_id: str) -> Any:
        def on_event(event_type: str, data: str, t_recv: float) -> None:
            gap = t_recv - self.last_seen.get(session_id, t_recv)
            if session_id not in self.seen_any:
                self.first_wait[session_id] = gap
                self.seen_any.add(session_id)
            elif session_id in self.waiting and gap > self.max_gap.get(session_id, 0.0):
                self.max_gap[session_id] = gap
                self.gap_between[session_id] = (self.last_type.get(session_id, ""), event_type)
            self.last_type[session_id] = event_type
            self.last_seen[session_id] = t_recv
            if event_type in TURN_END:
                self.logs.setdefault(session_id, []).append(
                    (event_type, json.loads(data)["response"]["id"], t_recv)
                )
            elif event_type == "session.status":
                self.logs.setdefault(session_id, []).append(
                    ("status", str(json.loads(data).get("status")), t_recv)
                )
            else:
                return
            self._check(session_id)

        return on_event

    def _check(self, session_id: str) -> None:
        if session_id not in self.waiting:
            return
        response_id, future = self.waiting[session_id]
        ended = idle = None
        for kind, value, t_recv in self.logs.get(session_id, []):
            if kind in TURN_END and value == response_id:
                if kind != "response.completed":
                    del self.waiting[session_id]
                    future.set_exception(RuntimeError(f"turn {response_id} ended {kind}"))
                    return
                ended = t_recv
            elif kind == "status" and value in ("idle", "failed") and idle is None:
                idle = t_recv  # the log starts at this turn's POST: no older status is in it
        if ended is not None and idle is not None:
            del self.waiting[session_id]
            future.set_result(max(ended, idle))

    async def wait(self, session_id: str, response_id: str, deadline_s: float) -> float:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[session_id] = (response_id, future)
        self._check(session_id)
        return float(await within(future, deadline_s, f"turn {response_id} to reach idle"))


def reply_text(words: int) -> str:
    return " ".join(f"word{i:03d}" for i in range(words)) + "."


async def script_turns(
    mock: MockLLM, client: httpx.AsyncClient, count: int, words: int
) -> list[str]:
    """Script ``count`` streamed text replies in the mock; return their match tokens."""
    tokens = [f"tp{secrets.token_hex(8)}" for _ in range(count)]
    entry = {"text": reply_text(words), "stream": True}
    for token in tokens:
        await mock.configure(client, [entry], token)
    return tokens


async def idle_pollers(
    clients: Clients, stack: Stack, args: argparse.Namespace, seconds: float = 3.0
) -> dict[str, Any]:
    """``--sessions`` pollers at ``--poll-ms`` on sessions where nothing happens: what
    the polls alone cost the server when they come all at once, as in the rounds."""
    server_pid = stack.server.process.popen.pid
    pollers = clients.pollers[0]
    bundle = agent_bundle(os_env=False)
    sessions = [
        await create_session(clients.api[0], bundle, f"bench-idle-{i}")
        for i in range(args.sessions)
    ]
    interval = args.poll_ms / 1000
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def poll(session_id: str) -> None:
        while time.perf_counter() < stop:
            await asyncio.sleep(interval)
            t0 = time.perf_counter()
            (await pollers.get(f"/v1/sessions/{session_id}")).raise_for_status()
            latencies.append(time.perf_counter() - t0)

    for session_id in sessions:  # warm-up: one poll each
        (await pollers.get(f"/v1/sessions/{session_id}")).raise_for_status()
    cpu0, t0 = cpu_seconds(server_pid), time.perf_counter()
    await asyncio.gather(*(poll(session_id) for session_id in sessions))
    wall, cpu = time.perf_counter() - t0, cpu_seconds(server_pid) - cpu0
    return {
        **summary_ms(latencies),
        "polls_per_s": round(len(latencies) / wall, 1),
        "server_cpu_ms": round(cpu * 1000 / max(len(latencies), 1), 3),
        "server_cpu_share": round(cpu / wall, 2),
    }


async def new_sessions(client: httpx.AsyncClient, runner_id: str, count: int) -> list[str]:
    bundle = agent_bundle(os_env=False)
    ids = []
    for i in range(count):
        session_id = await create_session(client, bundle, f"bench-{i}")
        await bind(client, session_id, runner_id)
        ids.append(session_id)
    return ids


async def placed_sessions(clients: Clients, stack: Stack, count: int) -> list[Placed]:
    """``count`` sessions, session i on runner i mod N, each created and bound through
    the server its clients will use."""
    bundle = agent_bundle(os_env=False)
    placed = []
    for i in range(count):
        runner = i % len(stack.runners)
        server = stack.client_server(runner)
        client = clients.api[server]
        session_id = await create_session(client, bundle, f"bench-{i}")
        await bind(client, session_id, stack.runner_ids[runner])
        placed.append(Placed(session_id=session_id, runner=runner, server=server))
    return placed


def per_x(value: float, n: int, digits: int = 2) -> float:
    return round(value / n, digits)


# --------------------------------------------------------------------------- 1. the floor


async def bare_daphne_floor(stack: Stack, n: int) -> dict[str, Any]:
    """``GET`` on daphne serving ``bench/bare_asgi.py``: the server without Django."""
    port = free_port()
    process = spawn(
        "daphne-bare",
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "bench.bare_asgi:application",
        ],
        env=base_env(),
        log_dir=stack.log_dir,
    )
    try:
        url = f"http://127.0.0.1:{port}/"

        async def answering() -> None:
            async with httpx.AsyncClient(timeout=2) as probe:
                while True:
                    if process.popen.poll() is not None:
                        raise RuntimeError(f"bare daphne exited: {process.log()[-2000:]}")
                    with contextlib.suppress(httpx.TransportError):
                        if (await probe.get(url)).status_code == 200:
                            return
                    await asyncio.sleep(0.05)

        await within(answering(), 30, "the bare daphne to answer")
        async with httpx.AsyncClient(timeout=10) as bare:
            for _ in range(20):
                (await bare.get(url)).raise_for_status()
            samples = []
            cpu0 = cpu_seconds(process.popen.pid)
            for _ in range(n):
                t0 = time.perf_counter()
                (await bare.get(url)).raise_for_status()
                samples.append(time.perf_counter() - t0)
            cpu = cpu_seconds(process.popen.pid) - cpu0
        return {**summary_ms(samples), "server_cpu_ms": round(cpu * 1000 / n, 3)}
    finally:
        process.stop()


async def floor(
    client: httpx.AsyncClient, stack: Stack, args: argparse.Namespace
) -> dict[str, Any]:
    server_pid = stack.server.process.popen.pid
    out: dict[str, Any] = {}
    for name, path, n in (
        ("noop", "/bench/noop", args.floor_requests),
        ("health", "/health", max(1, args.floor_requests // 3)),
    ):
        for _ in range(20):
            (await client.get(path)).raise_for_status()
        samples = []
        cpu0 = cpu_seconds(server_pid)
        for _ in range(n):
            t0 = time.perf_counter()
            (await client.get(path)).raise_for_status()
            samples.append(time.perf_counter() - t0)
        out[name] = {
            **summary_ms(samples),
            "server_cpu_ms": round((cpu_seconds(server_pid) - cpu0) * 1000 / n, 3),
        }

    out["bare_daphne"] = await bare_daphne_floor(stack, args.floor_requests)

    # A stub runner on a session with an open turn: WebSocket ping/pong, then text deltas.
    runner_id, token = await register_runner(client, "bench-floor")
    stub = StubRunner(stack.server.url, runner_id, token)
    try:
        await stub.start()
        await wait_online(client, runner_id)
        assert stub.ws is not None
        for _ in range(20):  # warm-up, as for the HTTP floors
            await within(await stub.ws.ping(), 10, "a WebSocket pong")
        samples = []
        cpu0 = cpu_seconds(server_pid)
        for _ in range(args.floor_requests):
            t0 = time.perf_counter()
            await within(await stub.ws.ping(), 10, "a WebSocket pong")
            samples.append(time.perf_counter() - t0)
        out["ws_ping"] = {
            **summary_ms(samples),
            "server_cpu_ms": round(
                (cpu_seconds(server_pid) - cpu0) * 1000 / args.floor_requests, 3
            ),
        }
        session_id = await create_session(client, agent_bundle(os_env=False), "bench-floor")
        opened = stub.expect_command("session.open")
        await bind(client, session_id, runner_id)
        await within(opened, 30, "session.open on the stub")
        started = stub.expect_command("turn.start")
        response_id = (await post_message(client, session_id, "floor"))["response_id"]
        await within(started, 30, "turn.start on the stub")
        samples = []
        n = args.floor_requests
        q0 = await sql_counters(client)
        cpu0 = cpu_seconds(server_pid)
        for seq in range(1, n + 1):
            t0 = time.perf_counter()
            await stub.send_event(
                session_id,
                seq,
                {
                    "type": "response.output_text.delta",
                    "response_id": response_id,
                    "item_id": "item_floor",
                    "delta": "word ",
                },
            )
            await stub.wait_acked(session_id, seq, 10)
            samples.append(time.perf_counter() - t0)
        cpu = cpu_seconds(server_pid) - cpu0
        out["event_ack"] = {
            **summary_ms(samples),
            "server_cpu_ms": round(cpu * 1000 / n, 3),
            "sql": sql_delta(q0, await sql_counters(client), n),
        }
        out.update(await event_bursts(stub, server_pid, session_id, response_id, n + 1, args))
    finally:
        await stub.close()
    return out


BURST = 8  # a text turn's events: status, created, deltas, item, completed, status
BURSTS_PER_BLOCK = 10


async def event_bursts(
    stub: StubRunner,
    server_pid: int,
    session_id: str,
    response_id: str,
    first_seq: int,
    args: argparse.Namespace,
) -> dict[str, dict[str, Any]]:
    """A turn's worth of events at once, as eight ``event`` messages and as one
    ``events`` message (docs/protocol.md, Batches): server CPU per event and the time
    from the first send to the last event's ``event.ack``. The two kinds alternate in
    blocks of ten bursts, so the machine's drift falls on both alike."""
    delta = {
        "type": "response.output_text.delta",
        "response_id": response_id,
        "item_id": "item_floor",
        "delta": "word ",
    }
    samples: dict[str, list[float]] = {"event_burst_single": [], "event_burst_batched": []}
    cpu: dict[str, float] = dict.fromkeys(samples, 0.0)
    seq = first_seq
    blocks = max(1, args.floor_requests // (BURST * BURSTS_PER_BLOCK))
    for _ in range(blocks):
        for name in samples:
            cpu0 = cpu_seconds(server_pid)
            for _ in range(BURSTS_PER_BLOCK):
                t0 = time.perf_counter()
                await stub.send_events(
                    session_id, seq, [delta] * BURST, batched=name.endswith("batched")
                )
                seq += BURST
                await stub.wait_acked(session_id, seq - 1, 10)
                samples[name].append(time.perf_counter() - t0)
            cpu[name] += cpu_seconds(server_pid) - cpu0
    events = blocks * BURSTS_PER_BLOCK * BURST
    return {
        name: {**summary_ms(samples[name]), "server_cpu_ms": round(cpu[name] * 1000 / events, 3)}
        for name in samples
    }


# --------------------------------------------------------------------------- 2. snapshot GET


async def snapshot_cost(
    client: httpx.AsyncClient, stack: Stack, args: argparse.Namespace
) -> dict[str, Any]:
    server_pid = stack.server.process.popen.pid
    agent = await client.post(
        "/v1/sessions",
        files={"bundle": ("agent.tar.gz", agent_bundle(os_env=False), "application/gzip")},
        data={"metadata": json.dumps({"title": "bench-agent"})},
    )
    agent.raise_for_status()
    agent_id = agent.json()["agent_id"]
    text = "A sentence of an ordinary conversation, about forty characters. " * 3
    out: dict[str, Any] = {}
    for count in (10, 100):
        items = [
            {
                "type": "message",
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"{i}: {text}",
            }
            for i in range(count)
        ]
        created = await client.post(
            "/v1/sessions", json={"agent_id": agent_id, "title": "snap", "initial_items": items}
        )
        created.raise_for_status()
        session_id = created.json()["id"]
        for _ in range(20):
            (await client.get(f"/v1/sessions/{session_id}")).raise_for_status()
        n = args.snapshot_requests
        samples, size = [], 0
        q0 = await sql_counters(client)
        cpu0 = cpu_seconds(server_pid)
        for _ in range(n):
            t0 = time.perf_counter()
            response = await client.get(f"/v1/sessions/{session_id}")
            samples.append(time.perf_counter() - t0)
            response.raise_for_status()
            size = len(response.content)
        cpu = cpu_seconds(server_pid) - cpu0
        out[str(count)] = {
            **summary_ms(samples),
            "server_cpu_ms": round(cpu * 1000 / n, 3),
            "bytes": size,
            "sql": sql_delta(q0, await sql_counters(client), n),
        }
        if count == 100:
            not_modified = await not_modified_cost(client, server_pid, session_id, n)
            if not_modified is not None:
                out["304"] = {**not_modified, "items": count}
    return out


async def not_modified_cost(
    client: httpx.AsyncClient, server_pid: int, session_id: str, n: int
) -> dict[str, Any] | None:
    """The snapshot GET answered ``304``: ``If-None-Match`` with the ETag of a first GET.

    What a polling client that keeps its last ETag costs while nothing changes; ``None``
    when the server sends no ETag (nothing to measure).
    """
    path = f"/v1/sessions/{session_id}"
    first = await client.get(path)
    first.raise_for_status()
    etag = first.headers.get("ETag")
    if not etag:
        return None
    headers = {"If-None-Match": etag}

    async def get() -> httpx.Response:
        response = await client.get(path, headers=headers)
        if response.status_code != 304:
            raise RuntimeError(f"If-None-Match {etag} → HTTP {response.status_code}, not 304")
        return response

    for _ in range(20):
        await get()
    samples, size = [], 0
    q0 = await sql_counters(client)
    cpu0 = cpu_seconds(server_pid)
    for _ in range(n):
        t0 = time.perf_counter()
        response = await get()
        samples.append(time.perf_counter() - t0)
        size = len(response.content)
    cpu = cpu_seconds(server_pid) - cpu0
    return {
        **summary_ms(samples),
        "server_cpu_ms": round(cpu * 1000 / n, 3),
        "bytes": size,
        "sql": sql_delta(q0, await sql_counters(client), n),
    }


# --------------------------------------------------------------------------- 3. single turns


async def single_turns(
    client: httpx.AsyncClient, stack: Stack, args: argparse.Namespace
) -> dict[str, Any]:
    """Fresh sessions one after another; counters are read around each second turn."""
    watch = TurnWatch()
    sessions = await new_sessions(client, stack.runner_id, args.single)
    first, second, accept = [], [], []
    cpu = CpuClock(stack.pids())
    per_turn: list[dict[str, Any]] = []
    for session_id in sessions:
        stream = CountingStream(client, session_id, watch.listener(session_id))
        try:
            await open_streams([stream])
            for turn in (1, 2):
                (token,) = await script_turns(stack.mock, client, 1, args.words)
                watch.reset(session_id)
                q0, m0 = await sql_counters(client), stack.meter_report()
                e0, b0 = stream.events, stream.bytes
                cpu.start()
                t0 = time.perf_counter()
                accepted = await post_message(client, session_id, f"Say it {token}.")
                t_202 = time.perf_counter()
                t_end = await watch.wait(session_id, accepted["response_id"], args.turn_deadline)
                if turn == 1:
                    first.append(t_end - t0)
                    continue
                second.append(t_end - t0)
                accept.append(t_202 - t0)
                counters: dict[str, Any] = {"cpu_ms_per_turn": cpu.per_turn_ms(1)}
                # Let the last event's ack land before the counters are read.
                await asyncio.sleep(0.05)
                counters["stream_events_per_turn"] = stream.events - e0
                counters["stream_bytes_per_turn"] = stream.bytes - b0
                counters["sql_per_turn"] = sql_delta(q0, await sql_counters(client), 1)
                m1 = stack.meter_report()
                if m0 is not None and m1 is not None:
                    counters["tunnel_per_turn"] = meter_delta(m0, m1, 1)
                per_turn.append(counters)
        finally:
            await stream.close()
    return {
        "turn1": summary_ms(first),
        "turn2": summary_ms(second),
        "post_202": summary_ms(accept),
        # Means over the second turns (the counters include the 50 ms after each).
        **mean_of(per_turn),
    }


def mean_of(dicts: list[dict[str, Any]]) -> dict[str, Any]:
    """The element-wise mean of numeric leaves of equally shaped dicts (missing = 0)."""
    out: dict[str, Any] = {}
    for key in sorted({k for d in dicts for k in d}):
        values = [d.get(key) for d in dicts]
        if all(isinstance(v, dict) or v is None for v in values):
            out[key] = mean_of([v or {} for v in values])
        elif all(isinstance(v, int | float) or v is None for v in values):
            out[key] = round(sum(v or 0 for v in values) / len(values), 3)
    return out


# --------------------------------------------------------------------------- 4. rounds


async def measure_round(
    clients: Clients,
    stack: Stack,
    turns: list[Any],
) -> tuple[float, list[Any], dict[str, Any]]:
    """Run the coroutines ``turns`` at once; return wall seconds, their results, counters."""
    q0, m0 = await sql_counters_all(clients.api), stack.meter_report()
    cpu = CpuClock(stack.pids())
    cpu.start()
    t0 = time.perf_counter()
    results = await asyncio.gather(*turns)
    wall = time.perf_counter() - t0
    n = len(turns)
    cpu_ms = cpu.per_turn_ms(n)
    by_process = cpu.per_process_ms(n)
    await asyncio.sleep(0.05)
    counters: dict[str, Any] = {
        "cpu_ms_per_turn": cpu_ms,
        "sql_per_turn": sql_delta(q0, await sql_counters_all(clients.api), n),
    }
    if by_process:
        counters["cpu_ms_per_turn_by_process"] = by_process
    m1 = stack.meter_report()
    if m0 is not None and m1 is not None:
        counters["tunnel_per_turn"] = meter_delta(m0, m1, n)
    return wall, list(results), counters


@dataclass
class PollResult:
    seconds: float
    polls: int
    bytes: int
    not_modified: int
    post_seconds: float
    poll_seconds: list[float]


async def poll_rounds(
    clients: Clients,
    stack: Stack,
    args: argparse.Namespace,
    profile_dir: Path | None,
) -> list[dict[str, Any]]:
    sessions = await placed_sessions(clients, stack, args.sessions)
    interval = args.poll_ms / 1000
    etags: dict[str, str] = {}  # with --poll-etag: the last ETag each poller got

    async def one(placed: Placed, token: str) -> PollResult:
        session_id = placed.session_id
        pollers = clients.pollers[placed.server]
        t0 = time.perf_counter()
        accepted = await post_message(clients.api[placed.server], session_id, f"Say it {token}.")
        response_id = accepted["response_id"]
        posted = time.perf_counter() - t0
        poll_seconds: list[float] = []
        polls = size = not_modified = 0
        while True:
            # As the compatible clients do: wait the interval after each answer (a slow
            # server is polled less often, never in a burst of catch-up requests).
            await asyncio.sleep(interval)
            etag = etags.get(session_id) if args.poll_etag else None
            asked = time.perf_counter()
            response = await pollers.get(
                f"/v1/sessions/{session_id}", headers={"If-None-Match": etag} if etag else None
            )
            poll_seconds.append(time.perf_counter() - asked)
            polls += 1
            size += len(response.content)
            if response.status_code == 304:
                # Unchanged since the last 200, which was not this turn's end.
                not_modified += 1
                continue
            response.raise_for_status()
            if response.headers.get("ETag"):
                etags[session_id] = response.headers["ETag"]
            body = response.json()
            if body.get("status") == "failed":
                raise RuntimeError(f"session {session_id} failed: {body.get('last_task_error')}")
            if body.get("status") == "idle" and any(
                item.get("response_id") == response_id
                and (item.get("data") or {}).get("role") == "assistant"
                for item in body.get("items", [])
            ):
                return PollResult(
                    time.perf_counter() - t0, polls, size, not_modified, posted, poll_seconds
                )

    async def deadline(placed: Placed, token: str) -> PollResult:
        result: PollResult = await within(
            one(placed, token), args.turn_deadline, f"turn of {placed.session_id}"
        )
        return result

    rounds = []
    profilers = start_profilers(stack, profile_dir, "poll", args)
    try:
        for number in range(1, args.rounds + 1):
            tokens = await script_turns(stack.mock, clients.api[0], len(sessions), args.words)
            wall, results, counters = await measure_round(
                clients, stack, [deadline(s, t) for s, t in zip(sessions, tokens, strict=True)]
            )
            n = len(results)
            rounds.append(
                {
                    "round": number,
                    "turns": n,
                    "wall_s": round(wall, 3),
                    "turns_per_s": round(n / wall, 2),
                    "turn": summary_ms([r.seconds for r in results]),
                    "post": summary_ms([r.post_seconds for r in results]),
                    "poll": summary_ms([s for r in results for s in r.poll_seconds]),
                    "polls_per_turn": per_x(sum(r.polls for r in results), n),
                    "polls_304_per_turn": per_x(sum(r.not_modified for r in results), n),
                    "poll_bytes_per_turn": per_x(sum(r.bytes for r in results), n, 1),
                    **counters,
                }
            )
    finally:
        stop_profilers(profilers)
    return rounds


async def stream_rounds(
    clients: Clients,
    stack: Stack,
    args: argparse.Namespace,
    profile_dir: Path | None,
) -> list[dict[str, Any]]:
    sessions = await placed_sessions(clients, stack, args.sessions)
    watch = TurnWatch()
    streams = [
        CountingStream(clients.readers[p.server], p.session_id, watch.listener(p.session_id))
        for p in sessions
    ]
    rounds = []
    try:
        await open_streams(streams)

        async def one(placed: Placed, token: str) -> float:
            session_id = placed.session_id
            watch.reset(session_id)
            t0 = time.perf_counter()
            accepted = await post_message(
                clients.api[placed.server], session_id, f"Say it {token}."
            )
            t_end = await watch.wait(session_id, accepted["response_id"], args.turn_deadline)
            return t_end - t0

        profilers = start_profilers(stack, profile_dir, "stream", args)
        try:
            for number in range(1, args.rounds + 1):
                tokens = await script_turns(stack.mock, clients.api[0], len(sessions), args.words)
                e0 = sum(s.events for s in streams)
                b0 = sum(s.bytes for s in streams)
                wall, results, counters = await measure_round(
                    clients, stack, [one(s, t) for s, t in zip(sessions, tokens, strict=True)]
                )
                n = len(results)
                rounds.append(
                    {
                        "round": number,
                        "turns": n,
                        "wall_s": round(wall, 3),
                        "turns_per_s": round(n / wall, 2),
                        "turn": summary_ms(results),
                        "max_stream_stall_ms": round(max(watch.max_gap.values()) * 1000, 1),
                        "max_first_event_ms": round(max(watch.first_wait.values()) * 1000, 1),
                        "max_stream_stall_between": watch.longest_gap_between(),
                        "stream_events_per_turn": per_x(sum(s.events for s in streams) - e0, n),
                        "stream_bytes_per_turn": per_x(sum(s.bytes for s in streams) - b0, n, 1),
                        **counters,
                    }
                )
        finally:
            stop_profilers(profilers)
    finally:
        await asyncio.gather(*(s.close() for s in streams), return_exceptions=True)
    return rounds


async def warm_up(
    clients: Clients, stack: Stack, runners: list[int], args: argparse.Namespace
) -> None:
    """One untimed turn on each runner in ``runners``, through the server its sessions'
    clients use.

    A process's first turn pays once for what later turns reuse (imports, the LLM
    client, the first requests of each view); runner 0 has paid it in the single turns
    when they ran, the others have not. Without this the first round would charge that
    start-up to a number of turns that shrinks as the servers grow.
    """
    bundle = agent_bundle(os_env=False)
    watch = TurnWatch()
    for index in runners:
        server = stack.client_server(index)
        client = clients.api[server]
        session_id = await create_session(client, bundle, f"bench-warm-up-{index}")
        await bind(client, session_id, stack.runner_ids[index])
        (token,) = await script_turns(stack.mock, client, 1, args.words)
        stream = CountingStream(clients.readers[server], session_id, watch.listener(session_id))
        try:
            await open_streams([stream])
            watch.reset(session_id)
            accepted = await post_message(client, session_id, f"Say it {token}.")
            await watch.wait(session_id, accepted["response_id"], args.turn_deadline)
        finally:
            await stream.close()


def profiled_processes(count: int) -> list[str]:
    """Names of the profiled processes: ``server``/``runner``, or ``server0``… of several."""
    if count == 1:
        return ["server", "runner"]
    return [f"{role}{i}" for i in range(count) for role in ("server", "runner")]


def start_profilers(
    stack: Stack, profile_dir: Path | None, mode: str, args: argparse.Namespace
) -> list[tuple[str, Profiler]]:
    if profile_dir is None:
        return []
    pids = dict(
        zip(
            profiled_processes(len(stack.servers)),
            [
                pid
                for server, runner in zip(stack.servers, stack.runners, strict=True)
                for pid in (server.process.popen.pid, runner.popen.pid)
            ],
            strict=True,
        )
    )
    profilers = [
        (
            f"{mode}.{name}",
            Profiler(
                pid,
                profile_dir / f"{mode}-{name}.txt",
                args.profile_rate,
                gil_only=args.profile_gil,
            ),
        )
        for name, pid in pids.items()
    ]
    time.sleep(1.0)  # py-spy attaches before the first round starts
    return profilers


def stop_profilers(profilers: list[tuple[str, Profiler]]) -> None:
    for _name, profiler in profilers:
        profiler.stop()


# --------------------------------------------------------------------------- one run


async def measure(
    stack: Stack, args: argparse.Namespace, profile_dir: Path | None
) -> dict[str, Any]:
    limit = args.sessions * 2 + 10
    async with contextlib.AsyncExitStack() as exits:

        async def per_server(connections: int) -> list[httpx.AsyncClient]:
            return [
                await exits.enter_async_context(
                    async_client(server.url, connections=connections, timeout=60)
                )
                for server in stack.servers
            ]

        clients = Clients(
            api=await per_server(limit),
            pollers=await per_server(args.sessions + 5),
            readers=await per_server(args.sessions + 5),
        )
        client = clients.api[0]
        result: dict[str, Any] = {}
        if profile_dir is None and not args.rounds_only:
            result["floor"] = await floor(client, stack, args)
            result["snapshot"] = await snapshot_cost(client, stack, args)
            result["single"] = await single_turns(client, stack, args)
            result["idle_pollers"] = await idle_pollers(clients, stack, args)
        elif not args.rounds_only:
            # The profiled run: what the idle pollers alone cost, apart from the rounds.
            profilers = start_profilers(stack, profile_dir, "idle", args)
            try:
                result["idle_pollers"] = await idle_pollers(clients, stack, args)
            finally:
                stop_profilers(profilers)
        ran_single = "single" in result
        await warm_up(clients, stack, list(range(1 if ran_single else 0, len(stack.runners))), args)
        if "poll" in args.modes:
            result["poll"] = await poll_rounds(clients, stack, args, profile_dir)
        if "stream" in args.modes:
            result["stream"] = await stream_rounds(clients, stack, args, profile_dir)
    return result


def one_run(args: argparse.Namespace, profile_dir: Path | None = None) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        processes = start_stack(stack, tmp, args)
        result = asyncio.run(measure(processes, args, profile_dir))
        if args.webhooks:
            result["webhook_requests"] = len(args.webhook_receiver.requests)
        return result


# --------------------------------------------------------------------------- report


def flatten(run: dict[str, Any]) -> dict[str, float]:
    """The headline numbers of one run, by dotted name."""
    flat: dict[str, float] = {}

    def put(name: str, value: Any) -> None:
        if isinstance(value, int | float):
            flat[name] = float(value)

    fl = run.get("floor", {})
    for key in (
        "bare_daphne",
        "noop",
        "health",
        "ws_ping",
        "event_ack",
        "event_burst_single",
        "event_burst_batched",
    ):
        if key in fl:
            put(f"floor.{key}.p50_ms", fl[key]["p50_ms"])
            put(f"floor.{key}.server_cpu_ms", fl[key]["server_cpu_ms"])
    if "event_ack" in fl:
        put("floor.event_ack.sql", fl["event_ack"]["sql"]["statements"])
    for count, snap in run.get("snapshot", {}).items():
        for key in ("p50_ms", "server_cpu_ms", "bytes"):
            put(f"snapshot.{count}.{key}", snap[key])
        put(f"snapshot.{count}.sql", snap["sql"]["statements"])
    single = run.get("single")
    if single:
        put("single.turn1.p50_ms", single["turn1"]["p50_ms"])
        put("single.turn2.p50_ms", single["turn2"]["p50_ms"])
        put("single.turn2.p95_ms", single["turn2"]["p95_ms"])
        put("single.post_202.p50_ms", single["post_202"]["p50_ms"])
        put("single.post_202.p95_ms", single["post_202"]["p95_ms"])
        for proc, ms in single["cpu_ms_per_turn"].items():
            put(f"single.turn2.cpu_ms.{proc}", ms)
        put("single.stream_events_per_turn", single["stream_events_per_turn"])
    idle = run.get("idle_pollers")
    if idle and "p50_ms" in idle:
        for key in ("p50_ms", "polls_per_s", "server_cpu_ms", "server_cpu_share"):
            put(f"idle_pollers.{key}", idle[key])
    for mode in ("poll", "stream"):
        for rnd in run.get(mode, []):
            base = f"{mode}.round{rnd['round']}"
            put(f"{base}.turns_per_s", rnd["turns_per_s"])
            put(f"{base}.p50_ms", rnd["turn"]["p50_ms"])
            put(f"{base}.p95_ms", rnd["turn"]["p95_ms"])
            put(f"{base}.p99_ms", rnd["turn"]["p99_ms"])
            put(f"{base}.max_ms", rnd["turn"]["max_ms"])
            for proc, ms in rnd["cpu_ms_per_turn"].items():
                put(f"{base}.cpu_ms.{proc}", ms)
            for proc, ms in rnd.get("cpu_ms_per_turn_by_process", {}).items():
                put(f"{base}.cpu_ms.{proc}", ms)
            put(
                f"{base}.cpu_ms.server+runner",
                rnd["cpu_ms_per_turn"]["server"] + rnd["cpu_ms_per_turn"]["runner"],
            )
            put(f"{base}.sql_per_turn", rnd["sql_per_turn"]["statements"])
            put(f"{base}.sql_ms_per_turn", rnd["sql_per_turn"]["sql_ms"])
            put(f"{base}.sql_begin_per_turn", rnd["sql_per_turn"]["by_verb"].get("BEGIN", 0))
            tunnel = rnd.get("tunnel_per_turn")
            if tunnel:
                for direction in ("up", "down"):
                    put(f"{base}.tunnel_msgs_{direction}", tunnel[f"messages_{direction}_per_turn"])
                    put(f"{base}.tunnel_bytes_{direction}", tunnel[f"bytes_{direction}_per_turn"])
                    batched = tunnel.get(f"batched_{direction}_per_turn", {})
                    put(f"{base}.tunnel_batched_{direction}", round(sum(batched.values()), 2))
            for key in (
                "polls_per_turn",
                "polls_304_per_turn",
                "poll_bytes_per_turn",
                "stream_events_per_turn",
                "stream_bytes_per_turn",
                "max_stream_stall_ms",
                "max_first_event_ms",
            ):
                put(f"{base}.{key}", rnd.get(key))
    return flat


def latency_table(flats: list[dict[str, float]]) -> dict[str, list[dict[str, float]]]:
    """Per run, each concurrent round's per-turn p50/p99/max (ms), printed as a table:
    a turn that waits on a timer shows up as one run's max far above its p99."""
    table: dict[str, list[dict[str, float]]] = {}
    for mode in ("poll", "stream"):
        for number in (1, 2):
            base = f"{mode}.round{number}"
            if not any(f"{base}.max_ms" in flat for flat in flats):
                continue
            table[base] = [
                {k: flat.get(f"{base}.{k}_ms", float("nan")) for k in ("p50", "p99", "max")}
                for flat in flats
            ]
    if table:
        print("== per-turn latency of each run (ms): p50 / p99 / max", flush=True)
        print("   " + f"{'run':>4}" + "".join(f" {base:>26}" for base in table), flush=True)
        for index in range(len(flats)):
            cells = "".join(
                " {p50:>8.0f} {p99:>8.0f} {max:>8.0f}".format(**rows[index])
                for rows in table.values()
            )
            print(f"   {index + 1:>4}{cells}", flush=True)
    return table


def spread(flats: list[dict[str, float]]) -> dict[str, list[float]]:
    keys = sorted({k for flat in flats for k in flat})
    out = {}
    for key in keys:
        values = [flat[key] for flat in flats if key in flat]
        out[key] = [
            round(min(values), 3),
            round(statistics.median(values), 3),
            round(max(values), 3),
        ]
    return out


def floor_multiples(medians: dict[str, float]) -> dict[str, float]:
    """Each step's median p50 (and server CPU) in multiples of the floor's."""
    http = medians.get("floor.noop.p50_ms")
    http_cpu = medians.get("floor.noop.server_cpu_ms")
    ws = medians.get("floor.ws_ping.p50_ms")
    out: dict[str, float] = {}
    if not http or not http_cpu or not ws:
        return out
    steps = {
        "snapshot GET, 10 items": ("snapshot.10.p50_ms", "snapshot.10.server_cpu_ms"),
        "snapshot GET, 100 items": ("snapshot.100.p50_ms", "snapshot.100.server_cpu_ms"),
        "snapshot GET → 304, 100 items": ("snapshot.304.p50_ms", "snapshot.304.server_cpu_ms"),
        "POST …/events (message) → 202": ("single.post_202.p50_ms", None),
        "second turn alone, POST → idle": ("single.turn2.p50_ms", "single.turn2.cpu_ms.server"),
        "/health": ("floor.health.p50_ms", "floor.health.server_cpu_ms"),
        "daphne alone (bench/bare_asgi.py)": (
            "floor.bare_daphne.p50_ms",
            "floor.bare_daphne.server_cpu_ms",
        ),
    }
    for label, (wall_key, cpu_key) in steps.items():
        if wall_key in medians:
            out[f"{label}: wall × noop"] = round(medians[wall_key] / http, 1)
        if cpu_key and cpu_key in medians:
            out[f"{label}: server CPU × noop"] = round(medians[cpu_key] / http_cpu, 1)
    if "floor.event_ack.p50_ms" in medians:
        out["runner event → event.ack: wall × WebSocket ping"] = round(
            medians["floor.event_ack.p50_ms"] / ws, 1
        )
    return out


def scaled(args: argparse.Namespace, count: int) -> argparse.Namespace:
    """The options of one ``--scaling`` run: ``count`` servers on PostgreSQL + Redis,
    the concurrent rounds only."""
    copy = argparse.Namespace(**vars(args))
    copy.servers = count
    copy.database = "postgres"
    copy.cross = args.cross and count > 1
    copy.rounds_only = True
    return copy


SCALING_COLUMNS = (
    ("poll r1", "poll.round1.turns_per_s"),
    ("poll r2", "poll.round2.turns_per_s"),
    ("sse r1", "stream.round1.turns_per_s"),
    ("sse r2", "stream.round2.turns_per_s"),
    ("poll srv", "poll.round2.cpu_ms.server"),
    ("poll run", "poll.round2.cpu_ms.runner"),
    ("sse srv", "stream.round2.cpu_ms.server"),
    ("sse run", "stream.round2.cpu_ms.runner"),
)


def run_scaling(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """``--scaling``: the concurrent rounds for each server count, ``--runs`` times each
    (the counts interleaved, so a drift of the machine's speed hits them all alike)."""
    counts: list[int] = args.scaling
    runs: dict[int, list[dict[str, Any]]] = {count: [] for count in counts}
    flats: dict[int, list[dict[str, float]]] = {count: [] for count in counts}
    for number in range(1, args.runs + 1):
        for count in counts:
            print(f"== run {number}/{args.runs}: {count} server process(es)", flush=True)
            run = one_run(scaled(args, count))
            runs[count].append(run)
            flats[count].append(flatten(run))
            for key, value in flats[count][-1].items():
                if key.endswith(("turns_per_s", "p50_ms", "server+runner")):
                    print(f"   {key}: {value:g}", flush=True)
    result["scaling"] = {
        str(count): {
            "servers": count,
            "cross": args.cross and count > 1,
            "runs": runs[count],
            "spread_min_median_max": spread(flats[count]),
        }
        for count in counts
    }
    rows = []
    for count in counts:
        medians = {
            key: values[1]
            for key, values in result["scaling"][str(count)]["spread_min_median_max"].items()
        }
        rows.append({"servers": count, **{key: medians.get(key) for _, key in SCALING_COLUMNS}})
    result["scaling_table"] = rows
    where = (
        "the next server (--cross; N=1: the only one)"
        if args.cross
        else "the server of their runner"
    )
    print(
        f"== scaling on PostgreSQL + Redis, medians of {args.runs} run(s); clients use {where}",
        flush=True,
    )
    print(
        "   turns/s by round; CPU ms per turn of round 2: all servers (srv), all runners (run)",
        flush=True,
    )
    print("   " + f"{'N':>3}" + "".join(f" {label:>9}" for label, _ in SCALING_COLUMNS), flush=True)
    for row in rows:
        cells = "".join(
            f" {row[key]:>9g}" if row[key] is not None else f" {'-':>9}"
            for _, key in SCALING_COLUMNS
        )
        print(f"   {row['servers']:>3}{cells}", flush=True)


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of server counts: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"server counts must be 1 or more: {text!r}")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs on fresh processes")
    parser.add_argument("--sessions", type=int, default=20, help="concurrent sessions")
    parser.add_argument(
        "--runner-max-turns",
        type=int,
        default=0,
        help="each runner's OMNIGENT_RUNNER_MAX_TURNS (default: --sessions, so every turn "
        "starts at once; below it, the rest wait in the fair-share queue)",
    )
    parser.add_argument(
        "--user-max-turns",
        type=int,
        default=0,
        help="the servers' OMNIGENT_MAX_RUNNING_TURNS_PER_USER (default: --sessions: every "
        "session belongs to the benchmark's one user)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="turns per session, at once")
    parser.add_argument("--poll-ms", type=float, default=20.0, help="snapshot poll interval")
    parser.add_argument("--words", type=int, default=20, help="words (text deltas) per reply")
    parser.add_argument("--single", type=int, default=10, help="sessions for single turns")
    parser.add_argument("--floor-requests", type=int, default=300)
    parser.add_argument("--snapshot-requests", type=int, default=200)
    parser.add_argument("--turn-deadline", type=float, default=120.0)
    parser.add_argument(
        "--modes", default="poll,stream", help="concurrent modes: poll, stream or both"
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=1,
        help="server processes, each with a runner of its own (more than one: PostgreSQL + Redis)",
    )
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgres"),
        help="sqlite (in-memory channel layer) or postgres (with the Redis channel layer); "
        "default sqlite for one server, postgres for several",
    )
    parser.add_argument(
        "--cross",
        action="store_true",
        help="a session's clients use the server after its runner's, so every turn "
        "crosses Redis (needs 2 or more servers)",
    )
    parser.add_argument(
        "--poll-etag",
        action="store_true",
        help="pollers send If-None-Match with the last ETag they got (304s are counted)",
    )
    parser.add_argument(
        "--scaling",
        type=parse_counts,
        metavar="N,N,...",
        help="only the concurrent rounds, for each server count on PostgreSQL + Redis; "
        "prints a table (e.g. 1,2,3)",
    )
    parser.add_argument(
        "--no-tunnel-meter", action="store_true", help="each runner dials its server directly"
    )
    parser.add_argument(
        "--webhooks",
        type=int,
        default=0,
        metavar="N",
        help="N webhooks subscribed to every event, to a receiver on loopback",
    )
    parser.add_argument(
        "--webhook-worker",
        action="store_true",
        help="with --webhooks: deliveries sent by a manage.py deliverwebhooks process "
        "(OMNIGENT_WEBHOOK_DELIVERY=worker), not the server processes",
    )
    parser.add_argument(
        "--throttles",
        action="store_true",
        help="the client rate limits on (at 1,000,000/min), so every request reads and "
        "writes its count in the shared cache (Redis on PostgreSQL + Redis) as in production",
    )
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default="auto",
        help="the servers' OMNIGENT_EVENT_LOOP (auto: uvloop where installed)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="one more run (not in the spread) with py-spy on the servers and the runners "
        "during the concurrent rounds; raw stacks in DIR (outside the repository)",
    )
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples/s")
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="sample only the thread holding the GIL (where CPU goes, not where threads wait)",
    )
    parser.add_argument(
        "--rounds-only",
        action="store_true",
        help="only the concurrent rounds (section 4): fresh sessions, no floor or single turns",
    )
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    args.modes = {m.strip() for m in args.modes.split(",") if m.strip()}
    if args.servers < 1:
        parser.error("--servers must be 1 or more")
    for option in ("floor_requests", "snapshot_requests", "single", "sessions", "rounds"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be 1 or more")
    if args.scaling and args.database == "sqlite":
        parser.error("--scaling runs every server count on PostgreSQL + Redis")
    if args.database is None:
        args.database = "sqlite" if args.servers == 1 else "postgres"
    if args.database == "sqlite" and args.servers > 1:
        parser.error("several server processes share PostgreSQL + Redis, not SQLite")
    if args.cross and args.servers < 2 and not args.scaling:
        parser.error("--cross needs --servers 2 or more")
    if args.scaling and args.profile is not None:
        parser.error("--profile profiles one configuration: use it with --servers, not --scaling")
    sigterm_as_interrupt()

    result: dict[str, Any] = {
        "bench": "throughput",
        **env_summary(),
        "sessions": args.sessions,
        "rounds": args.rounds,
        "poll_ms": args.poll_ms,
        "poll_etag": args.poll_etag,
        "words": args.words,
        "tunnel_meter": not args.no_tunnel_meter,
        "cross": args.cross,
        "event_loop": args.event_loop,
        "throttles": args.throttles,
        "webhooks": args.webhooks,
        "webhook_worker": args.webhook_worker,
    }
    if args.scaling:
        result["scaling_servers"] = args.scaling
        result["database"] = "postgres"
        run_scaling(args, result)
        final_json(result)
        return 0
    result["servers"] = args.servers
    result["database"] = args.database
    runs, flats = [], []
    for number in range(1, args.runs + 1):
        print(f"== run {number}/{args.runs}", flush=True)
        run = one_run(args)
        runs.append(run)
        flats.append(flatten(run))
        for key, value in flats[-1].items():
            if key.endswith(("turns_per_s", "p50_ms", "server+runner")):
                print(f"   {key}: {value:g}", flush=True)
    result["runs"] = runs
    result["spread_min_median_max"] = spread(flats)
    medians = {key: values[1] for key, values in result["spread_min_median_max"].items()}
    result["floor_multiples"] = floor_multiples(medians)
    print(f"== spread over {args.runs} run(s): min / median / max", flush=True)
    for key, (low, mid, high) in result["spread_min_median_max"].items():
        print(f"   {key:48s} {low:>10g} {mid:>10g} {high:>10g}", flush=True)
    result["latency_by_run"] = latency_table(flats)
    print("== in multiples of the floor (medians)", flush=True)
    for key, value in result["floor_multiples"].items():
        print(f"   {key}: {value:g}", flush=True)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        print(f"== profiled run (py-spy, raw stacks in {args.profile})", flush=True)
        profiled = one_run(args, args.profile)
        result["profiled_run"] = profiled
        result["profile"] = {
            f"{mode}.{proc}": summarise_profile(args.profile / f"{mode}-{proc}.txt")
            for mode in ["idle", *sorted(args.modes)]
            for proc in profiled_processes(args.servers)
        }
        for name, summary in result["profile"].items():
            print(f"   {name}: {summary.get('samples', 0)} samples", flush=True)
            for func, pct in summary.get("self_pct", [])[:12]:
                print(f"      self {pct:5.1f}%  {func}", flush=True)
    final_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
