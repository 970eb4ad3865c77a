"""Benchmark: what idle connections cost one daphne process (operations.md, Scale).

Two parts, each on a fresh server process (SQLite, the in-memory channel layer,
production settings, client limits off):

1. ``--runners`` (10,000) runners registered over HTTP, then connected at once as stub
   tunnels (hello, then only heartbeats: the stub answers every ``ping``), idle for
   ``--idle-s`` seconds (longer than two heartbeats);
2. ``--streams`` (2,000) open session streams (``--sessions`` sessions, the streams
   spread over them), idle for ``--idle-s`` seconds (longer than two stream heartbeats).

For each: the server's RSS before and with the connections (KiB per connection), its
CPU while they were idle (per connection per minute, and as a share of one core), how
long connecting took, and that every connection was still open at the end. The clients
share this process, never the server's.

Run: ``.venv/bin/python -m bench.scale [--runners 10000] [--streams 2000] [--idle-s 45]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httpx

from bench._common import (
    SSESubscriber,
    StubRunner,
    agent_bundle,
    async_client,
    cpu_seconds,
    create_session,
    env_summary,
    final_json,
    gather_limited,
    log_dir,
    mib,
    migrate,
    register_runner,
    rss_bytes,
    run_main,
    sigterm_as_interrupt,
    sqlite_env,
    start_daphne,
)
from testing.processes import Server

CONNECT_AT_ONCE = 200


def open_files_limit(wanted: int) -> int:
    """Raise this process's open-files limit (inherited by the server) towards ``wanted``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def server(stack: contextlib.ExitStack, args: argparse.Namespace, name: str) -> Server:
    tmp = log_dir(stack, args.keep_logs)
    env = sqlite_env(tmp, debug=False, name=name)
    env.update(
        OMNIGENT_THROTTLE_USER_RATE="0",
        OMNIGENT_THROTTLE_RUNNER_RATE="0",
        OMNIGENT_THROTTLE_POLL_RATE="0",
        OMNIGENT_MAX_STREAMS_PER_USER="0",
    )
    migrate(env, tmp)
    return start_daphne(stack, env=env, tmp=tmp, name=name)


async def idle_cost(pid: int, connections: int, idle_s: float) -> dict[str, Any]:
    """The server's CPU over ``idle_s`` seconds of ``connections`` idle connections."""
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(idle_s)  # the measured idle window itself, not a wait for an event
    cpu = cpu_seconds(pid) - cpu_before
    elapsed = time.monotonic() - started
    return {
        "idle_s": round(elapsed, 1),
        "idle_cpu_s": round(cpu, 3),
        "idle_core_share": round(cpu / elapsed, 4),
        "idle_cpu_ms_per_connection_minute": round(cpu * 1000 / connections / (elapsed / 60), 4),
    }


async def idle_runners(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    async with async_client(srv.url, connections=50, timeout=60.0) as client:
        started = time.monotonic()
        credentials = await gather_limited(
            [register_runner(client, f"idle-{n}") for n in range(args.runners)], 50
        )
        register_s = time.monotonic() - started
    rss_before = rss_bytes(srv.process.popen.pid)
    runners = [StubRunner(srv.url, runner_id, token) for runner_id, token in credentials]
    started = time.monotonic()
    try:
        await gather_limited(
            [runner.start(deadline_s=120.0) for runner in runners], CONNECT_AT_ONCE
        )
        connect_s = time.monotonic() - started
        rss_connected = rss_bytes(srv.process.popen.pid)
        idle = await idle_cost(srv.process.popen.pid, len(runners), args.idle_s)
        open_at_end = sum(1 for runner in runners if runner.closed is None)
        pings = sum(runner.pings for runner in runners)
    finally:
        await gather_limited([runner.close() for runner in runners], CONNECT_AT_ONCE)
    return {
        "runners": len(runners),
        "register_s": round(register_s, 1),
        "connect_s": round(connect_s, 1),
        "rss_before_mib": mib(rss_before),
        "rss_connected_mib": mib(rss_connected),
        "kib_per_runner": round((rss_connected - rss_before) / 1024 / len(runners), 1),
        "open_at_end": open_at_end,
        "pings_answered": pings,
        **idle,
    }


async def idle_streams(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    bundle = agent_bundle(os_env=False)
    async with async_client(srv.url, connections=50, timeout=60.0) as client:
        sessions = await gather_limited(
            [create_session(client, bundle, f"scale {n}") for n in range(args.sessions)], 20
        )
    rss_before = rss_bytes(srv.process.popen.pid)
    limits = httpx.Limits(max_connections=args.streams + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=srv.url,
        headers={"X-Forwarded-Email": "bench@example.com"},
        limits=limits,
        timeout=60.0,
    ) as readers:
        subscribers: list[SSESubscriber] = []
        started = time.monotonic()
        try:
            for n in range(args.streams):
                subscribers.append(
                    SSESubscriber(readers, sessions[n % len(sessions)], lambda *_: None)
                )
                if len(subscribers) % CONNECT_AT_ONCE == 0:
                    await asyncio.wait_for(
                        asyncio.gather(
                            *(s.connected.wait() for s in subscribers[-CONNECT_AT_ONCE:])
                        ),
                        120.0,
                    )
            await asyncio.wait_for(
                asyncio.gather(*(s.connected.wait() for s in subscribers)), 120.0
            )
            connect_s = time.monotonic() - started
            failed = [s.error for s in subscribers if s.error is not None]
            if failed:
                raise RuntimeError(f"{len(failed)} streams failed, first: {failed[0]!r}")
            rss_connected = rss_bytes(srv.process.popen.pid)
            idle = await idle_cost(srv.process.popen.pid, len(subscribers), args.idle_s)
            open_at_end = sum(1 for s in subscribers if not s.task.done())
        finally:
            await asyncio.gather(*(s.close() for s in subscribers))
    return {
        "streams": len(subscribers),
        "sessions": len(sessions),
        "connect_s": round(connect_s, 1),
        "rss_before_mib": mib(rss_before),
        "rss_connected_mib": mib(rss_connected),
        "kib_per_stream": round((rss_connected - rss_before) / 1024 / len(subscribers), 1),
        "open_at_end": open_at_end,
        **idle,
    }


def run_part(
    args: argparse.Namespace,
    *,
    count: int,
    noun: str,
    what: str,
    measure: Callable[[Server, argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
) -> dict[str, Any]:
    """One part on its own fresh server process: its heading, its numbers (``measure``'s,
    with ``kib_per_<noun>``) and a line that sums them up."""
    with contextlib.ExitStack() as stack:
        srv = server(stack, args, f"daphne-{noun}s")
        print(f"== {count} {what} on one daphne (SQLite)", flush=True)
        part = asyncio.run(measure(srv, args))
    print(
        f"   connected in {part['connect_s']} s; RSS {part['rss_before_mib']} → "
        f"{part['rss_connected_mib']} MiB ({part[f'kib_per_{noun}']} KiB each); "
        f"idle CPU {part['idle_core_share'] * 100:.1f} % of a core "
        f"({part['idle_cpu_ms_per_connection_minute']} ms per {noun}-minute); "
        f"{part['open_at_end']} open at the end",
        flush=True,
    )
    return part


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runners", type=int, default=10_000, help="idle runner tunnels")
    parser.add_argument("--streams", type=int, default=2_000, help="open session streams")
    parser.add_argument("--sessions", type=int, default=200, help="sessions the streams follow")
    parser.add_argument("--idle-s", type=float, default=45.0, help="measured idle window")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    sigterm_as_interrupt()
    files = open_files_limit(max(args.runners, args.streams) * 2 + 1024)
    result: dict[str, Any] = {"bench": "scale", **env_summary(), "open_files_limit": files}
    if args.runners:
        result["idle_runners"] = run_part(
            args, count=args.runners, noun="runner", what="idle runners", measure=idle_runners
        )
    if args.streams:
        result["idle_streams"] = run_part(
            args, count=args.streams, noun="stream", what="open streams", measure=idle_streams
        )
    final_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
