"""Benchmark-only settings: the project's settings plus SQL counting and a floor view.

``bench/throughput.py`` starts daphne with ``DJANGO_SETTINGS_MODULE=bench.server_settings``
so it can count the server's SQL statements without touching production code and
without ``DEBUG`` (whose query log changes what is measured). Everything else is the
production configuration: this module only adds

- an ``execute_wrapper`` on every database connection (installed from
  ``connection_created``), counting statements by their first word (``BEGIN`` counts
  transactions on SQLite, whose ``IMMEDIATE`` transactions are opened with a statement)
  and the seconds spent in them (lock waits included), per thread name;
- with ``BENCH_SQL_LOG=path``, each statement's normalized text (whitespace collapsed,
  ``IN (%s, %s, ...)`` lists and multi-row ``VALUES`` shortened, numbers as ``N``) with
  its thread kind, one a line, and a ``#snapshot`` line at each ``GET /bench/queries``,
  so the statements between two snapshots of two runs can be counted and diffed
  (``bench/sql_log.py``);
- ``bench.server_urls``: ``GET /bench/noop`` (a trivial async view, the floor of an
  HTTP request) and ``GET /bench/queries`` (the counters as JSON), before the
  project's own routes.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db.backends.signals import connection_created

from omnigent_site.settings import *  # noqa: F403 - the production settings, unchanged

ROOT_URLCONF = "bench.server_urls"

_lock = threading.Lock()
_counts: dict[str, int] = {}
_seconds: dict[str, float] = {}
_thread_seconds: dict[str, float] = {}
_thread_counts: dict[str, int] = {}


def _thread_kind(name: str) -> str:
    """Thread names without their serial numbers (``ThreadPoolExecutor-3_0`` → ``ThreadPoolExecutor``)."""
    return name.split("-", 1)[0].rstrip("_0123456789") or name


_log_path = os.environ.get("BENCH_SQL_LOG")
_SPACE = re.compile(r"\s+")
_PLACEHOLDERS = re.compile(r"\((?:%s|\?)(?:, (?:%s|\?))+\)")
_ROWS = re.compile(r"(\([^()]*\))(?:, \1)+")
_NUMBER = re.compile(r"\b\d+\b")


def normalized(sql: str) -> str:
    """``sql`` with what varies between two executions of the same statement left out."""
    text = _SPACE.sub(" ", sql).strip()
    text = _PLACEHOLDERS.sub("(%s, ...)", text)
    text = _ROWS.sub(r"\1, ...", text)
    return _NUMBER.sub("N", text)


def _log(line: str) -> None:
    with _lock, open(_log_path or os.devnull, "a") as log:
        log.write(line + "\n")


def _count(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
    if _log_path:
        _log(f"{_thread_kind(threading.current_thread().name)}\t{normalized(sql)}")
    started = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        elapsed = time.perf_counter() - started
        thread = _thread_kind(threading.current_thread().name)
        with _lock:
            _counts[verb] = _counts.get(verb, 0) + 1
            _seconds[verb] = _seconds.get(verb, 0.0) + elapsed
            _thread_counts[thread] = _thread_counts.get(thread, 0) + 1
            _thread_seconds[thread] = _thread_seconds.get(thread, 0.0) + elapsed


def _install(sender: Any, connection: Any, **kwargs: Any) -> None:
    if _count not in connection.execute_wrappers:
        connection.execute_wrappers.append(_count)


def snapshot() -> dict[str, Any]:
    """The counters so far (the benchmark takes differences between two snapshots)."""
    if _log_path:
        _log("#snapshot")
    with _lock:
        return {
            "statements": sum(_counts.values()),
            "by_verb": dict(_counts),
            "seconds_by_verb": {key: round(value, 6) for key, value in _seconds.items()},
            "by_thread": dict(_thread_counts),
            "seconds_by_thread": {key: round(value, 6) for key, value in _thread_seconds.items()},
        }


connection_created.connect(_install, dispatch_uid="bench-count-queries")
