"""Request rates per user and per runner (http-api.md, "Limits on clients").

DRF's rate throttles, with the rates read from settings on every request (so a test or
an operator's override applies at once) and off in local single-user mode, where the one
user is the machine's owner. A refused request is 429 ``rate_limited`` with
``Retry-After`` (``omnigent_site.errors``).

- ``UserRateThrottle``: every API request of an authenticated user counts against
  ``OMNIGENT_THROTTLE_USER_RATE``. Requests without identity are refused (401) before
  any throttle runs.
- ``RunnerRateThrottle``: requests that a view hands to a session's runner (the view
  lists their methods in ``runner_throttled_methods``) count against the bound runner's
  ``OMNIGENT_THROTTLE_RUNNER_RATE``, whoever sends them, so many users cannot together
  flood one runner. Runners themselves never call the HTTP API: they speak only through
  their tunnel, authenticated by the binding token (tunnel.md).

Counts live in the ``throttle`` cache: this process's memory, or Redis when
``REDIS_URL`` is set, so that every process shares them. A cache that fails lets the
request through (logged): throttling protects the service, it must not take it down.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.cache import BaseCache, caches
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

log = logging.getLogger(__name__)


class _ConfiguredRateThrottle(SimpleRateThrottle):
    """A rate from the setting ``rate_setting`` ("" or "0" turns it off)."""

    rate_setting = ""

    def __init__(self) -> None:
        self.cache: BaseCache = caches["throttle"]  # not DRF's "default"
        super().__init__()

    def get_rate(self) -> str | None:
        rate = str(getattr(settings, self.rate_setting, "") or "").strip()
        return None if rate in ("", "0") else rate

    def allow_request(self, request: Request, view: Any) -> bool:
        if settings.OMNIGENT_LOCAL_SINGLE_USER:
            return True
        try:
            return super().allow_request(request, view)
        except Exception:  # noqa: BLE001 - e.g. Redis unreachable: let the request through
            log.warning("throttle cache unavailable; %s not applied", self.scope, exc_info=True)
            return True

    def wait(self) -> float | None:
        wait = super().wait()
        return None if wait is None else max(wait, 1.0)  # Retry-After: at least a second


class UserRateThrottle(_ConfiguredRateThrottle):
    scope = "user"
    rate_setting = "OMNIGENT_THROTTLE_USER_RATE"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        user = request.user
        if not user or not user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": user.pk}


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
