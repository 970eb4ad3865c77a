"""One Redis connection pool per process for Django's Redis caches.

Django keeps cache objects in an async-safe local (``CacheHandler`` is a connection
handler with ``thread_critical = False``), so every request, which runs in a context of
its own, gets its own ``RedisCache``, and with it its own client and its own
``redis.ConnectionPool``. Each request that touched a shared cache (the throttles on
every API request, the session-list mark on every status change) therefore opened a
new TCP connection to Redis, paid redis-py's per-connection set-up (which reads the
package's metadata from disk), and left the socket to the garbage collector
(``docs/performance.md``, overrides).

Django's Redis backend takes the pool's class from ``OPTIONS["pool_class"]`` and makes
each pool with its ``from_url(url, **options)``. ``ProcessConnectionPool.from_url``
hands back the pool it already made for the same URL and options, so every
``RedisCache`` of a process shares one pool per server and its connections are used
again. A redis-py pool is thread-safe and starts afresh in a forked child, and a
client made on it is cheap, so nothing else changes.
``tests/unit/test_redis_cache.py`` counts the connections Redis accepts: it fails if
Django stops making its pools through ``pool_class``.

``RedisCacheWithRates`` is Django's Redis cache plus ``admit``, the throttles' rate
check (``omnigent_site/throttling.py``) in one round trip: a Lua script reads the
client's count, decides and writes it back atomically. Through the cache's ``get`` and
``set`` the check took two round trips, each with a ``redis.Redis`` client that Django
builds for every call, and two processes (or threads) that read the same count at once
both admitted their request. The script runs on a client made once per process and
server, on the same shared pool. ``give_back`` takes one counted request back the same
way (a sign-in that succeeded, ``omnigent_site/signin_limits.py``).
"""

from __future__ import annotations

import math
import threading
from functools import cached_property
from typing import Any, ClassVar, Self

import redis
from django.core.cache.backends.redis import RedisCache
from django.core.exceptions import ImproperlyConfigured
from redis import ConnectionPool
from redis.commands.core import Script


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

    @cached_property
    def admit_script(self) -> Script:
        """``ADMIT_SCRIPT`` on a client of this pool: one per shared pool, so per process."""
        return redis.Redis(connection_pool=self).register_script(ADMIT_SCRIPT)

    @cached_property
    def give_back_script(self) -> Script:
        """``GIVE_BACK_SCRIPT`` on a client of this pool, as ``admit_script``."""
        return redis.Redis(connection_pool=self).register_script(GIVE_BACK_SCRIPT)

    @classmethod
    def disconnect_all(cls) -> None:
        """Close every shared pool's connections (tests; a pool reconnects when used)."""
        with cls._pools_lock:
            pools = list(cls._pools.values())
        for pool in pools:
            pool.disconnect()


# One request against a rate kept as the time its allowance is whole again (a generic
# cell rate algorithm): the arithmetic of ``omnigent_site.throttling``, in Redis.
# KEYS[1]: the count; ARGV: now, interval and duration in seconds, the key's life in ms.
# Returns nothing when the request is admitted (and stores the new count), else the
# seconds until the next request would be.
ADMIT_SCRIPT = """
local now = tonumber(ARGV[1])
local start = tonumber(redis.call('GET', KEYS[1])) or now
if start < now then start = now end
local whole_at = start + tonumber(ARGV[2])
if whole_at - now > tonumber(ARGV[3]) then
  return tostring(whole_at - now - tonumber(ARGV[3]))
end
redis.call('SET', KEYS[1], string.format('%.6f', whole_at), 'PX', ARGV[4])
return false
"""

# One admitted request taken back (it turned out not to count): the count moves one
# interval earlier, and goes when that is not in the future. ARGV as ADMIT_SCRIPT's.
GIVE_BACK_SCRIPT = """
local now = tonumber(ARGV[1])
local whole_at = tonumber(redis.call('GET', KEYS[1]))
if not whole_at then return false end
whole_at = whole_at - tonumber(ARGV[2])
if whole_at <= now then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], string.format('%.6f', whole_at), 'PX', ARGV[4])
end
return false
"""


class RedisCacheWithRates(RedisCache):
    """Django's Redis cache, plus ``admit``: a rate check in one atomic round trip."""

    def admit(self, key: str, *, now: float, interval_s: float, duration_s: float) -> float | None:
        """Count one request against the rate kept under ``key``: None when it is
        admitted, else how many seconds until one would be (it is then not counted)."""
        wait = self._pool().admit_script(
            keys=[self.make_and_validate_key(key)],
            args=self._rate_args(now=now, interval_s=interval_s, duration_s=duration_s),
        )
        return None if wait is None else float(wait)

    def give_back(self, key: str, *, now: float, interval_s: float, duration_s: float) -> None:
        """Take back one request ``admit`` counted under ``key``."""
        self._pool().give_back_script(
            keys=[self.make_and_validate_key(key)],
            args=self._rate_args(now=now, interval_s=interval_s, duration_s=duration_s),
        )

    def _pool(self) -> ProcessConnectionPool:
        # The pool Django's own writes use (the first server's), shared by the process.
        pool = self._cache.get_client(write=True).connection_pool
        if not isinstance(pool, ProcessConnectionPool):
            raise ImproperlyConfigured(
                "RedisCacheWithRates needs OPTIONS['pool_class'] = "
                "'omnigent_site.runtime.redis_cache.ProcessConnectionPool'"
            )
        return pool

    @staticmethod
    def _rate_args(*, now: float, interval_s: float, duration_s: float) -> list[Any]:
        return [repr(now), repr(interval_s), repr(duration_s), max(1, math.ceil(duration_s * 1000))]
