"""Django's standard middleware, without a thread hop per hook under ASGI.

``MiddlewareMixin.__acall__`` runs every ``process_request`` and
``process_response`` through ``sync_to_async``: with the usual seven middleware
that is a dozen trips to the sync thread for every request, several milliseconds
on a small machine, and it queues behind whatever that one thread is doing. The
hooks below touch no database (they set lazy objects, read cookies and headers,
add headers), so they run inline on the event loop. The two that *can* reach the
database — saving a modified session, storing messages that spill into the
session — still go through ``sync_to_async`` exactly when they would.

What it saves is in ``docs/performance.md`` (overrides). No leaner ``MIDDLEWARE`` gives
the same: the admin and the browsable
API need sessions, authentication, messages and CSRF, and the security, common
and frame-options middleware set the API's response headers.

``settings.MIDDLEWARE`` names Django's own classes, so that Django's system checks
(``check --deploy``: security, CSRF and frame-options middleware, HSTS, SSL redirect,
secure cookies) see the real middleware; ``PooledThreadsASGIHandler`` (``handler.py``)
builds its chain with each one's equivalent from ``INLINE_EQUIVALENTS`` instead. Other
handlers (Django's test clients, WSGI) run the stock classes, which behave the same
apart from the thread hops.

This copies the shape of ``MiddlewareMixin.__acall__`` and relies on the audited
hooks touching no database (with ``CSRF_USE_SESSIONS`` off). The guard test
(``tests/unit/test_runtime_guards.py``) fingerprints those Django functions, so a
Django upgrade that changes any of them fails there until they are audited again.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware


class InlineHooksMixin:
    """``process_request``/``process_response`` run on the event loop in async mode."""

    get_response: Any

    def response_needs_thread(self, request: HttpRequest) -> bool:
        return False

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            if self.response_needs_thread(request):
                response = await sync_to_async(self.process_response, thread_sensitive=True)(
                    request, response
                )
            else:
                response = self.process_response(request, response)
        return response


class InlineSecurityMiddleware(InlineHooksMixin, SecurityMiddleware):
    pass


class InlineSessionMiddleware(InlineHooksMixin, SessionMiddleware):
    def response_needs_thread(self, request: HttpRequest) -> bool:
        session = getattr(request, "session", None)
        return bool(
            session is not None
            and (getattr(session, "modified", False) or settings.SESSION_SAVE_EVERY_REQUEST)
        )


class InlineCommonMiddleware(InlineHooksMixin, CommonMiddleware):
    pass


class InlineCsrfViewMiddleware(InlineHooksMixin, CsrfViewMiddleware):
    async def process_view(  # type: ignore[override]
        self, request: HttpRequest, callback: Any, callback_args: Any, callback_kwargs: Any
    ) -> HttpResponseBase | None:
        # A coroutine, so Django calls it without a hop (it reads the request's
        # cookies and already-read body only).
        return CsrfViewMiddleware.process_view(
            self, request, callback, callback_args, callback_kwargs
        )


class InlineAuthenticationMiddleware(InlineHooksMixin, AuthenticationMiddleware):
    pass


class InlineMessageMiddleware(InlineHooksMixin, MessageMiddleware):
    def response_needs_thread(self, request: HttpRequest) -> bool:
        storage = getattr(request, "_messages", None)
        return bool(storage is not None and (storage.used or storage.added_new))


class InlineXFrameOptionsMiddleware(InlineHooksMixin, XFrameOptionsMiddleware):
    pass


# Django's class (as ``settings.MIDDLEWARE`` names it) -> the class the server runs.
INLINE_EQUIVALENTS: dict[str, str] = {
    f"{stock.__module__}.{stock.__name__}": f"{inline.__module__}.{inline.__name__}"
    for stock, inline in (
        (SecurityMiddleware, InlineSecurityMiddleware),
        (SessionMiddleware, InlineSessionMiddleware),
        (CommonMiddleware, InlineCommonMiddleware),
        (CsrfViewMiddleware, InlineCsrfViewMiddleware),
        (AuthenticationMiddleware, InlineAuthenticationMiddleware),
        (MessageMiddleware, InlineMessageMiddleware),
        (XFrameOptionsMiddleware, InlineXFrameOptionsMiddleware),
    )
}


def with_inline_equivalents(paths: list[str]) -> list[str]:
    """``paths`` with every Django class that has an inline equivalent replaced by it."""
    return [INLINE_EQUIVALENTS.get(path, path) for path in paths]
