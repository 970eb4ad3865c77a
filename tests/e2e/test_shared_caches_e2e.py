"""A server on Redis keeps its connections to it: requests do not open new ones.

With the client rate limits on, every API request reads and writes its count in the
shared cache on Redis. Django makes a cache object per request; with redis-py's stock
pool each request opened a connection of its own (one per request, left to the garbage
collector). The server under test is a real daphne process on PostgreSQL and Redis.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import pytest
import redis

from testing.processes import Server

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(120)]

# Requests a user may send at once; the allowance refills one an hour, so the test's
# own pace cannot add one.
ALLOWED = 45


def test_rate_limited_requests_reuse_the_processs_redis_connections(
    launch_server: Callable[..., Server], postgres_url: str, redis_url: str
) -> None:
    prefix = f"omnigent-e2e-{secrets.token_hex(4)}"
    server = launch_server(
        DATABASE_URL=postgres_url,
        REDIS_URL=redis_url,
        OMNIGENT_CHANNEL_PREFIX=prefix,
        OMNIGENT_THROTTLE_USER_RATE=f"{ALLOWED}/hour",
    )
    store = redis.Redis.from_url(redis_url)
    try:
        with server.client() as client:
            warm_up = 5  # the process's pools and the channel layer's connections
            for _ in range(warm_up):
                assert client.get("/v1/sessions").status_code == 200
            opened_before = store.info("stats")["total_connections_received"]
            for _ in range(ALLOWED - warm_up):
                assert client.get("/v1/sessions").status_code == 200
            opened = store.info("stats")["total_connections_received"] - opened_before
            refused = client.get("/v1/sessions")
        counts = store.keys(f"{prefix}:throttle:*")
    finally:
        for key in store.keys(f"{prefix}:*"):
            store.delete(key)
        store.close()
    # The counts went through Redis, and the next request was over the rate.
    assert counts, "no throttle count in Redis"
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limited"
    # One request at a time: the pool's connection, used again (40 with the stock pool).
    assert opened <= 2, f"{opened} new Redis connections for {ALLOWED - warm_up} requests"
