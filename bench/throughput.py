"""Benchmark: many sessions' text turns at once (issue 14), the floor, and a profile.

One run starts a daphne process (SQLite, in-memory layer, production settings plus SQL
counting: ``bench/server_settings.py``), the mock LLM and a tunnel meter (a counting TCP
proxy, ``bench/tunnel_meter.py``) as processes of their own, and the real runner program
behind the meter. Every turn is one streamed text reply of ``--words`` words. It measures:

1. the floor: a trivial async view (``GET /bench/noop``), ``GET /health``, a bare
   WebSocket ping/pong through the tunnel, and one runner event → ``event.ack`` (a text
   delta, from a stub runner);
2. one snapshot ``GET /v1/sessions/{id}`` of a session with 10 and with 100 items;
3. single turns: fresh sessions one after another, first turn and second turn
   (POST → ``session.status`` idle on the stream) and the second turn's POST → 202;
4. ``--sessions`` sessions (20) each running one turn at the same time, then a second
   turn each, with clients polling the snapshot every ``--poll-ms`` (20) until it reads
   idle with the reply — and the same with clients following each session's stream.

For every round: turns/s, per-turn p50/p95, CPU per turn of the server, the runner, the
mock, the meter and this process, SQL statements per turn (by verb, with their time),
tunnel messages and bytes per turn (by frame type), and per turn on each stream (or of
polling). ``--runs N`` repeats everything on fresh processes and prints min/median/max
of every number; ``--profile DIR`` adds a run with ``py-spy`` on the server and the
runner during the concurrent rounds and prints their top functions.

Run: ``.venv/bin/python bench/throughput.py [--runs 5] [--profile /tmp/prof]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from bench._common import (  # noqa: E402
    USER,
    Server,
    StubRunner,
    agent_bundle,
    async_client,
    bind,
    cpu_seconds,
    create_session,
    env_summary,
    final_json,
    log_dir,
    post_message,
    register_runner,
    run_main,
    sigterm_as_interrupt,
    sqlite_env,
    start_daphne,
    summary_ms,
    wait_online,
    wait_runner_online,
    within,
)
from bench._load import (  # noqa: E402
    CountingStream,
    CpuClock,
    MockLLM,
    Profiler,
    TunnelMeter,
    meter_delta,
    open_streams,
    summarise_profile,
)
from testing.processes import Process, base_env, migrate, spawn  # noqa: E402

TURN_END = ("response.completed", "response.failed", "response.cancelled")
SETTINGS = "bench.server_settings"


@dataclass
class Stack:
    server: Server
    runner: Process
    mock: MockLLM
    meter: TunnelMeter | None
    runner_id: str

    def pids(self) -> dict[str, int]:
        pids = {
            "server": self.server.process.popen.pid,
            "runner": self.runner.popen.pid,
            "mock": self.mock.pid,
        }
        if self.meter is not None:
            pids["meter"] = self.meter.pid
        return pids

    def meter_report(self) -> dict[str, Any] | None:
        return self.meter.report() if self.meter is not None else None


def start_stack(stack: contextlib.ExitStack, tmp: Path, args: argparse.Namespace) -> Stack:
    env = sqlite_env(tmp, debug=False, name="db")
    env["DJANGO_SETTINGS_MODULE"] = SETTINGS
    migrate(env, tmp)
    server = start_daphne(stack, env=env, tmp=tmp, name="daphne")
    mock = MockLLM(tmp)
    stack.callback(mock.stop)
    meter = None
    if not args.no_tunnel_meter:
        meter = TunnelMeter(int(server.url.rsplit(":", 1)[1]), tmp)
        stack.callback(meter.stop)
    with server.client(USER) as client:
        response = client.post("/v1/runners", json={"name": "bench-throughput"})
        response.raise_for_status()
        runner_id, token = response.json()["runner_id"], response.json()["binding_token"]
    workspace = tmp / "workspace"
    workspace.mkdir(exist_ok=True)
    runner_env = base_env(
        RUNNER_SERVER_URL=meter.url if meter is not None else server.url,
        OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN=token,
        OMNIGENT_RUNNER_WORKSPACE=str(workspace),
        OMNIGENT_RUNNER_PARENT_PID=str(os.getpid()),
        OMNIGENT_RUNNER_LOG_LEVEL="WARNING",
        OPENAI_BASE_URL=mock.base_url,
        OPENAI_API_KEY="bench",
    )
    runner = spawn("runner", [sys.executable, "-m", "omnigent_runner"], env=runner_env, log_dir=tmp)
    stack.callback(runner.stop)
    wait_runner_online(server, runner_id, process=runner)
    return Stack(server=server, runner=runner, mock=mock, meter=meter, runner_id=runner_id)


# --------------------------------------------------------------------------- measuring aids


async def sql_counters(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/bench/queries")
    response.raise_for_status()
    return dict(response.json())


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

    def reset(self, session_id: str) -> None:
        self.logs[session_id] = []
        self.waiting.pop(session_id, None)

    def listener(self, session_id: str) -> Any:
        def on_event(event_type: str, data: str, t_recv: float) -> None:
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
    for token in tokens:  # one at a time: the mock's listen backlog is 5
        await mock.configure(client, [entry], token)
    return tokens


async def new_sessions(client: httpx.AsyncClient, runner_id: str, count: int) -> list[str]:
    bundle = agent_bundle(os_env=False)
    ids = []
    for i in range(count):
        session_id = await create_session(client, bundle, f"bench-{i}")
        await bind(client, session_id, runner_id)
        ids.append(session_id)
    return ids


def per_x(value: float, n: int, digits: int = 2) -> float:
    return round(value / n, digits)


# --------------------------------------------------------------------------- 1. the floor


async def floor(
    client: httpx.AsyncClient, stack: Stack, args: argparse.Namespace
) -> dict[str, Any]:
    server_pid = stack.server.process.popen.pid
    out: dict[str, Any] = {}
    for name, path, n in (
        ("noop", "/bench/noop", args.floor_requests),
        ("health", "/health", args.floor_requests // 3),
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

    # A stub runner on a session with an open turn: WebSocket ping/pong, then text deltas.
    runner_id, token = await register_runner(client, "bench-floor")
    stub = StubRunner(stack.server.url, runner_id, token)
    try:
        await stub.start()
        await wait_online(client, runner_id)
        assert stub.ws is not None
        samples = []
        cpu0 = cpu_seconds(server_pid)
        for _ in range(args.floor_requests):
            t0 = time.perf_counter()
            await within(await stub.ws.ping(), 10, "a WebSocket pong")
            samples.append(time.perf_counter() - t0)
        out["ws_ping"] = {
            **summary_ms(samples[20:]),
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
    finally:
        await stub.close()
    return out


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
    return out


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
    client: httpx.AsyncClient,
    stack: Stack,
    turns: list[Any],
) -> tuple[float, list[Any], dict[str, Any]]:
    """Run the coroutines ``turns`` at once; return wall seconds, their results, counters."""
    q0, m0 = await sql_counters(client), stack.meter_report()
    cpu = CpuClock(stack.pids())
    cpu.start()
    t0 = time.perf_counter()
    results = await asyncio.gather(*turns)
    wall = time.perf_counter() - t0
    n = len(turns)
    cpu_ms = cpu.per_turn_ms(n)
    await asyncio.sleep(0.05)
    counters: dict[str, Any] = {
        "cpu_ms_per_turn": cpu_ms,
        "sql_per_turn": sql_delta(q0, await sql_counters(client), n),
    }
    m1 = stack.meter_report()
    if m0 is not None and m1 is not None:
        counters["tunnel_per_turn"] = meter_delta(m0, m1, n)
    return wall, list(results), counters


async def poll_rounds(
    client: httpx.AsyncClient,
    pollers: httpx.AsyncClient,
    stack: Stack,
    args: argparse.Namespace,
    profile_dir: Path | None,
) -> list[dict[str, Any]]:
    sessions = await new_sessions(client, stack.runner_id, args.sessions)
    interval = args.poll_ms / 1000

    async def one(session_id: str, token: str) -> tuple[float, int, int]:
        t0 = time.perf_counter()
        accepted = await post_message(client, session_id, f"Say it {token}.")
        response_id = accepted["response_id"]
        polls = size = 0
        while True:
            # As the compatible clients do: wait the interval after each answer (a slow
            # server is polled less often, never in a burst of catch-up requests).
            await asyncio.sleep(interval)
            response = await pollers.get(f"/v1/sessions/{session_id}")
            polls += 1
            size += len(response.content)
            body = response.json()
            if body.get("status") == "failed":
                raise RuntimeError(f"session {session_id} failed: {body.get('last_task_error')}")
            if body.get("status") == "idle" and any(
                item.get("response_id") == response_id
                and (item.get("data") or {}).get("role") == "assistant"
                for item in body.get("items", [])
            ):
                return time.perf_counter() - t0, polls, size

    async def deadline(session_id: str, token: str) -> tuple[float, int, int]:
        result: tuple[float, int, int] = await within(
            one(session_id, token), args.turn_deadline, f"turn of {session_id}"
        )
        return result

    rounds = []
    profilers = start_profilers(stack, profile_dir, "poll", args)
    try:
        for number in range(1, args.rounds + 1):
            tokens = await script_turns(stack.mock, client, len(sessions), args.words)
            wall, results, counters = await measure_round(
                client, stack, [deadline(s, t) for s, t in zip(sessions, tokens, strict=True)]
            )
            n = len(results)
            rounds.append(
                {
                    "round": number,
                    "turns": n,
                    "wall_s": round(wall, 3),
                    "turns_per_s": round(n / wall, 2),
                    "turn": summary_ms([r[0] for r in results]),
                    "polls_per_turn": per_x(sum(r[1] for r in results), n),
                    "poll_bytes_per_turn": per_x(sum(r[2] for r in results), n, 1),
                    **counters,
                }
            )
    finally:
        stop_profilers(profilers)
    return rounds


async def stream_rounds(
    client: httpx.AsyncClient,
    readers: httpx.AsyncClient,
    stack: Stack,
    args: argparse.Namespace,
    profile_dir: Path | None,
) -> list[dict[str, Any]]:
    sessions = await new_sessions(client, stack.runner_id, args.sessions)
    watch = TurnWatch()
    streams = [CountingStream(readers, sid, watch.listener(sid)) for sid in sessions]
    rounds = []
    try:
        await open_streams(streams)

        async def one(session_id: str, token: str) -> float:
            watch.reset(session_id)
            t0 = time.perf_counter()
            accepted = await post_message(client, session_id, f"Say it {token}.")
            t_end = await watch.wait(session_id, accepted["response_id"], args.turn_deadline)
            return t_end - t0

        profilers = start_profilers(stack, profile_dir, "stream", args)
        try:
            for number in range(1, args.rounds + 1):
                tokens = await script_turns(stack.mock, client, len(sessions), args.words)
                e0 = sum(s.events for s in streams)
                b0 = sum(s.bytes for s in streams)
                wall, results, counters = await measure_round(
                    client, stack, [one(s, t) for s, t in zip(sessions, tokens, strict=True)]
                )
                n = len(results)
                rounds.append(
                    {
                        "round": number,
                        "turns": n,
                        "wall_s": round(wall, 3),
                        "turns_per_s": round(n / wall, 2),
                        "turn": summary_ms(results),
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


def start_profilers(
    stack: Stack, profile_dir: Path | None, mode: str, args: argparse.Namespace
) -> list[tuple[str, Profiler]]:
    if profile_dir is None:
        return []
    pids = {"server": stack.server.process.popen.pid, "runner": stack.runner.popen.pid}
    profilers = [
        (f"{mode}.{name}", Profiler(pid, profile_dir / f"{mode}-{name}.txt", args.profile_rate))
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
    async with (
        async_client(stack.server.url, connections=limit, timeout=60) as client,
        async_client(stack.server.url, connections=args.sessions + 5, timeout=60) as pollers,
        async_client(stack.server.url, connections=args.sessions + 5, timeout=60) as readers,
    ):
        result: dict[str, Any] = {}
        if profile_dir is None:
            result["floor"] = await floor(client, stack, args)
            result["snapshot"] = await snapshot_cost(client, stack, args)
            result["single"] = await single_turns(client, stack, args)
        if "poll" in args.modes:
            result["poll"] = await poll_rounds(client, pollers, stack, args, profile_dir)
        if "stream" in args.modes:
            result["stream"] = await stream_rounds(client, readers, stack, args, profile_dir)
    return result


def one_run(args: argparse.Namespace, profile_dir: Path | None = None) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        processes = start_stack(stack, tmp, args)
        return asyncio.run(measure(processes, args, profile_dir))


# --------------------------------------------------------------------------- report


def flatten(run: dict[str, Any]) -> dict[str, float]:
    """The headline numbers of one run, by dotted name."""
    flat: dict[str, float] = {}

    def put(name: str, value: Any) -> None:
        if isinstance(value, int | float):
            flat[name] = float(value)

    fl = run.get("floor", {})
    for key in ("noop", "health", "ws_ping", "event_ack"):
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
    for mode in ("poll", "stream"):
        for rnd in run.get(mode, []):
            base = f"{mode}.round{rnd['round']}"
            put(f"{base}.turns_per_s", rnd["turns_per_s"])
            put(f"{base}.p50_ms", rnd["turn"]["p50_ms"])
            put(f"{base}.p95_ms", rnd["turn"]["p95_ms"])
            for proc, ms in rnd["cpu_ms_per_turn"].items():
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
            for key in (
                "polls_per_turn",
                "poll_bytes_per_turn",
                "stream_events_per_turn",
                "stream_bytes_per_turn",
            ):
                put(f"{base}.{key}", rnd.get(key))
    return flat


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
        "POST …/events (message) → 202": ("single.post_202.p50_ms", None),
        "second turn alone, POST → idle": ("single.turn2.p50_ms", "single.turn2.cpu_ms.server"),
        "/health": ("floor.health.p50_ms", "floor.health.server_cpu_ms"),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs on fresh processes")
    parser.add_argument("--sessions", type=int, default=20, help="concurrent sessions")
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
        "--no-tunnel-meter", action="store_true", help="the runner dials the server directly"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="one more run (not in the spread) with py-spy on the server and the runner "
        "during the concurrent rounds; raw stacks in DIR (outside the repository)",
    )
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples/s")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    args.modes = {m.strip() for m in args.modes.split(",") if m.strip()}
    sigterm_as_interrupt()

    result: dict[str, Any] = {
        "bench": "throughput",
        **env_summary(),
        "sessions": args.sessions,
        "rounds": args.rounds,
        "poll_ms": args.poll_ms,
        "words": args.words,
        "tunnel_meter": not args.no_tunnel_meter,
    }
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
            for mode in sorted(args.modes)
            for proc in ("server", "runner")
        }
        for name, summary in result["profile"].items():
            print(f"   {name}: {summary.get('samples', 0)} samples", flush=True)
            for func, pct in summary.get("self_pct", [])[:12]:
                print(f"      self {pct:5.1f}%  {func}", flush=True)
    final_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
