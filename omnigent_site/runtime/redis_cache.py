"""One Redis connection pool per process for Django's Redis caches.

Django keeps cache objects in an async-safe local (``CacheHandler`` is a connection
handler with ``thread_critical = False``), so every request, which runs in a context of
its own, gets its own ``RedisCache``, and with it its own client and its own
``redis.ConnectionPool``. Each request that touched a shared cache (the throttles on
every API request, the session-list mark on every status change) therefore opened a
new TCP connection to Redis, paid redis-py's per-connection set-up (which reads the
package's metadata from disk), and left the socket to the garbage collector: 100
requests opened 100 connections (``docs/performance.md``, item 42).

Django's Redis backend takes the pool's class from ``OPTIONS["pool_class"]`` and makes
each pool with its ``from_url(url, **options)``. ``ProcessConnectionPool.from_url``
hands back the pool it already made for the same URL and options, so every
``RedisCache`` of a process shares one pool per server and its connections are used
again. A redis-py pool is thread-safe and starts afresh in a forked child, and a
client made on it is cheap, so nothing else changes.
``tests/unit/test_redis_cache.py`` counts the connections Redis accepts: it fails if
Django stops making its pools through ``pool_class``.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Self

from redis import ConnectionPool


def _options_key(options: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    # The values are settings (numbers, strings, classes): their reprs tell them apart.
    return tuple(sorted((name, repr(value)) for name, value in options.items()))


class ProcessConnectionPool(ConnectionPool):
    """A ``redis.ConnectionPool`` whose ``from_url`` makes one pool per URL and options
    in this process, and returns it to every later caller."""

    _pools: ClassVar[dict[tuple[str, tuple[tuple[str, str], ...]], ProcessConnectionPool]] = {}
    _pools_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Self:
        key = (url, _options_key(kwargs))
        with cls._pools_lock:
            pool = cls._pools.get(key)
            if pool is None:
                pool = cls._pools[key] = super().from_url(url, **kwargs)
            assert isinstance(pool, cls)
            return pool

    @classmethod
    def disconnect_all(cls) -> None:
        """Close every shared pool's connections (tests; a pool reconnects when used)."""
        with cls._pools_lock:
            pools = list(cls._pools.values())
        for pool in pools:
            pool.disconnect()
