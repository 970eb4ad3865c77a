"""Benchmark: one request's rate check on Redis, through the cache against the script.

Runs ``UserRateThrottle._admit`` in this process against a real Redis, each check in a
fresh context as a request of its own runs (so Django makes a cache object for each,
as the server does), alternating rounds of two configurations of the ``throttle``
cache: Django's ``RedisCache`` (the check's ``get`` and ``set``, two round trips) and
the project's ``RedisCacheWithRates`` (one Lua script, ``omnigent_site/runtime/
redis_cache.py``). Both on the project's shared connection pool. Prints wall and CPU
microseconds per check, min/median/max over the rounds.

Run: ``.venv/bin/python -m bench.throttle_check [--checks 400] [--rounds 6]``
(Redis at ``--redis-url``, database 14 by default; its keys are deleted at the end).
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import secrets
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnigent_site.settings")

import django

PATHS = {
    "cache get and set": "django.core.cache.backends.redis.RedisCache",
    "one script": "omnigent_site.runtime.redis_cache.RedisCacheWithRates",
}


def spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 1),
        "median": round(statistics.median(values), 1),
        "max": round(max(values), 1),
    }


def one_round(backend: str, *, url: str, prefix: str, checks: int) -> tuple[float, float]:
    """Wall and CPU microseconds per check with the ``throttle`` cache on ``backend``."""
    from django.test import override_settings

    from omnigent_site.settings import shared_cache
    from omnigent_site.throttling import UserRateThrottle

    config = {**shared_cache("throttle", url), "BACKEND": backend, "KEY_PREFIX": prefix}
    with override_settings(
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "throttle": config,
        },
        OMNIGENT_THROTTLE_USER_RATE="1000000/min",
        OMNIGENT_LOCAL_SINGLE_USER=False,
    ):

        def check() -> None:
            if not UserRateThrottle()._admit("bench"):
                raise RuntimeError("a check was refused at 1,000,000 a minute")

        check()  # the pool's connection, the script's registration
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(checks):
            contextvars.Context().run(check)  # a request's context: a new cache object
        return (
            (time.perf_counter() - wall) * 1e6 / checks,
            (time.process_time() - cpu) * 1e6 / checks,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=400, help="checks per round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each, alternating")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args()
    if args.checks < 1 or args.rounds < 1:
        parser.error("--checks and --rounds must be 1 or more")
    django.setup()
    import redis

    prefix = f"omnigent-bench-{secrets.token_hex(4)}"
    results: dict[str, dict[str, list[float]]] = {
        name: {"wall_us": [], "cpu_us": []} for name in PATHS
    }
    try:
        for _ in range(args.rounds):
            for name, backend in PATHS.items():
                wall, cpu = one_round(
                    backend, url=args.redis_url, prefix=prefix, checks=args.checks
                )
                results[name]["wall_us"].append(wall)
                results[name]["cpu_us"].append(cpu)
    finally:
        store = redis.Redis.from_url(args.redis_url)
        for key in store.scan_iter(f"{prefix}:*"):
            store.delete(key)
        store.close()
    report: dict[str, Any] = {"bench": "throttle_check", "checks": args.checks}
    for name, series in results.items():
        report[name] = {kind: spread(values) for kind, values in series.items()}
        wall, cpu = report[name]["wall_us"], report[name]["cpu_us"]
        print(f"{name:18s} wall {wall['median']:7.1f} us   cpu {cpu['median']:7.1f} us (median)")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
