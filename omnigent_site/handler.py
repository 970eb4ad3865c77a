"""Django's ASGI handler, with each request's sync thread taken from a pool of idle ones.

Django runs the sync code of one HTTP request (ORM calls, sync views, signal
receivers) on one thread of its own, chosen through asgiref's
``ThreadSensitiveContext``. Stock Django creates that thread on the request's
first sync call and joins it when the request ends, so every request pays for a
thread start and join, and the database connection opened in the thread dies
with it: ``DATABASE_CONN_MAX_AGE`` cannot keep anything.

Here a finished request's thread goes back to a pool and serves a later request,
as in a threaded WSGI server. One request still owns one thread for as long as
it runs, so Django's guarantees (one thread per request for thread-sensitive
code, connections never shared between threads) are unchanged; connections are
closed or kept by Django's own ``request_finished`` handling, according to
``CONN_MAX_AGE``.

Django also tidies connections when a request *starts* (``request_started``:
``close_old_connections`` and ``reset_queries``). Under ASGI those are sync
receivers, so they cost every request a trip to its thread before the view
runs: about 0.5 ms of the relay's 5 ms here. On a pooled thread they have
nothing left to do, because the previous request on the same thread ended with
``request_finished``, which already closed what was stale or broken and re-armed
the health check. So for this handler they run at the end of the request instead,
in the trip Django makes anyway (see ``move_request_housekeeping_to_end``).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, reset_queries


class RequestThreadPool:
    """Single-thread executors for requests; at most ``max_idle`` are kept idle."""

    def __init__(self, *, max_idle: int) -> None:
        self.max_idle = max_idle
        self._idle: deque[ThreadPoolExecutor] = deque()
        self._lock = threading.Lock()
        self._created = 0

    def acquire(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._idle:
                # Most recently used first: its connection is the least likely to be stale.
                return self._idle.pop()
            self._created += 1
            number = self._created
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"django-request-{number}")

    def release(self, executor: ThreadPoolExecutor) -> None:
        """Keep ``executor`` for the next request, or stop it when enough are idle.

        Work still queued on it (a sync call of a request that was cancelled
        mid-call) simply runs before the next request's, on the same thread.
        """
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)

    @property
    def idle(self) -> int:
        return len(self._idle)


class PooledThreadsASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose requests run their sync code on pooled threads."""

    def __init__(self, *, max_idle_threads: int) -> None:
        super().__init__()
        self.threads = RequestThreadPool(max_idle=max_idle_threads)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.acquire()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            self.threads.release(executor)


def move_request_housekeeping_to_end() -> None:
    """Run Django's start-of-request receivers for the stock handlers only.

    Signals cannot exclude one sender, so the two receivers are disconnected
    from every sender and connected again for Django's own handlers.
    ``reset_queries`` (the DEBUG query log) moves to the end of this handler's
    requests; ``close_old_connections`` already runs there. Django's test client
    connects ``close_old_connections`` for every sender again around its own
    requests; that only brings the extra trip back, it breaks nothing.
    """
    for receiver in (close_old_connections, reset_queries):
        signals.request_started.disconnect(receiver)
        for sender in (WSGIHandler, ASGIHandler):
            signals.request_started.connect(receiver, sender=sender)
    signals.request_finished.connect(reset_queries, sender=PooledThreadsASGIHandler)


def get_pooled_asgi_application() -> PooledThreadsASGIHandler:
    """Like ``django.core.asgi.get_asgi_application``, with the pooled handler."""
    django.setup(set_prefix=False)
    move_request_housekeeping_to_end()
    return PooledThreadsASGIHandler(max_idle_threads=settings.OMNIGENT_REQUEST_THREADS_IDLE)
