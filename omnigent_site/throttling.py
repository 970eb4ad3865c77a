"""Request rates per user and per runner (http-api.md, "Limits on clients").

DRF's rate throttles, with the rates read from settings on every request (so a test or
an operator's override applies at once) and off in local single-user mode, where the one
user is the machine's owner. A refused request is 429 ``rate_limited`` with
``Retry-After`` (``omnigent_site.errors``).

- ``UserRateThrottle``: every API request of an authenticated user counts against
  ``OMNIGENT_THROTTLE_USER_RATE``, except polls. Requests without identity are refused
  (401) before any throttle runs.
- ``PollRateThrottle``: polls (the methods a view lists in ``poll_methods``: the session
  snapshot's ``GET``) count against the user's ``OMNIGENT_THROTTLE_POLL_RATE`` instead.
  Compatible clients follow a turn by polling the snapshot every 20 ms, 3,000 requests
  a minute, which the user rate would refuse after 24 s; a poll answered from the
  stored snapshot (or with 304) is also among the cheapest requests there are.
- ``RunnerRateThrottle``: requests that a view hands to a session's runner (the view
  lists their methods in ``runner_throttled_methods``) count against the bound runner's
  ``OMNIGENT_THROTTLE_RUNNER_RATE``, whoever sends them, so many users cannot together
  flood one runner. Runners themselves never call the HTTP API: they speak only through
  their tunnel, authenticated by the binding token (tunnel.md).

Counts live in the ``throttle`` cache: this process's memory, or Redis when
``REDIS_URL`` is set, so that every process shares them. On Redis one script reads,
decides and writes a count in one round trip (``RedisCacheWithRates.admit``), so
requests that arrive together, in any processes, are each counted; in memory the count
is read and written through the cache, under a lock. A cache that fails lets the
request through (logged): throttling protects the service, it must not take it down.
``admit`` and ``give_back`` are the rate on its own, for limits that are not DRF
throttles (failed sign-ins, ``omnigent_site/signin_limits.py``).

Each key holds one number, not DRF's list of every request's time. DRF's
``SimpleRateThrottle`` keeps that list and reads and writes it whole on every request:
at a poller's 3,000 requests a minute that is 3,000 floats pickled both ways per poll
(about 0.1 ms here, and 27 kB each way when the cache is Redis). The rate is kept
instead as a generic cell rate algorithm: the key holds the time at which the client's
allowance is whole again, each admitted request moves it one interval (``duration /
num_requests``) later, and a request that would move it more than ``duration`` past
now is refused. So a client may send up to ``num_requests`` at once, and then one per
interval; ``Retry-After`` is when the next one is admitted. A refused request does not
count, as with DRF's throttle.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.core.cache import BaseCache, caches
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from omnigent_site.runtime.redis_cache import RedisCacheWithRates

log = logging.getLogger(__name__)


# The in-memory path's read, decide and write, one at a time (the script's atomicity).
_local_counts = threading.Lock()


def admit(
    cache: BaseCache, key: str, *, now: float, interval_s: float, duration_s: float
) -> float | None:
    """Count one request against the rate kept under ``key``: None when it is admitted,
    else how many seconds until one would be (it is then not counted)."""
    if isinstance(cache, RedisCacheWithRates):
        # Its own key: a number in the script's format, never read through ``get``.
        return cache.admit(f"{key}:rate", now=now, interval_s=interval_s, duration_s=duration_s)
    with _local_counts:
        stored = cache.get(key)
        # Anything but a number (DRF's list of times, left by an older server under the
        # same key) counts as a whole allowance.
        start = float(stored) if isinstance(stored, int | float) else now
        whole_at = max(start, now) + interval_s
        if whole_at - now > duration_s:
            return whole_at - now - duration_s
        # Past ``duration`` the allowance is whole again: the key can go.
        cache.set(key, whole_at, duration_s)
        return None


def give_back(
    cache: BaseCache, key: str, *, now: float, interval_s: float, duration_s: float
) -> None:
    """Take back one admitted request: it turned out not to count."""
    if isinstance(cache, RedisCacheWithRates):
        cache.give_back(f"{key}:rate", now=now, interval_s=interval_s, duration_s=duration_s)
        return
    with _local_counts:
        stored = cache.get(key)
        if not isinstance(stored, int | float):
            return
        whole_at = float(stored) - interval_s
        if whole_at <= now:
            cache.delete(key)
        else:
            cache.set(key, whole_at, duration_s)


class _ConfiguredRateThrottle(SimpleRateThrottle):
    """A rate from the setting ``rate_setting`` ("" or "0" turns it off), kept as one
    number per key (the module's docstring)."""

    rate_setting = ""

    def __init__(self) -> None:
        self.cache: BaseCache = caches["throttle"]  # not DRF's "default"
        self._wait_s: float | None = None
        super().__init__()
        allowed, per = self.parse_rate(self.rate)
        self._duration_s = float(per or 0)
        self._interval_s = self._duration_s / allowed if allowed else 0.0

    def get_rate(self) -> str | None:
        rate = str(getattr(settings, self.rate_setting, "") or "").strip()
        return None if rate in ("", "0") else rate

    def allow_request(self, request: Request, view: Any) -> bool:
        if settings.OMNIGENT_LOCAL_SINGLE_USER or self.rate is None:
            return True
        try:
            key = self.get_cache_key(request, view)
            return True if key is None else self._admit(key)
        except Exception:  # noqa: BLE001 - e.g. Redis unreachable: let the request through
            log.warning("throttle cache unavailable; %s not applied", self.scope, exc_info=True)
            return True

    def _admit(self, key: str) -> bool:
        self._wait_s = admit(
            self.cache,
            key,
            now=self.timer(),
            interval_s=self._interval_s,
            duration_s=self._duration_s,
        )
        return self._wait_s is None

    def wait(self) -> float | None:
        if self._wait_s is None:
            return None
        return max(self._wait_s, 1.0)  # Retry-After: at least a second


def is_poll(request: Request, view: Any) -> bool:
    return request.method in getattr(view, "poll_methods", ())


class _PerUserThrottle(_ConfiguredRateThrottle):
    """Counts an authenticated user's polls (``counts_polls``) or their other requests."""

    counts_polls = False

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        user = request.user
        if not user or not user.is_authenticated or is_poll(request, view) != self.counts_polls:
            return None
        return self.cache_format % {"scope": self.scope, "ident": user.pk}


class UserRateThrottle(_PerUserThrottle):
    scope = "user"
    rate_setting = "OMNIGENT_THROTTLE_USER_RATE"


class PollRateThrottle(_PerUserThrottle):
    scope = "poll"
    rate_setting = "OMNIGENT_THROTTLE_POLL_RATE"
    counts_polls = True


class RunnerRateThrottle(_ConfiguredRateThrottle):
    scope = "runner"
    rate_setting = "OMNIGENT_THROTTLE_RUNNER_RATE"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if request.method not in getattr(view, "runner_throttled_methods", ()):
            return None
        # Set by SessionAccess, which runs before throttles (DRF: permissions first).
        runner_id = getattr(getattr(view, "session", None), "runner_id", None)
        if not runner_id:
            return None
        return self.cache_format % {"scope": self.scope, "ident": runner_id}
