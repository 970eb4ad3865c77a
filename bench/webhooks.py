"""Benchmark: webhook delivery (automation.md): latency, and a receiver that goes away.

1. ``--events`` (1,000) ``webhook.test`` events, posted by ``--posters`` concurrent
   clients through ``POST /v1/webhooks/{id}/test``, to a receiver on loopback: the
   delay from sending the ``POST`` that writes the event (the fact) to the receiver
   having its body, p50/p95 (the target is p50 < 1 s).
2. The receiver down (its port closed: connections refused) for ``--down-s`` (60)
   seconds while ``--down-events`` (100) events are written, then up again: every event
   must arrive; duplicates (the same ``webhook-id`` twice) are counted. The retries
   follow the server's schedule (5 s, 30 s, 2 min, …), so with the defaults the last
   events arrive at the 2-minute retry; ``--retry-s 1,2,5`` shortens it for a quick run.

One daphne process on SQLite (``--postgres``: PostgreSQL and Redis) with the receiver
allowed (``OMNIGENT_WEBHOOK_ALLOW_HTTP``/``_PRIVATE``); with ``--worker`` the deliveries
are sent by a ``manage.py deliverwebhooks`` process (``OMNIGENT_WEBHOOK_DELIVERY=worker``:
woken through Redis, or on SQLite at its poll, ``OMNIGENT_WEBHOOK_POLL_S``). Every signature is verified with the
``standardwebhooks`` library.

Run: ``.venv/bin/python -m bench.webhooks [--events 1000] [--down-s 60] [--quick]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections import Counter
from typing import Any

import httpx
from standardwebhooks.webhooks import Webhook as Verifier

from bench._common import (
    USER,
    final_json,
    log_dir,
    migrate,
    run_main,
    scale_out_env,
    sigterm_as_interrupt,
    sqlite_env,
    start_daphne,
)
from bench._stats import fmt, summary_ms
from testing.processes import Server, spawn, wait_until
from testing.webhook_receiver import WebhookReceiver

RECEIVER_ENV = {"OMNIGENT_WEBHOOK_ALLOW_HTTP": "1", "OMNIGENT_WEBHOOK_ALLOW_PRIVATE": "1"}


async def post_events(
    server: Server, webhook_id: str, count: int, posters: int
) -> dict[str, float]:
    """Write ``count`` events; returns each event id with the time its POST was sent."""
    sent: dict[str, float] = {}
    remaining = iter(range(count))
    async with httpx.AsyncClient(
        base_url=server.url, headers={"X-Forwarded-Email": USER}, timeout=30.0
    ) as client:

        async def poster() -> None:
            for _ in remaining:
                started = time.time()
                response = await client.post(f"/v1/webhooks/{webhook_id}/test")
                response.raise_for_status()
                sent[response.json()["event_id"]] = started

        await asyncio.gather(*(poster() for _ in range(posters)))
    return sent


def arrivals(receiver: WebhookReceiver, secret: str, since: int = 0) -> list[tuple[str, float]]:
    """(event id, arrival time) of each request after the first ``since``, verified."""
    verifier = Verifier(secret)
    out = []
    for got in receiver.requests[since:]:
        body = verifier.verify(got.body, got.headers)
        out.append((str(body["id"]), got.at))
    return out


def latency_phase(
    server: Server, receiver: WebhookReceiver, hook: dict[str, Any], *, events: int, posters: int
) -> dict[str, Any]:
    started = time.monotonic()
    sent = asyncio.run(post_events(server, hook["id"], events, posters))
    posted_s = time.monotonic() - started
    receiver.wait_for(events, timeout=120 + events / 10)
    got = arrivals(receiver, hook["secret"])
    first_arrival: dict[str, float] = {}
    for event_id, at in got:
        first_arrival.setdefault(event_id, at)
    delays = [first_arrival[event_id] - at for event_id, at in sent.items()]
    duplicates = sum(count - 1 for count in Counter(event for event, _ in got).values())
    return {
        "events": events,
        "posted_per_s": round(events / posted_s, 1),
        "latency": summary_ms(delays),
        "missing": len(set(sent) - set(first_arrival)),
        "duplicates": duplicates,
    }


def outage_phase(
    server: Server,
    receiver: WebhookReceiver,
    hook: dict[str, Any],
    *,
    events: int,
    down_s: float,
    deadline_s: float,
) -> dict[str, Any]:
    before = len(receiver.requests)
    receiver.down()
    down_at = time.monotonic()
    sent = asyncio.run(post_events(server, hook["id"], events, 4))
    time.sleep(max(0.0, down_s - (time.monotonic() - down_at)))
    receiver.up()
    up_at = time.monotonic()

    def all_arrived() -> bool:
        return set(sent) <= {event for event, _ in arrivals(receiver, hook["secret"], before)}

    wait_until(all_arrived, deadline_s=deadline_s, what="every event after the outage")
    done_s = time.monotonic() - up_at
    got = arrivals(receiver, hook["secret"], before)
    counts = Counter(event for event, _ in got)
    with server.client(USER) as client:
        rows = client.get(f"/v1/webhooks/{hook['id']}/deliveries?limit=1000").json()["data"]
    attempts = [row["attempts"] for row in rows if row["event_id"] in sent]
    return {
        "events": events,
        "down_s": down_s,
        "all_delivered_s_after_up": round(done_s, 2),
        "delivered": len(set(counts) & set(sent)),
        "duplicates": sum(count - 1 for count in counts.values()),
        "attempts_max": max(attempts) if attempts else 0,
        "attempts_total": sum(attempts),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--posters", type=int, default=4)
    parser.add_argument("--down-s", type=float, default=60.0)
    parser.add_argument("--down-events", type=int, default=100)
    parser.add_argument("--retry-s", default="", help="the server's retry delays, e.g. 1,2,5")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    parser.add_argument(
        "--worker", action="store_true", help="deliveries sent by a deliverwebhooks process"
    )
    parser.add_argument("--poll-s", default="", help="OMNIGENT_WEBHOOK_POLL_S, e.g. 0.2")
    parser.add_argument("--quick", action="store_true", help="200 events, 5 s down, 1,2,5 s")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    parser.add_argument("--debug", action="store_true", help="DJANGO_DEBUG=1")
    args = parser.parse_args()
    if args.quick:
        args.events, args.down_s, args.down_events = 200, 5.0, 50
        args.retry_s = args.retry_s or "1,2,5"
    sigterm_as_interrupt()
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep)
        extra = dict(RECEIVER_ENV)
        if args.retry_s:
            extra["OMNIGENT_WEBHOOK_RETRY_S"] = args.retry_s
        if args.poll_s:
            extra["OMNIGENT_WEBHOOK_POLL_S"] = args.poll_s
        if args.postgres:
            env = {**scale_out_env(stack, tmp, debug=args.debug), **extra}
        else:
            env = {**sqlite_env(tmp, debug=args.debug), **extra}
            migrate(env, tmp)
        if args.worker:
            env["OMNIGENT_WEBHOOK_DELIVERY"] = "worker"
            worker = spawn(
                "webhook-worker",
                [sys.executable, "manage.py", "deliverwebhooks"],
                env=env,
                log_dir=tmp,
            )
            stack.callback(worker.stop)
        server = start_daphne(stack, env=env, tmp=tmp, name="daphne")
        receiver = stack.enter_context(WebhookReceiver())
        with server.client(USER) as client:
            response = client.post(
                "/v1/webhooks", json={"url": receiver.url, "events": ["webhook.test"]}
            )
            response.raise_for_status()
            hook = response.json()
        latency = latency_phase(server, receiver, hook, events=args.events, posters=args.posters)
        print(
            f"{latency['events']} events, posted at {latency['posted_per_s']}/s; "
            f"fact -> receiver: {fmt(latency['latency'])}; "
            f"missing {latency['missing']}, duplicates {latency['duplicates']}",
            flush=True,
        )
        delays = [float(d) for d in (args.retry_s or "5,30,120,600").split(",")]
        deadline = args.down_s + sum(delays[:4]) + 60
        outage = outage_phase(
            server,
            receiver,
            hook,
            events=args.down_events,
            down_s=args.down_s,
            deadline_s=deadline,
        )
        print(
            f"receiver down {outage['down_s']:g} s with {outage['events']} events: "
            f"{outage['delivered']} delivered, all {outage['all_delivered_s_after_up']} s "
            f"after it came back; duplicates {outage['duplicates']}, "
            f"attempts {outage['attempts_total']} (at most {outage['attempts_max']} each)",
            flush=True,
        )
        final_json(
            {
                "database": "postgresql" if args.postgres else "sqlite",
                "delivered_by": "worker" if args.worker else "server",
                "latency_phase": latency,
                "outage_phase": outage,
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
