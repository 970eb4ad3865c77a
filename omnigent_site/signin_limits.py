"""Failed sign-ins, limited per user name and per client address (security.md, "Sign-in").

Every password check of a request (the web page's ``/signin``, the admin's and the
browsable API's login pages: all go through Django's ``authenticate`` and this backend)
first takes a place under two rates, ``OMNIGENT_SIGNIN_FAILURES_PER_USER`` for the user
name and ``OMNIGENT_SIGNIN_FAILURES_PER_ADDRESS`` for the client address
(``client_address``: the peer, or what a trusted proxy forwarded), each per
``OMNIGENT_SIGNIN_WINDOW_S``. A sign-in that succeeds gives its places back, so only
failures count. Taking the place before the password is checked bounds guesses sent
all at once as well as one after another, and a right password is refused too while a
limit is used up, so a refusal tells nothing about the password.

The rates are the throttles' (``omnigent_site.throttling.admit``): ``n`` failures at
once, then one more each window / ``n`` (5 per 15 minutes: one every 3 minutes), with
the counts in the ``throttle`` cache, shared through Redis when ``REDIS_URL`` is set. A
refused attempt raises ``PermissionDenied`` in the backend, which makes Django's
``authenticate`` fail without asking another backend, and leaves how long to wait on the
request (``wait_s``) for the sign-in page to say so. If the cache fails, the attempt
goes through (logged), as with the request rates.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.cache import caches
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from .authentication import client_address
from .throttling import admit, give_back

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

log = logging.getLogger(__name__)

# The time the rates are kept in; tests put a clock of their own here.
clock: Callable[[], float] = time.time

WAIT_ATTRIBUTE = "signin_wait_s"


def _places(username: str, address: str) -> list[tuple[str, float]]:
    """(cache key, interval) of each limit in force for this attempt."""
    window = float(settings.OMNIGENT_SIGNIN_WINDOW_S)
    places = []
    for scope, value, allowed in (
        ("user", username.casefold(), int(settings.OMNIGENT_SIGNIN_FAILURES_PER_USER)),
        ("address", address, int(settings.OMNIGENT_SIGNIN_FAILURES_PER_ADDRESS)),
    ):
        if allowed > 0 and window > 0:
            digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
            places.append((f"signin_{scope}_{digest}", window / allowed))
    return places


def take(*, username: str, address: str) -> float | None:
    """Take this attempt's place under every limit: None when it may go on, else how many
    seconds until it could (and nothing is counted)."""
    cache = caches["throttle"]
    window = float(settings.OMNIGENT_SIGNIN_WINDOW_S)
    now = clock()
    taken: list[tuple[str, float]] = []
    try:
        for key, interval in _places(username, address):
            wait = admit(cache, key, now=now, interval_s=interval, duration_s=window)
            if wait is not None:
                for done_key, done_interval in taken:
                    give_back(cache, done_key, now=now, interval_s=done_interval, duration_s=window)
                return wait
            taken.append((key, interval))
    except Exception:  # noqa: BLE001 - e.g. Redis unreachable: the sign-in goes on
        log.warning("throttle cache unavailable; sign-in limits not applied", exc_info=True)
    return None


def give_back_places(*, username: str, address: str) -> None:
    """The attempt succeeded: it does not count against either limit."""
    cache = caches["throttle"]
    window = float(settings.OMNIGENT_SIGNIN_WINDOW_S)
    now = clock()
    try:
        for key, interval in _places(username, address):
            give_back(cache, key, now=now, interval_s=interval, duration_s=window)
    except Exception:  # noqa: BLE001 - as in ``take``
        log.warning("throttle cache unavailable; a sign-in was not given back", exc_info=True)


class RateLimitedModelBackend(ModelBackend):
    """Django's user-and-password backend, with failed attempts limited."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> AuthUser | None:
        if request is None:  # not a request (a management command): nothing to limit
            return super().authenticate(request, username, password, **kwargs)
        name = username if username is not None else kwargs.get(get_user_model().USERNAME_FIELD)
        limited = {"username": str(name or ""), "address": client_address(request)}
        wait = take(**limited)
        if wait is not None:
            setattr(request, WAIT_ATTRIBUTE, wait)
            raise PermissionDenied("too many failed sign-ins")
        user = super().authenticate(request, username, password, **kwargs)
        if user is not None:
            give_back_places(**limited)
        return user

    async def aauthenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> AuthUser | None:
        # ModelBackend's own async path would skip the limits.
        return await sync_to_async(self.authenticate)(request, username, password, **kwargs)
