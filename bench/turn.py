"""Benchmark: end-to-end turns through a real runner program and the mock LLM.

Every turn is two LLM calls: a ``sys_os_write`` function call (run by the runner's
built-in tool), then a final text. Each turn's message carries a unique token and the
mock is scripted for that token, so concurrent sessions never take each other's replies.

1. Latency: one session, turns one after another; from ``POST .../events`` (message)
   to the session stream delivering ``response.completed`` for that turn (the stream is
   read continuously, so the number is not bound by any polling interval).
2. Throughput: S sessions (default 20) bound to the same single runner process; each
   round posts one message to every session at once and waits for all of them to
   complete; turns/s = measured turns / wall time of the measured rounds.

With ``--scale-out`` the same runs on two daphne processes on PostgreSQL + Redis: the
runner's tunnel on A, session i's messages posted through process i mod 2 and its
stream read from the other one, so every turn crosses the channel layer both ways.

Run: ``.venv/bin/python -m bench.turn [--turns 50] [--sessions 20] [--rounds 5]
[--scale-out]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import time
from typing import Any

from bench._common import (
    USER,
    Server,
    SSESubscriber,
    agent_bundle,
    async_client,
    bench_runner_env,
    bind,
    create_session,
    env_summary,
    final_json,
    fmt,
    gather_limited,
    log_dir,
    post_message,
    run_main,
    sigterm_as_interrupt,
    single_server,
    summary_ms,
    two_servers,
    wait_runner_online,
    within,
)
from testing.mockllm import MockLLMServer
from testing.processes import register_runner, spawn

TURN_END = ("response.completed", "response.failed", "response.cancelled")


class TurnTracker:
    """Receives stream events of every session; resolves a future per finished turn."""

    def __init__(self) -> None:
        self.finished: dict[str, tuple[float, dict[str, Any]]] = {}
        self.waiters: dict[str, asyncio.Future[tuple[float, dict[str, Any]]]] = {}

    def on_event(self, event_type: str, data: str, t_recv: float) -> None:
        if event_type not in TURN_END:
            return
        response = json.loads(data)["response"]
        self.finished[response["id"]] = (t_recv, response)
        future = self.waiters.pop(response["id"], None)
        if future is not None and not future.done():
            future.set_result((t_recv, response))

    async def wait(self, response_id: str, deadline_s: float) -> tuple[float, dict[str, Any]]:
        if response_id in self.finished:
            return self.finished[response_id]
        future = asyncio.get_running_loop().create_future()
        self.waiters[response_id] = future
        return await within(future, deadline_s, f"turn {response_id} to end")


def script_turn(mock: MockLLMServer) -> str:
    """Script the mock for one turn (tool call, then text) and return its match token."""
    token = f"bt{secrets.token_hex(8)}"
    mock.configure(
        [
            {
                "tool_calls": [
                    {
                        "call_id": f"call_{token}",
                        "name": "sys_os_write",
                        "arguments": {"path": f"out/{token}.txt", "content": f"turn {token}\n"},
                    }
                ]
            },
            {"text": f"Wrote out/{token}.txt."},
        ],
        match=token,
    )
    return token


async def one_turn(
    client: Any, tracker: TurnTracker, mock: MockLLMServer, session_id: str, deadline_s: float
) -> tuple[float, float]:
    """Post one message; return (seconds to 202, seconds to response.completed)."""
    token = script_turn(mock)
    t0 = time.perf_counter()
    accepted = await post_message(client, session_id, f"Please write the file for {token}.")
    t_accepted = time.perf_counter()
    t_end, response = await tracker.wait(accepted["response_id"], deadline_s)
    if response["status"] != "completed":
        raise RuntimeError(
            f"turn {accepted['response_id']} ended {response['status']}: {response.get('error')}"
        )
    return t_accepted - t0, t_end - t0


async def subscribe(
    client: Any, session_ids: list[str], tracker: TurnTracker
) -> list[SSESubscriber]:
    subscribers = [SSESubscriber(client, sid, tracker.on_event) for sid in session_ids]
    await within(
        asyncio.gather(*(s.connected.wait() for s in subscribers)),
        30,
        "the session streams to open",
    )
    for s in subscribers:
        if s.error is not None:
            raise RuntimeError(f"stream of {s.session_id} failed: {s.error!r}")
    return subscribers


async def run(
    servers: tuple[Server, Server], runner_id: str, mock: MockLLMServer, args: argparse.Namespace
) -> dict[str, Any]:
    """``servers``: the process holding the tunnel, then the other one (the same one
    twice in the single-process mode). Session i posts through ``servers[i % 2]`` and
    streams from the other; the latency session posts through ``servers[1]``."""
    tracker = TurnTracker()
    bundle = agent_bundle(os_env=True)
    result: dict[str, Any] = {}
    subscribers: list[SSESubscriber] = []
    async with contextlib.AsyncExitStack() as clients:
        posting = [
            await clients.enter_async_context(
                async_client(server.url, connections=args.sessions + 5, timeout=60)
            )
            for server in servers
        ]
        reading = [
            await clients.enter_async_context(
                async_client(server.url, connections=args.sessions + 5, timeout=60)
            )
            for server in servers
        ]
        client = posting[1]
        try:
            # --- 1. sequential latency on one session
            session_id = await create_session(client, bundle, "bench-latency")
            await bind(client, session_id, runner_id)
            subscribers += await subscribe(reading[0], [session_id], tracker)
            accept, total = [], []
            for i in range(args.warmup + args.turns):
                to_202, to_done = await one_turn(
                    client, tracker, mock, session_id, args.turn_deadline
                )
                if i >= args.warmup:
                    accept.append(to_202)
                    total.append(to_done)
            result["latency"] = {"turn": summary_ms(total), "post_to_202": summary_ms(accept)}
            print(
                f"   turn (POST → response.completed): {fmt(result['latency']['turn'])}", flush=True
            )
            print(
                f"   of which POST → 202:              {fmt(result['latency']['post_to_202'])}",
                flush=True,
            )

            # --- 2. throughput: S sessions on the one runner, one message each per round
            print(
                f"== throughput: {args.sessions} sessions on one runner, {args.rounds} rounds",
                flush=True,
            )
            sessions = await gather_limited(
                [create_session(client, bundle, f"bench-{i}") for i in range(args.sessions)], 5
            )
            for sid in sessions:
                await bind(client, sid, runner_id)
            for parity in (0, 1):
                subscribers += await subscribe(reading[1 - parity], sessions[parity::2], tracker)
            concurrent: list[float] = []
            started = time.perf_counter()
            for r in range(args.warmup_rounds + args.rounds):
                if r == args.warmup_rounds:
                    started = time.perf_counter()
                outcomes = await asyncio.gather(
                    *(
                        one_turn(posting[i % 2], tracker, mock, sid, args.turn_deadline)
                        for i, sid in enumerate(sessions)
                    )
                )
                if r >= args.warmup_rounds:
                    concurrent.extend(done for _to_202, done in outcomes)
            wall = time.perf_counter() - started
            turns = len(concurrent)
            result["throughput"] = {
                "sessions": args.sessions,
                "rounds": args.rounds,
                "turns": turns,
                "wall_s": round(wall, 3),
                "turns_per_s": round(turns / wall, 2),
                "turn_latency_under_load": summary_ms(concurrent),
            }
            print(
                f"   {turns} turns in {wall:.2f} s → {turns / wall:.2f} turns/s; "
                f"per-turn latency under load: {fmt(result['throughput']['turn_latency_under_load'])}",
                flush=True,
            )
            llm_calls = sum(
                1 for r in mock.requests if r["path"] in ("/v1/responses", "/v1/chat/completions")
            )
            result["llm_requests"] = llm_calls
        finally:
            await asyncio.gather(*(s.close() for s in subscribers), return_exceptions=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50, help="measured sequential turns")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured sequential turns first")
    parser.add_argument(
        "--sessions", type=int, default=20, help="concurrent sessions on the runner"
    )
    parser.add_argument("--rounds", type=int, default=5, help="measured concurrent rounds")
    parser.add_argument(
        "--warmup-rounds", type=int, default=1, help="unmeasured concurrent rounds first"
    )
    parser.add_argument(
        "--turn-deadline", type=float, default=60.0, help="seconds one turn may take"
    )
    parser.add_argument(
        "--scale-out",
        action="store_true",
        help="two daphne processes on PostgreSQL + Redis (runner on A, clients on both)",
    )
    parser.add_argument(
        "--django-debug", action="store_true", help="run the server with DJANGO_DEBUG=1"
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the temp folder with the logs"
    )
    args = parser.parse_args()
    sigterm_as_interrupt()

    result: dict[str, Any] = {
        "bench": "turn",
        **env_summary(),
        "django_debug": args.django_debug,
        "mode": "scale-out (PostgreSQL + Redis, two processes)" if args.scale_out else "single",
    }
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        mock = MockLLMServer()
        mock.start()
        stack.callback(mock.stop)
        if args.scale_out:
            servers = two_servers(stack, tmp, debug=args.django_debug)
        else:
            single = single_server(stack, tmp, debug=args.django_debug, name="daphne")
            servers = (single, single)
        server = servers[0]
        runner_id, token = register_runner(server, user=USER, name="bench-runner")
        workspace = tmp / "workspace"
        workspace.mkdir()
        # Every session's turn starts at once, as the workload was measured before the
        # runner declared a capacity (bench.fairness measures the queue).
        env = bench_runner_env(
            server_url=server.url,
            token=token,
            workspace=workspace,
            llm_url=mock.base_url,
            max_turns=max(args.sessions, 8),
        )
        runner = spawn("runner", [sys.executable, "-m", "omnigent_runner"], env=env, log_dir=tmp)
        stack.callback(runner.stop)
        wait_runner_online(server, runner_id, process=runner)
        print(
            f"== latency: {args.turns} sequential turns on one session (1 tool call + text each)",
            flush=True,
        )
        result.update(asyncio.run(run(servers, runner_id, mock, args)))
        written = len(list((workspace / "out").glob("*.txt")))
        result["files_written"] = written
        expected = args.warmup + args.turns + (args.warmup_rounds + args.rounds) * args.sessions
        print(
            f"   files written by sys_os_write: {written} (expected {expected}); "
            f"LLM requests: {result['llm_requests']} (expected {2 * expected})",
            flush=True,
        )
    final_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
