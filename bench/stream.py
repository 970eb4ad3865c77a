"""Benchmark: fan-out of one session's stream to many SSE subscribers on one daphne process.

A stub runner (in this process) holds one session with an open turn and sends M
``response.output_text.delta`` events, each carrying its send time; S subscribers (also in
this process, on one httpx.AsyncClient) read ``/v1/sessions/{id}/stream`` and record when
each delta arrives. Delay = receive time - send time, both ``time.perf_counter()`` of
this process. Reports p50/p95/max over every (subscriber, event) pair, how many
subscribers got all M events, the runner-side store-and-ack time, and daphne's RSS
before the subscribers, with them connected, and after the burst.

Note: the subscribers and the stub share this process (and the machine's cores with
daphne), so at high S the reader side's own CPU time is part of the measured delay.

Run: ``.venv/bin/python -m bench.stream [--subscribers 200] [--events 200] [--interval-ms 10]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

import httpx

from bench._common import (
    USER,
    Server,
    SSESubscriber,
    StubRunner,
    agent_bundle,
    async_client,
    bind,
    create_session,
    env_summary,
    final_json,
    fmt,
    log_dir,
    mib,
    post_message,
    register_runner,
    rss_bytes,
    run_main,
    sigterm_as_interrupt,
    single_server,
    summary_ms,
    wait_online,
    within,
)


class Reader:
    """One subscriber's record: the delay of every delta it received."""

    def __init__(self, expected: int, all_done: asyncio.Event, counter: list[int]) -> None:
        self.delays: list[float] = []
        self.expected = expected
        self.all_done = all_done
        self.counter = counter  # [subscribers that have every event, total subscribers]

    def on_event(self, event_type: str, data: str, t_recv: float) -> None:
        if event_type != "response.output_text.delta":
            return
        self.delays.append(t_recv - float(json.loads(data)["delta"]))
        if len(self.delays) == self.expected:
            self.counter[0] += 1
            if self.counter[0] == self.counter[1]:
                self.all_done.set()


async def run(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    pid = server.process.popen.pid
    sent: dict[int, float] = {}
    acked: dict[int, float] = {}

    def on_ack(session_id: str, seq: int, t_recv: float) -> None:
        acked.setdefault(seq, t_recv)

    subscribers: list[SSESubscriber] = []
    stub: StubRunner | None = None
    limits = httpx.Limits(
        max_connections=args.subscribers + 10, max_keepalive_connections=args.subscribers + 10
    )
    async with (
        async_client(server.url) as client,
        httpx.AsyncClient(
            base_url=server.url, headers={"X-Forwarded-Email": USER}, limits=limits, timeout=60
        ) as streams,
    ):
        try:
            runner_id, token = await register_runner(client, "bench-stream")
            stub = StubRunner(server.url, runner_id, token, on_ack=on_ack)
            await stub.start()
            await wait_online(client, runner_id)
            session_id = await create_session(client, agent_bundle(os_env=False), "bench-stream")
            opened = stub.expect_command("session.open")
            await bind(client, session_id, runner_id)
            await within(opened, 30, "session.open on the stub")
            started = stub.expect_command("turn.start")
            response_id = (await post_message(client, session_id, "stream benchmark"))[
                "response_id"
            ]
            await within(started, 30, "turn.start on the stub")
            await asyncio.sleep(1.0)
            rss_before = rss_bytes(pid)

            all_done = asyncio.Event()
            counter = [0, args.subscribers]
            readers = [Reader(args.events, all_done, counter) for _ in range(args.subscribers)]
            t0 = time.perf_counter()
            for reader in readers:
                subscribers.append(SSESubscriber(streams, session_id, reader.on_event))
            await within(
                asyncio.gather(*(s.connected.wait() for s in subscribers)),
                args.connect_deadline,
                f"{args.subscribers} subscribers to get their heartbeat",
            )
            connect_s = time.perf_counter() - t0
            failed = [s for s in subscribers if s.error is not None]
            if failed:
                raise RuntimeError(f"{len(failed)} subscribers failed, e.g. {failed[0].error!r}")
            await asyncio.sleep(1.0)
            rss_subscribed = rss_bytes(pid)

            interval = args.interval_ms / 1000
            burst_start = time.perf_counter()
            for seq in range(1, args.events + 1):
                target = burst_start + (seq - 1) * interval
                pause = target - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(pause)
                t_send = time.perf_counter()
                sent[seq] = t_send
                await stub.send_event(
                    session_id,
                    seq,
                    {
                        "type": "response.output_text.delta",
                        "response_id": response_id,
                        "item_id": "item_bench",
                        "delta": repr(t_send),
                    },
                )
            send_s = time.perf_counter() - burst_start
            drained = True
            try:
                await within(
                    all_done.wait(), args.drain_deadline, "every subscriber to get every event"
                )
            except TimeoutError:
                drained = False
            drain_s = time.perf_counter() - burst_start
            await stub.wait_acked(session_id, args.events, 30)
            await asyncio.sleep(1.0)
            rss_after = rss_bytes(pid)
        finally:
            await asyncio.gather(*(s.close() for s in subscribers), return_exceptions=True)
            if stub is not None:
                await stub.close()

    delays = [d for r in readers for d in r.delays]
    complete = sum(1 for r in readers if len(r.delays) == args.events)
    ack_delays = [acked[seq] - sent[seq] for seq in sent if seq in acked]
    stored_s = max(acked.values()) - sent[1] if acked else None
    return {
        "subscribers": args.subscribers,
        "events": args.events,
        "interval_ms": args.interval_ms,
        "subscribers_connect_s": round(connect_s, 3),
        "send_s": round(send_s, 3),
        "drained": drained,
        "all_received_s": round(drain_s, 3),
        "subscribers_with_all_events": complete,
        "deliveries": len(delays),
        "deliveries_expected": args.events * args.subscribers,
        "delay": summary_ms(delays),
        "runner_event_ack": summary_ms(ack_delays),
        # How fast the server took the runner's events in (stored, acked, published).
        "server_events_per_s": round(args.events / stored_s, 1) if stored_s else None,
        "rss_before_subscribers_mib": mib(rss_before),
        "rss_with_subscribers_mib": mib(rss_subscribed),
        "rss_after_burst_mib": mib(rss_after),
        "kib_per_subscriber": round((rss_subscribed - rss_before) / 1024 / args.subscribers, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=200, help="SSE subscribers (S)")
    parser.add_argument("--events", type=int, default=200, help="events the runner sends (M)")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="pause between events")
    parser.add_argument("--connect-deadline", type=float, default=60.0)
    parser.add_argument(
        "--drain-deadline", type=float, default=120.0, help="seconds after the last send"
    )
    parser.add_argument(
        "--django-debug", action="store_true", help="run the server with DJANGO_DEBUG=1"
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the temp folder with the logs"
    )
    args = parser.parse_args()
    sigterm_as_interrupt()

    result: dict[str, Any] = {"bench": "stream", **env_summary(), "django_debug": args.django_debug}
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        server = single_server(stack, tmp, debug=args.django_debug, name="daphne")
        print(
            f"== {args.subscribers} subscribers, {args.events} deltas every {args.interval_ms:g} ms, "
            "one daphne (SQLite, in-memory layer)",
            flush=True,
        )
        stats = asyncio.run(run(server, args))
        result.update(stats)
    print(f"   runner event → subscriber: {fmt(stats['delay'])}")
    print(
        f"   {stats['subscribers_with_all_events']}/{stats['subscribers']} subscribers got all "
        f"{stats['events']} events ({stats['deliveries']}/{stats['deliveries_expected']} deliveries); "
        f"sent in {stats['send_s']:.2f} s, all received {stats['all_received_s']:.2f} s after the first send"
    )
    print(
        f"   runner event → event.ack (stored): {fmt(stats['runner_event_ack'])}; "
        f"server took events in at {stats['server_events_per_s']} events/s "
        f"(offered {1000 / args.interval_ms:g}/s)"
    )
    print(
        f"   daphne RSS: {stats['rss_before_subscribers_mib']} MiB before subscribers, "
        f"{stats['rss_with_subscribers_mib']} MiB with them ({stats['kib_per_subscriber']} KiB each), "
        f"{stats['rss_after_burst_mib']} MiB after the burst",
        flush=True,
    )
    final_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
