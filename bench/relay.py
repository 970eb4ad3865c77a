"""Benchmark: the server's relay path for ``function_call_output``, and idle-runner memory.

1. Latency of ``POST /v1/sessions/{id}/events`` ``function_call_output`` → the runner
   receives ``tool_result`` → acks → HTTP 202, sequential requests on one keep-alive
   connection, against a stub runner (no agent) in this process:
   (a) one daphne process, SQLite, in-memory channel layer;
   (b) two daphne processes on PostgreSQL + Redis: the runner on A, HTTP on B.
2. Idle runners per 100 MiB of daphne RSS: K stub runners complete the handshake and
   idle (answering pings) on a fresh single daphne process.

Run: ``.venv/bin/python -m bench.relay [-n 500] [--warmup 50] [--runners 300]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from typing import Any

from bench._common import (
    MIB,
    Server,
    StubRunner,
    agent_bundle,
    async_client,
    bind,
    cpu_seconds,
    create_session,
    env_summary,
    final_json,
    fmt,
    gather_limited,
    log_dir,
    mib,
    register_runner,
    rss_bytes,
    run_main,
    sigterm_as_interrupt,
    single_server,
    summary_ms,
    two_servers,
    wait_online,
    within,
)


async def relay_latency(
    runner_server: Server, http_server: Server, *, n: int, warmup: int
) -> dict[str, Any]:
    """Sequential function_call_output posts to ``http_server``; the stub sits on ``runner_server``."""
    received: list[str] = []

    def on_command(frame: dict[str, Any], t_recv: float) -> None:
        if frame.get("type") == "tool_result":
            received.append(frame["call_id"])

    async with async_client(http_server.url, connections=1) as client:
        runner_id, token = await register_runner(client, "bench-relay")
        stub = StubRunner(runner_server.url, runner_id, token, on_command=on_command)
        try:
            await stub.start()
            await wait_online(client, runner_id)
            session_id = await create_session(client, agent_bundle(os_env=False))
            opened = stub.expect_command("session.open")
            await bind(client, session_id, runner_id)
            await within(opened, 30, "session.open on the stub runner")

            path = f"/v1/sessions/{session_id}/events"
            samples: list[float] = []
            started = time.perf_counter()
            servers = {runner_server.process.popen.pid, http_server.process.popen.pid}
            cpu_before = 0.0
            for i in range(warmup + n):
                body = {
                    "type": "function_call_output",
                    "data": {"call_id": f"call_bench_{i}", "output": f"result {i}"},
                }
                t0 = time.perf_counter()
                response = await client.post(path, json=body)
                elapsed = time.perf_counter() - t0
                if response.status_code != 202:
                    raise RuntimeError(
                        f"request {i}: HTTP {response.status_code} {response.text[:300]}"
                    )
                if response.json() != {"queued": True, "item_id": f"call_bench_{i}"}:
                    raise RuntimeError(f"request {i}: unexpected body {response.text[:300]}")
                if i == warmup - 1:
                    started = time.perf_counter()
                    cpu_before = sum(cpu_seconds(pid) for pid in servers)
                if i >= warmup:
                    samples.append(elapsed)
            wall = time.perf_counter() - started
            server_cpu = sum(cpu_seconds(pid) for pid in servers) - cpu_before
            if received != [f"call_bench_{i}" for i in range(warmup + n)]:
                raise RuntimeError(
                    f"the stub received {len(received)} tool_result frames, expected {warmup + n}"
                )
        finally:
            await stub.close()
    stats = summary_ms(samples)
    stats["requests_per_s"] = round(n / wall, 1) if wall > 0 else None
    # CPU the server process(es) spent per request: steadier than wall time on a
    # shared machine, and what more throughput per core would have to cut.
    stats["server_cpu_ms_per_request"] = round(server_cpu / n * 1000, 2)
    return stats


async def idle_runners(
    server: Server, *, k: int, warm: int, hold_s: float, concurrency: int
) -> dict[str, Any]:
    """Connect ``warm`` then ``k`` idle stub runners; RSS of daphne before and after the ``k``."""
    pid = server.process.popen.pid
    stubs: list[StubRunner] = []
    async with async_client(server.url, connections=concurrency) as client:
        try:
            credentials = await gather_limited(
                [register_runner(client, f"idle-{i}") for i in range(warm + k)], concurrency
            )
            warm_stubs = [StubRunner(server.url, rid, tok) for rid, tok in credentials[:warm]]
            stubs.extend(warm_stubs)
            await gather_limited([s.start() for s in warm_stubs], concurrency)
            await asyncio.sleep(2.0)
            rss_before = rss_bytes(pid)

            measured = [StubRunner(server.url, rid, tok) for rid, tok in credentials[warm:]]
            stubs.extend(measured)
            t0 = time.perf_counter()
            await within(
                gather_limited([s.start() for s in measured], concurrency),
                max(60.0, k * 0.5),
                f"{k} stub runners to complete the handshake",
            )
            connect_s = time.perf_counter() - t0
            await asyncio.sleep(1.0)
            rss_connected = rss_bytes(pid)
            # Idle through at least one server heartbeat, so ping/pong is part of the state.
            await asyncio.sleep(hold_s)
            rss_after = rss_bytes(pid)
            alive = sum(1 for s in measured if s.closed is None)
            pings = sum(s.pings for s in measured)
        finally:
            await asyncio.gather(*(s.close() for s in stubs), return_exceptions=True)
    delta = rss_after - rss_before
    per_100 = round(k / (delta / (100 * MIB)), 1) if delta > 0 else None
    return {
        "runners": k,
        "warm_runners": warm,
        "still_connected": alive,
        "pings_answered": pings,
        "connect_wall_s": round(connect_s, 2),
        "hold_s": hold_s,
        "rss_before_mib": mib(rss_before),
        "rss_connected_mib": mib(rss_connected),
        "rss_after_mib": mib(rss_after),
        "rss_delta_mib": mib(delta),
        "kib_per_runner": round(delta / 1024 / k, 1),
        "runners_per_100mib": per_100,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-n", "--requests", type=int, default=500, help="measured requests per mode"
    )
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured requests first")
    parser.add_argument("--runners", type=int, default=300, help="idle stub runners (K)")
    parser.add_argument(
        "--warm-runners", type=int, default=10, help="runners connected before the RSS baseline"
    )
    parser.add_argument(
        "--hold-s", type=float, default=22.0, help="idle time before the final RSS reading"
    )
    parser.add_argument(
        "--concurrency", type=int, default=20, help="parallel handshakes/registrations"
    )
    parser.add_argument("--skip", choices=["single", "two", "idle"], action="append", default=[])
    parser.add_argument(
        "--django-debug", action="store_true", help="run the servers with DJANGO_DEBUG=1"
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the temp folder with the logs"
    )
    args = parser.parse_args()
    sigterm_as_interrupt()

    result: dict[str, Any] = {"bench": "relay", **env_summary(), "django_debug": args.django_debug}
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        if "single" not in args.skip:
            print("== (a) one daphne, SQLite, in-memory channel layer", flush=True)
            server = single_server(stack, tmp, debug=args.django_debug, name="daphne-single")
            stats = asyncio.run(relay_latency(server, server, n=args.requests, warmup=args.warmup))
            result["single"] = stats
            print(
                f"   function_call_output → tool_result → ack → 202: {fmt(stats)}  "
                f"({stats['requests_per_s']} req/s, "
                f"server CPU {stats['server_cpu_ms_per_request']} ms/request)",
                flush=True,
            )
            server.process.stop()
        if "two" not in args.skip:
            print("== (b) two daphnes, PostgreSQL + Redis; runner on A, HTTP on B", flush=True)
            first, second = two_servers(stack, tmp, debug=args.django_debug)
            stats = asyncio.run(relay_latency(first, second, n=args.requests, warmup=args.warmup))
            result["two_process"] = stats
            print(
                f"   function_call_output → tool_result → ack → 202: {fmt(stats)}  "
                f"({stats['requests_per_s']} req/s, "
                f"server CPU {stats['server_cpu_ms_per_request']} ms/request)",
                flush=True,
            )
            first.process.stop()
            second.process.stop()
        if "idle" not in args.skip:
            print(f"== idle runners: {args.runners} stubs on a fresh daphne (SQLite)", flush=True)
            server = single_server(stack, tmp, debug=args.django_debug, name="daphne-idle")
            idle = asyncio.run(
                idle_runners(
                    server,
                    k=args.runners,
                    warm=args.warm_runners,
                    hold_s=args.hold_s,
                    concurrency=args.concurrency,
                )
            )
            result["idle"] = idle
            print(
                f"   RSS {idle['rss_before_mib']} MiB → {idle['rss_connected_mib']} MiB (connected) → "
                f"{idle['rss_after_mib']} MiB (after {idle['hold_s']:g} s idle); "
                f"{idle['kib_per_runner']} KiB/runner → {idle['runners_per_100mib']} runners per 100 MiB "
                f"({idle['still_connected']}/{idle['runners']} still connected, "
                f"{idle['pings_answered']} pings answered)",
                flush=True,
            )
    final_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
