"""Prometheus metrics (operations.md, "Metrics and logs") and ``GET /metrics``.

Every metric is defined here, named ``omnigent_…``, and changed through the small
functions below, which the code that knows the fact calls. The endpoint is off unless
``OMNIGENT_METRICS`` is on (404 in the error format), and with
``OMNIGENT_METRICS_TOKEN`` set it answers only ``Authorization: Bearer <token>`` (401
otherwise).

**Several processes.** prometheus-client keeps each process's values in files under
``PROMETHEUS_MULTIPROC_DIR`` when that variable is set before the library is imported;
settings.py sets it (``<repo>/var/metrics`` unless given) when metrics are on, so
every process of one machine writes to the same folder and ``/metrics`` on any of them
reports the sum (``MultiProcessCollector``). Gauges of live things (open streams,
connected runners) count only processes that are alive: a process removes its gauge
files when it stops, and each process removes those of dead processes when it starts
(a killed one cannot clean up). Without the variable (tests in one process) the values
live in memory.

Values that are a row count (queued turns) are read from the database when scraped,
by the process that answers, so they are right whatever process changed them.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# Latency buckets for requests and relays: most answers take milliseconds, a few wait
# for a runner (up to OMNIGENT_RELAY_TIMEOUT_S).
_FAST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TURN_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)

HTTP_REQUESTS = Counter(
    "omnigent_http_requests",
    "HTTP requests answered, by route pattern, method and status",
    ["route", "method", "status"],
)
HTTP_LATENCY = Histogram(
    "omnigent_http_request_duration_seconds",
    "Time to the response's headers, by route pattern and status",
    ["route", "status"],
    buckets=_FAST_BUCKETS,
)
OPEN_STREAMS = Gauge(
    "omnigent_open_streams",
    "Server-Sent Event streams open now (session streams and the session-list stream)",
    multiprocess_mode="livesum",
)
CONNECTED_RUNNERS = Gauge(
    "omnigent_connected_runners",
    "Runner tunnels connected now (past their handshake)",
    multiprocess_mode="livesum",
)
TURNS_STARTED = Counter(
    "omnigent_turns_started", "Turns a runner started, by agent name", ["agent"]
)
TURNS_COMPLETED = Counter(
    "omnigent_turns_completed", "Turns that completed, by agent name", ["agent"]
)
TURNS_FAILED = Counter(
    "omnigent_turns_failed",
    "Turns that failed (or were cancelled or left incomplete), by agent name and status",
    ["agent", "status"],
)
TURN_DURATION = Histogram(
    "omnigent_turn_duration_seconds",
    "From a turn's message to its end, by agent name and final status",
    ["agent", "status"],
    buckets=_TURN_BUCKETS,
)
RUNNER_EVENT_LAG = Histogram(
    "omnigent_runner_event_lag_seconds",
    "From a runner event's arrival on the tunnel to its storage (the oldest of each batch)",
    buckets=_FAST_BUCKETS,
)
RELAY_LATENCY = Histogram(
    "omnigent_relay_duration_seconds",
    "A command's round trip to its runner and back, by outcome",
    ["outcome"],
    buckets=_FAST_BUCKETS,
)
LLM_TOKENS = Counter(
    "omnigent_llm_tokens", "LLM tokens reported by runners, by model and kind", ["model", "kind"]
)
LLM_COST = Counter(
    "omnigent_llm_cost_usd", "LLM cost reported by runners in US dollars, by model", ["model"]
)
WEBHOOK_DELIVERIES = Counter(
    "omnigent_webhook_deliveries", "Webhook delivery attempts, by outcome", ["status"]
)
BACKEND_ERRORS = Counter(
    "omnigent_backend_errors",
    "Failed calls to the database or Redis seen by request handling, by backend",
    ["backend"],
)

# A route label for requests Django matched to no URL pattern (bounded cardinality).
UNMATCHED_ROUTE = "unmatched"
_STATUS_CLASSES = {"completed"}


def request_answered(*, route: str, method: str, status: int, seconds: float) -> None:
    status_label = str(status)
    HTTP_REQUESTS.labels(route=route, method=method, status=status_label).inc()
    HTTP_LATENCY.labels(route=route, status=status_label).observe(seconds)


def stream_opened() -> None:
    OPEN_STREAMS.inc()


def stream_closed() -> None:
    OPEN_STREAMS.dec()


def runner_connected() -> None:
    CONNECTED_RUNNERS.inc()


def runner_disconnected() -> None:
    CONNECTED_RUNNERS.dec()


def turn_started(*, agent: str) -> None:
    TURNS_STARTED.labels(agent=agent).inc()


def turn_ended(*, agent: str, status: str, seconds: float | None) -> None:
    """A turn reached ``status`` (``completed``, ``failed``, ``cancelled``, ``incomplete``)."""
    if status in _STATUS_CLASSES:
        TURNS_COMPLETED.labels(agent=agent).inc()
    else:
        TURNS_FAILED.labels(agent=agent, status=status).inc()
    if seconds is not None:
        TURN_DURATION.labels(agent=agent, status=status).observe(max(0.0, seconds))


def runner_events_stored(*, oldest_wait_s: float) -> None:
    RUNNER_EVENT_LAG.observe(max(0.0, oldest_wait_s))


def relay_answered(*, outcome: str, seconds: float) -> None:
    RELAY_LATENCY.labels(outcome=outcome).observe(seconds)


def llm_usage(
    *, model: str, input_tokens: int = 0, output_tokens: int = 0, cost_usd: float = 0.0
) -> None:
    """Tokens and cost of model calls (usage.md), as the runner reports them."""
    if input_tokens:
        LLM_TOKENS.labels(model=model, kind="input").inc(input_tokens)
    if output_tokens:
        LLM_TOKENS.labels(model=model, kind="output").inc(output_tokens)
    if cost_usd:
        LLM_COST.labels(model=model).inc(cost_usd)


def webhook_delivered(*, status: str) -> None:
    """One delivery attempt: ``delivered``, ``failed`` or ``gave_up``, or an HTTP status."""
    WEBHOOK_DELIVERIES.labels(status=status).inc()


def backend_error(backend: str) -> None:
    """A database (``database``) or Redis (``redis``) call failed."""
    BACKEND_ERRORS.labels(backend=backend).inc()


# --- several processes -----------------------------------------------------------------


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


_PID_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db$")


def forget_dead_processes(path: str) -> list[int]:
    """Remove the live-gauge files of processes that no longer exist (a killed server
    cannot remove its own); returns their process ids."""
    dead: set[int] = set()
    for name in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        match = _PID_FILE.search(name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and not _alive(pid):
            dead.add(pid)
    for pid in sorted(dead):
        multiprocess.mark_process_dead(pid, path)
    return sorted(dead)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_started() -> None:
    """At a server process's start: clear dead processes' live gauges."""
    path = multiprocess_dir()
    if path:
        forgotten = forget_dead_processes(path)
        if forgotten:
            log.info("metrics: forgot the live gauges of stopped processes %s", forgotten)


def process_stopping() -> None:
    """At a server process's stop: its live gauges no longer count."""
    path = multiprocess_dir()
    if path:
        multiprocess.mark_process_dead(os.getpid(), path)


# --- the endpoint ----------------------------------------------------------------------


# Collectors read when scraped, registered by the apps that own the facts (the
# sessions app: queued turns), since this package imports none of them.
_SCRAPE_COLLECTORS: list[Collector] = []


def on_scrape(collector: Collector) -> Collector:
    """Add ``collector`` to every scrape of this process (one of each class: an app's
    ``ready()`` may run more than once in tests)."""
    _SCRAPE_COLLECTORS[:] = [c for c in _SCRAPE_COLLECTORS if type(c) is not type(collector)]
    _SCRAPE_COLLECTORS.append(collector)
    return collector


class Scrape:
    """What a scrape renders: every process's files when several share a folder, else
    this process's own values; plus the collectors read at scrape time."""

    def __init__(self, path: str | None) -> None:
        self._sources: list[Any] = []
        if path:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=path)
            self._sources.append(registry)
        else:
            self._sources.append(REGISTRY)
        self._sources.extend(_SCRAPE_COLLECTORS)

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            yield from source.collect()
