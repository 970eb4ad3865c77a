"""Benchmark: the two Redis channel layers on the server's two paths, across two processes.

With more than one daphne process the server needs a Redis channel layer, and the project
chooses between these two by the numbers below and by their delivery guarantees:

A. ``redis_list``: ``omnigent_site.runtime.channel_layer.ScaleOutChannelLayer`` (channels-redis'
   ``RedisChannelLayer``). A message waits in a Redis sorted set until the receiving
   process pops it, so one sent before the receiver listens, or while its connection is
   briefly down, is kept (up to ``expiry`` seconds and ``capacity`` messages). The price:
   several Redis round trips per send and per receive.
B. ``redis_pubsub``: channels-redis' ``RedisPubSubChannelLayer`` (PUBLISH/SUBSCRIBE). One
   round trip per send, but at most once: a message published while no connection of the
   receiving process is subscribed is gone, and subscriptions live in the process only.

Two OS processes, like two daphnes: this one (the "caller", the process that serves an
HTTP request) and a spawned "holder" (the process holding a runner's tunnel and stream
subscribers). They coordinate over a ``multiprocessing`` pipe; every wait has a deadline.

1. Relay round trip (the path of ``runners/relay.py``): the holder receives on one channel
   (the tunnel) and answers every message on its ``reply_channel``. The caller, one
   request at a time: ``new_channel()``, ``send`` to the tunnel, ``receive`` the reply
   (10 s deadline); each round trip timed from before ``new_channel()`` to the reply.
   N measured requests after a warm-up. Measured again while the holder also has S idle
   channels with a pending ``receive()`` (open stream subscribers waiting for events).
2. Group fan-out (the path of ``sessions/eventlog.py`` → ``sessions/stream.py``): G
   subscriber channels, half in each process, in one group; each loops on ``receive()``.
   The caller ``group_send``s E events 5 ms apart, each carrying its ``time.monotonic()``
   (CLOCK_MONOTONIC is system-wide on Linux, so it compares across the processes).
   Reported: per-delivery latency, the time from the first send to the last delivery of
   the last event, deliveries vs G*E, and each process's CPU time during the fan-out.
   Before the events, probe messages go to the group until every subscriber in both
   processes has received one, so a pub/sub subscription still on its way to Redis
   cannot count as a lost event.

Both layers use Redis db 12 with a random key prefix per run; the run's keys are deleted
at the end. Django is not configured: of the project only ``omnigent_site.runtime.channel_layer``
is imported, and the statistics come from ``bench/_stats.py``.

Run: ``.venv/bin/python -m bench.channel_layers [-n 500] [--events 200] [--subscribers 100]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import multiprocessing
import os
import secrets
import signal
import sys
import time
import traceback
from collections.abc import Iterable
from importlib import metadata
from multiprocessing.connection import Connection
from typing import Any, Protocol, cast

import redis
from channels_redis.pubsub import RedisPubSubChannelLayer
from redis import asyncio as aioredis

from bench._stats import fmt, summary_ms
from omnigent_site.runtime.channel_layer import ScaleOutChannelLayer
from testing.processes import drop_redis_keys

REDIS_URL = "redis://127.0.0.1:6379/12"
HOST: dict[str, Any] = {
    "address": REDIS_URL,
    "socket_timeout": 15,
    "socket_connect_timeout": 5,
    "socket_keepalive": True,
}
LAYERS = ("redis_list", "redis_pubsub")
GROUP = "session.bench"
REPLY_DEADLINE_S = 10.0  # one relay round trip
PIPE_DEADLINE_S = 30.0  # the other process to answer a step
PROBE_DEADLINE_S = 20.0  # every subscriber to have received a probe
GRACE_S = 10.0  # after the last event is due, how long subscribers may still wait for it
COMMAND_DEADLINE_S = 120.0  # the holder waiting for the next command
OVERALL_DEADLINE_S = 170  # the whole run (SIGALRM)


# --------------------------------------------------------------------------- layers


class Layer(Protocol):
    """What the benchmark calls on a channel layer (the pub/sub one proxies these)."""

    async def new_channel(self) -> str: ...

    async def send(self, channel: str, message: dict[str, Any]) -> None: ...

    async def receive(self, channel: str) -> dict[str, Any]: ...

    async def group_add(self, group: str, channel: str) -> None: ...

    async def group_send(self, group: str, message: dict[str, Any]) -> None: ...


def make_layer(kind: str, prefix: str) -> Layer:
    if kind == "redis_list":
        return cast(
            Layer,
            ScaleOutChannelLayer(hosts=[HOST], prefix=prefix, capacity=1000, expiry=60),
        )
    if kind == "redis_pubsub":
        return cast(Layer, RedisPubSubChannelLayer(hosts=[HOST], prefix=prefix))
    raise ValueError(f"unknown layer {kind!r}")


async def close_layer(kind: str, layer: Layer) -> None:
    """Close the layer's connections in this event loop, leaving Redis' keys alone (the
    other process may still use them; the keys go at the end of the run)."""
    if kind == "redis_list":
        await cast(ScaleOutChannelLayer, layer).close_pools()
    else:
        # The pub/sub layer's flush only forgets local channels and closes connections.
        await cast(Any, layer).flush()


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]]) -> list[BaseException]:
    """Cancel ``tasks``; return what any of them raised other than the cancellation."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    results = await asyncio.gather(*pending, return_exceptions=True)
    return [
        r
        for r in results
        if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)
    ]


async def redis_leftovers(prefix: str) -> dict[str, int]:
    """Keys and pub/sub channels of this run that exist in Redis right now."""
    client = aioredis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
        channels = await client.pubsub_channels(f"{prefix}*")
        return {"keys": len(keys), "pubsub_channels": len(channels)}
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- logs


class LogRecorder(logging.Handler):
    """Keeps what channels-redis logs (an over-capacity group_send is only an INFO line)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


def record_layer_logs() -> LogRecorder:
    recorder = LogRecorder()
    logger = logging.getLogger("channels_redis")
    logger.setLevel(logging.INFO)
    logger.addHandler(recorder)
    return recorder


def checked(message: dict[str, Any]) -> dict[str, Any]:
    if "error" in message:
        raise RuntimeError(f"the holder process failed:\n{message['error']}")
    return message


async def pipe_recv(conn: Connection, deadline_s: float, what: str) -> dict[str, Any]:
    """The next message from the other process, without blocking the event loop while
    waiting for it (an EOF, the other process gone, raises ``EOFError``)."""
    if not conn.poll(0):
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(conn.fileno(), wake)
        try:
            async with asyncio.timeout(max(deadline_s, 0.0)):
                await readable
        except TimeoutError:
            raise TimeoutError(f"timed out after {deadline_s:g} s waiting for {what}") from None
        finally:
            loop.remove_reader(conn.fileno())
    return checked(conn.recv())


# --------------------------------------------------------------------------- subscribers


class Subscriber:
    """One group member (an open stream): records when each event arrived."""

    def __init__(self, layer: Layer, channel: str, events: int) -> None:
        self.layer = layer
        self.channel = channel
        self.events = events
        self.arrivals: dict[int, float] = {}
        self.latencies: list[float] = []
        self.duplicates = 0
        self.out_of_order = 0
        self.highest = -1
        self.probed = asyncio.Event()
        self.done = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            message = await self.layer.receive(self.channel)
            arrived = time.monotonic()
            if message["type"] == "probe":
                self.probed.set()
                continue
            n = int(message["n"])
            if n in self.arrivals:
                self.duplicates += 1
                continue
            if n < self.highest:
                self.out_of_order += 1
            self.highest = max(self.highest, n)
            self.arrivals[n] = arrived
            self.latencies.append(arrived - float(message["t"]))
            if len(self.arrivals) == self.events:
                self.done.set()


async def start_subscribers(layer: Layer, count: int, events: int) -> list[Subscriber]:
    subscribers: list[Subscriber] = []
    for _ in range(count):
        channel = await layer.new_channel()
        await layer.group_add(GROUP, channel)
        subscriber = Subscriber(layer, channel, events)
        subscriber.task = asyncio.create_task(subscriber.run())
        subscribers.append(subscriber)
    return subscribers


async def stop_subscribers(subscribers: list[Subscriber]) -> None:
    errors = await stop_tasks(s.task for s in subscribers if s.task is not None)
    if errors:
        raise RuntimeError(f"{len(errors)} subscribers failed; the first: {errors[0]!r}")


async def wait_all(flags: list[asyncio.Event], deadline_s: float) -> bool:
    """True once every flag is set, False if the deadline passes first."""
    try:
        async with asyncio.timeout(max(deadline_s, 0.0)):
            for flag in flags:
                await flag.wait()
    except TimeoutError:
        return False
    return True


def local_report(subscribers: list[Subscriber], cpu_s: float, events: int) -> dict[str, Any]:
    """What one process saw of the fan-out (latencies raw, so percentiles can be merged)."""
    last_event = [s.arrivals[events - 1] for s in subscribers if events - 1 in s.arrivals]
    every = [t for s in subscribers for t in s.arrivals.values()]
    return {
        "latencies": [lat for s in subscribers for lat in s.latencies],
        "delivered": sum(len(s.arrivals) for s in subscribers),
        "duplicates": sum(s.duplicates for s in subscribers),
        "out_of_order": sum(s.out_of_order for s in subscribers),
        "complete_subscribers": sum(1 for s in subscribers if s.done.is_set()),
        "subscribers": len(subscribers),
        "last_event_last_arrival": max(last_event) if last_event else None,
        "last_arrival": max(every) if every else None,
        "cpu_s": cpu_s,
    }


# --------------------------------------------------------------------------- holder process


async def holder_relay(conn: Connection, command: dict[str, Any], logs: LogRecorder) -> None:
    """Answer every message on the tunnel until the caller says stop."""
    kind = command["layer"]
    warmup = int(command["warmup"])
    layer = make_layer(kind, command["prefix"])
    served = 0
    cpu_start: float | None = None
    tasks: list[asyncio.Task[Any]] = []

    async def serve(tunnel: str) -> None:
        nonlocal served, cpu_start
        while True:
            message = await layer.receive(tunnel)
            if message["n"] == warmup:
                cpu_start = time.process_time()
            await layer.send(message["reply_channel"], {"type": "reply", "n": message["n"]})
            served += 1

    try:
        tunnel = await layer.new_channel()
        idle = [await layer.new_channel() for _ in range(int(command["idle"]))]
        tasks = [asyncio.create_task(layer.receive(channel)) for channel in idle]
        tasks.append(asyncio.create_task(serve(tunnel)))
        await asyncio.sleep(0.2)  # every receive() is waiting before the first request
        conn.send({"tunnel": tunnel})
        await pipe_recv(conn, command["deadline_s"], "the caller to finish the relay")
        cpu_s = None if cpu_start is None else time.process_time() - cpu_start
        if tasks[-1].done():
            tasks[-1].result()  # the tunnel's loop failed: raise it here
        woken = sum(1 for task in tasks[:-1] if task.done())
    finally:
        errors = await stop_tasks(tasks)
        await close_layer(kind, layer)
    if errors:
        raise RuntimeError(f"holder relay task failed: {errors[0]!r}")
    conn.send({"served": served, "cpu_s": cpu_s, "idle_woken": woken, "logs": logs.take()})


async def holder_fanout(conn: Connection, command: dict[str, Any], logs: LogRecorder) -> None:
    """Half of the group: join, confirm a probe reached everyone, then record the events."""
    kind = command["layer"]
    events = int(command["events"])
    layer = make_layer(kind, command["prefix"])
    subscribers: list[Subscriber] = []
    try:
        subscribers = await start_subscribers(layer, int(command["subscribers"]), events)
        conn.send({"joined": len(subscribers)})
        if not await wait_all([s.probed for s in subscribers], PROBE_DEADLINE_S):
            raise TimeoutError("no probe reached every subscriber of the holder")
        conn.send({"probed": True})
        await pipe_recv(conn, PIPE_DEADLINE_S, "the caller to start sending")
        cpu_start = time.process_time()
        await wait_all([s.done for s in subscribers], command["deadline_s"])
        report = local_report(subscribers, time.process_time() - cpu_start, events)
    finally:
        try:
            await stop_subscribers(subscribers)
        finally:
            await close_layer(kind, layer)
    conn.send({**report, "logs": logs.take()})


async def holder_loop(conn: Connection) -> None:
    logs = record_layer_logs()
    while True:
        command = await pipe_recv(conn, COMMAND_DEADLINE_S, "the next command")
        if command["cmd"] == "exit":
            return
        if command["cmd"] == "relay":
            await holder_relay(conn, command, logs)
        elif command["cmd"] == "fanout":
            await holder_fanout(conn, command, logs)
        else:
            raise ValueError(f"unknown command {command!r}")


def holder_main(conn: Connection) -> None:
    """The spawned process. SIGALRM (default action: exit) bounds it even if the parent
    is gone; an EOF on the pipe ends it too."""
    signal.alarm(OVERALL_DEADLINE_S + 15)
    try:
        asyncio.run(holder_loop(conn))
    except BaseException:
        try:
            conn.send({"error": traceback.format_exc()})
        except OSError:
            pass
        raise
    finally:
        conn.close()


# --------------------------------------------------------------------------- caller process


async def caller_relay(
    conn: Connection, kind: str, prefix: str, *, n: int, warmup: int, idle: int
) -> dict[str, Any]:
    """Sequential round trips through the holder's tunnel."""
    conn.send(
        {
            "cmd": "relay",
            "layer": kind,
            "prefix": prefix,
            "warmup": warmup,
            "idle": idle,
            "deadline_s": (warmup + n) * REPLY_DEADLINE_S,
        }
    )
    tunnel = (await pipe_recv(conn, PIPE_DEADLINE_S, "the holder's tunnel"))["tunnel"]
    layer = make_layer(kind, prefix)
    samples: list[float] = []
    started = cpu_start = 0.0
    try:
        for i in range(warmup + n):
            if i == warmup:
                started, cpu_start = time.perf_counter(), time.process_time()
            t0 = time.perf_counter()
            reply_channel = await layer.new_channel()
            await layer.send(tunnel, {"type": "cmd", "n": i, "reply_channel": reply_channel})
            try:
                async with asyncio.timeout(REPLY_DEADLINE_S):
                    reply = await layer.receive(reply_channel)
            except TimeoutError:
                raise TimeoutError(
                    f"{kind}: no reply to request {i} within {REPLY_DEADLINE_S:g} s"
                ) from None
            elapsed = time.perf_counter() - t0
            if reply != {"type": "reply", "n": i}:
                raise RuntimeError(f"{kind}: request {i} got {reply!r}")
            if i >= warmup:
                samples.append(elapsed)
        wall = time.perf_counter() - started
        caller_cpu = time.process_time() - cpu_start
        # Before either side closes: what the requests left behind in Redis.
        leftovers = await redis_leftovers(prefix)
    finally:
        await close_layer(kind, layer)
    conn.send({"stop": True})
    holder = await pipe_recv(conn, PIPE_DEADLINE_S, "the holder to stop relaying")
    if holder["served"] != warmup + n:
        raise RuntimeError(f"{kind}: holder served {holder['served']}, expected {warmup + n}")
    stats: dict[str, Any] = summary_ms(samples)
    stats["requests_per_s"] = round(n / wall, 1) if wall > 0 else None
    stats["caller_cpu_ms_per_request"] = round(caller_cpu / n * 1000, 3)
    if holder["cpu_s"] is not None:
        stats["holder_cpu_ms_per_request"] = round(holder["cpu_s"] / n * 1000, 3)
    stats["idle_receivers"] = idle
    stats["idle_receivers_woken"] = holder["idle_woken"]
    stats["open_during_run"] = leftovers
    stats["holder_logs"] = holder["logs"]
    return stats


async def probe_until_ready(conn: Connection, layer: Layer, subscribers: list[Subscriber]) -> int:
    """Send probes to the group until every subscriber of both processes has one."""
    holder_ready = False
    probes = 0
    try:
        async with asyncio.timeout(PROBE_DEADLINE_S):
            while True:
                await layer.group_send(GROUP, {"type": "probe"})
                probes += 1
                await asyncio.sleep(0.02)
                if not holder_ready and conn.poll(0):
                    holder_ready = checked(conn.recv()).get("probed") is True
                if holder_ready and all(s.probed.is_set() for s in subscribers):
                    return probes
    except TimeoutError:
        raise TimeoutError(
            f"after {PROBE_DEADLINE_S:g} s of probes not every subscriber had one "
            f"(holder: {holder_ready}, caller: "
            f"{sum(s.probed.is_set() for s in subscribers)}/{len(subscribers)})"
        ) from None


async def caller_fanout(
    conn: Connection,
    kind: str,
    prefix: str,
    *,
    subscribers: int,
    events: int,
    interval_s: float,
    logs: LogRecorder,
) -> dict[str, Any]:
    """G subscribers (half here, half in the holder); E paced ``group_send`` calls."""
    remote = subscribers // 2
    local = subscribers - remote
    deadline_s = events * interval_s + GRACE_S
    conn.send(
        {
            "cmd": "fanout",
            "layer": kind,
            "prefix": prefix,
            "subscribers": remote,
            "events": events,
            "deadline_s": deadline_s,
        }
    )
    layer = make_layer(kind, prefix)
    mine: list[Subscriber] = []
    send_calls: list[float] = []
    try:
        mine = await start_subscribers(layer, local, events)
        await pipe_recv(conn, PIPE_DEADLINE_S, "the holder's subscribers to join the group")
        probes = await probe_until_ready(conn, layer, mine)
        conn.send({"go": True})
        cpu_start = time.process_time()
        first = time.monotonic()
        for i in range(events):
            delay = first + i * interval_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.monotonic()
            await layer.group_send(GROUP, {"type": "session.events", "n": i, "t": sent})
            send_calls.append(time.monotonic() - sent)
        send_span = time.monotonic() - first
        await wait_all([s.done for s in mine], first + deadline_s - time.monotonic())
        here = local_report(mine, time.process_time() - cpu_start, events)
    finally:
        try:
            await stop_subscribers(mine)
        finally:
            await close_layer(kind, layer)
    there = await pipe_recv(conn, deadline_s + PIPE_DEADLINE_S, "the holder's fan-out results")

    lasts = [r["last_event_last_arrival"] for r in (here, there) if r["last_event_last_arrival"]]
    every = [r["last_arrival"] for r in (here, there) if r["last_arrival"]]
    expected = subscribers * events
    return {
        "subscribers": subscribers,
        "subscribers_caller": local,
        "subscribers_holder": remote,
        "events": events,
        "interval_ms": interval_s * 1000,
        "expected": expected,
        "delivered": here["delivered"] + there["delivered"],
        "delivered_caller": here["delivered"],
        "delivered_holder": there["delivered"],
        "duplicates": here["duplicates"] + there["duplicates"],
        "out_of_order": here["out_of_order"] + there["out_of_order"],
        "complete_subscribers": here["complete_subscribers"] + there["complete_subscribers"],
        "latency": summary_ms(here["latencies"] + there["latencies"]),
        "latency_caller": summary_ms(here["latencies"]),
        "latency_holder": summary_ms(there["latencies"]),
        "last_event_delivered_s": round(max(lasts) - first, 4) if lasts else None,
        "last_delivery_s": round(max(every) - first, 4) if every else None,
        "send_span_s": round(send_span, 4),
        "group_send_call": summary_ms(send_calls),
        "cpu_s_caller": round(here["cpu_s"], 3),
        "cpu_s_holder": round(there["cpu_s"], 3),
        "probes_sent": probes,
        "caller_logs": logs.take(),
        "holder_logs": there["logs"],
    }


async def run_all(conn: Connection, prefix: str, args: argparse.Namespace) -> dict[str, Any]:
    logs = record_layer_logs()
    result: dict[str, Any] = {kind: {} for kind in LAYERS}

    print(
        f"== relay round trip: new_channel + send to the holder's tunnel + receive the reply "
        f"({args.requests} sequential, {args.warmup} warm-up)",
        flush=True,
    )
    for kind in LAYERS:
        stats = await caller_relay(conn, kind, prefix, n=args.requests, warmup=args.warmup, idle=0)
        stats["caller_logs"] = logs.take()
        result[kind]["relay"] = stats
        print(f"   {kind:<13} {fmt(stats)}  {relay_extra(stats)}", flush=True)

    print(
        f"== relay round trip with {args.idle} idle receivers in the holder "
        "(channels with a pending receive())",
        flush=True,
    )
    for kind in LAYERS:
        stats = await caller_relay(
            conn, kind, prefix, n=args.requests, warmup=args.warmup, idle=args.idle
        )
        stats["caller_logs"] = logs.take()
        result[kind]["relay_idle"] = stats
        print(f"   {kind:<13} {fmt(stats)}  {relay_extra(stats)}", flush=True)

    half = args.subscribers // 2
    print(
        f"== group fan-out: {args.subscribers} subscribers ({args.subscribers - half} caller "
        f"+ {half} holder), {args.events} events every {args.interval_ms:g} ms",
        flush=True,
    )
    for kind in LAYERS:
        stats = await caller_fanout(
            conn,
            kind,
            prefix,
            subscribers=args.subscribers,
            events=args.events,
            interval_s=args.interval_ms / 1000,
            logs=logs,
        )
        result[kind]["fanout"] = stats
        lat = stats["latency"]
        print(
            f"   {kind:<13} delivered {stats['delivered']}/{stats['expected']} "
            f"(dup {stats['duplicates']}, out of order {stats['out_of_order']}); "
            f"latency p50={lat.get('p50_ms', math.nan):.2f} ms "
            f"p95={lat.get('p95_ms', math.nan):.2f} ms max={lat.get('max_ms', math.nan):.2f} ms "
            f"(caller p50 {stats['latency_caller'].get('p50_ms', math.nan):.2f}, "
            f"holder p50 {stats['latency_holder'].get('p50_ms', math.nan):.2f})",
            flush=True,
        )
        print(
            f"   {'':<13} last event fully delivered {stats['last_event_delivered_s']} s "
            f"after the first send (sends spanned {stats['send_span_s']} s, group_send "
            f"p50 {stats['group_send_call'].get('p50_ms', math.nan):.2f} ms); "
            f"CPU caller {stats['cpu_s_caller']} s, holder {stats['cpu_s_holder']} s",
            flush=True,
        )
        for line in stats["caller_logs"] + stats["holder_logs"]:
            print(f"   {'':<13} log: {line}", flush=True)

    # The list layer keeps its messages and groups in keys: flush them (KEYS prefix*).
    flusher = cast(ScaleOutChannelLayer, make_layer("redis_list", prefix))
    await flusher.flush()
    result["after_flush"] = await redis_leftovers(prefix)
    return result


def relay_extra(stats: dict[str, Any]) -> str:
    holder_cpu = stats.get("holder_cpu_ms_per_request")
    text = (
        f"({stats['requests_per_s']} req/s; CPU/request caller "
        f"{stats['caller_cpu_ms_per_request']:.3f} ms, holder "
        f"{'-' if holder_cpu is None else f'{holder_cpu:.3f}'} ms; "
        f"in Redis during the run: {stats['open_during_run']['keys']} keys, "
        f"{stats['open_during_run']['pubsub_channels']} pub/sub channels"
    )
    if stats["idle_receivers"]:
        text += f"; idle receivers woken {stats['idle_receivers_woken']}"
    logs = stats["caller_logs"] + stats["holder_logs"]
    if logs:
        text += f"; {len(logs)} layer log lines: {logs[:3]}"
    return text + ")"


# --------------------------------------------------------------------------- main


def env_summary() -> dict[str, Any]:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
    try:
        server = str(client.info("server").get("redis_version"))
    finally:
        client.close()
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "redis_server": server,
        "versions": {
            name: metadata.version(name) for name in ("channels", "channels-redis", "redis")
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-n", "--requests", type=int, default=500, help="measured relay requests per layer"
    )
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured relay requests first")
    parser.add_argument(
        "--idle", type=int, default=100, help="idle receivers in the holder (S) for the relay"
    )
    parser.add_argument("--events", type=int, default=200, help="group_send calls (E)")
    parser.add_argument(
        "--subscribers", type=int, default=100, help="group members, half per process (G)"
    )
    parser.add_argument("--interval-ms", type=float, default=5.0, help="pause between events")
    args = parser.parse_args()
    if args.requests < 1 or args.events < 1 or args.subscribers < 2 or args.warmup < 0:
        parser.error("need -n >= 1, --events >= 1, --subscribers >= 2, --warmup >= 0")

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def overall_deadline(signum: int, frame: object) -> None:
        raise TimeoutError(f"the benchmark did not finish within {OVERALL_DEADLINE_S} s")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGALRM, overall_deadline)
    signal.alarm(OVERALL_DEADLINE_S)

    prefix = f"omnigent-bench-layers-{secrets.token_hex(4)}."
    result: dict[str, Any] = {
        "bench": "channel_layers",
        **env_summary(),
        "redis": REDIS_URL,
        "prefix": prefix,
        "config": {
            "requests": args.requests,
            "warmup": args.warmup,
            "idle_receivers": args.idle,
            "events": args.events,
            "subscribers": args.subscribers,
            "interval_ms": args.interval_ms,
        },
    }
    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    holder = context.Process(
        target=holder_main, args=(child_conn,), name="bench-holder", daemon=True
    )
    try:
        holder.start()
        child_conn.close()
        started = time.monotonic()
        result.update(asyncio.run(run_all(conn, prefix, args)))
        conn.send({"cmd": "exit"})
        holder.join(10)
        if holder.exitcode != 0:
            raise RuntimeError(f"the holder process exited with {holder.exitcode}")
        result["wall_s"] = round(time.monotonic() - started, 2)
    except KeyboardInterrupt:
        print("interrupted: the holder process is stopped, the run's keys deleted", file=sys.stderr)
        return 130
    finally:
        signal.alarm(0)
        if holder.is_alive():
            holder.terminate()
            holder.join(5)
            if holder.is_alive():
                holder.kill()
                holder.join(5)
        conn.close()
        result["keys_deleted_at_exit"] = drop_redis_keys(prefix, url=REDIS_URL)
    print(
        f"== done in {result['wall_s']} s; holder exit code {holder.exitcode}; "
        f"left in Redis after the flush: {result['after_flush']}",
        flush=True,
    )
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
