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
closed or kept according to ``CONN_MAX_AGE``, by Django's own
``close_old_connections`` (at the start and end of each request, as Django does, and
after each call, below).

Two things a request may wait on for long must not hold a database connection or
a thread while they wait: a runner's answer (up to the relay deadline) and, above
all, a streamed response, which stays open as long as its watcher does. So:

- every sync call of a request ends with ``close_old_connections`` in its thread,
  as every call of a Channels consumer does. With ``CONN_MAX_AGE=0`` (PostgreSQL
  behind the psycopg pool) the connection goes back to the pool after each call
  rather than at the end of the request: otherwise a few dozen open streams
  would check out the whole pool, and every other request would wait for it and
  fail. On SQLite, where connections are kept, the check costs microseconds;
- once a streaming response starts sending, its thread goes back to the pool
  (``RequestThread.detach``). The stream's later sync calls (a replay, the final
  ``response.close()``) each borrow a pooled thread for as long as they run, one
  call at a time. A watcher then costs a socket and its tasks, not a thread.

How many requests *run* sync code at once is a separate limit
(``running_gate.RunningGate``, ``OMNIGENT_REQUEST_THREADS_RUNNING``): every call waits
for a place there (``RequestThread.submit``) before it takes its request's thread, so a
waiting call holds none.
"""

from __future__ import annotations

import contextvars
import functools
import io
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import django
from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.db import close_old_connections
from django.http import HttpResponseBase

from .running_gate import Place, RunningGate, use_request_gate

T = TypeVar("T")


class RequestThreadPool:
    """Single-thread executors for requests; at most ``max_idle`` are kept idle, and at
    most ``max_running`` of them run a call at once (``0``: no limit)."""

    def __init__(self, *, max_idle: int, max_running: int = 0) -> None:
        self.max_idle = max_idle
        self.gate = RunningGate(limit=max_running)
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
        """Keep ``executor`` for the next request, or stop it when enough are idle."""
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def created(self) -> int:
        """Threads started so far (kept or stopped since)."""
        return self._created


@dataclass(slots=True)
class _Call:
    """One sync call of a request, from ``submit`` until it has run."""

    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class RequestThread(Executor):
    """The executor a request's thread-sensitive calls go to.

    It leases a thread from the pool when the request's first sync call gets a running
    place (``running_gate``) and keeps it, so all of the request's sync code runs on one
    thread, as Django expects.
    The thread goes back to the pool when the request ends (``close``) or when
    its response starts streaming (``detach``), but never while a call is still
    running on it: a request cancelled mid-call returns its thread only once that
    call is over. After ``detach``, each call leases a thread while it runs.
    """

    def __init__(self, pool: RequestThreadPool) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None
        self._running = 0
        self._keep = True

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        call = _Call(Future(), fn, args, kwargs)
        with self._lock:
            self._running += 1
        # The call waits for a running place (``running_gate``) before it takes a thread.
        self._pool.gate.enter(functools.partial(self._start, call))
        return call.future

    def _start(self, call: _Call, place: Place | None) -> None:
        """Run the call on the request's thread, leased now if it has none."""
        thread = None
        try:
            with self._lock:
                if not call.future.cancelled():  # a call cancelled while it waited never runs
                    if self._thread is None:
                        self._thread = self._pool.acquire()
                    thread = self._thread
            if thread is not None:
                thread.submit(self._run, call, place)
                return
        except BaseException as exc:  # the pool is shutting down
            if call.future.set_running_or_notify_cancel():
                call.future.set_exception(exc)
        self._pool.gate.leave(place)
        self._call_done()

    def _run(self, call: _Call, place: Place | None) -> None:
        """On the request's thread: the call, then its stale connections closed or handed
        back, then its place and (if the request no longer keeps it) its thread given
        back, and only then its result, so nothing of the call runs once it is seen over."""
        error: BaseException | None = None
        result: Any = None
        started = False
        try:
            started = call.future.set_running_or_notify_cancel()
            if started:
                try:
                    result = call.fn(*call.args, **call.kwargs)
                finally:
                    close_old_connections()
        except BaseException as exc:
            error = exc
        finally:
            self._pool.gate.leave(place)
            self._call_done()
        if not started:
            return
        if error is not None:
            call.future.set_exception(error)
        else:
            call.future.set_result(result)

    def detach(self) -> None:
        """Stop keeping a thread between calls (the response is streaming)."""
        with self._lock:
            self._keep = False
            thread = self._take_idle_thread()
        if thread is not None:
            self._pool.release(thread)

    close = detach  # the request is over: the same hand-back, for good

    @property
    def leased(self) -> bool:
        return self._thread is not None

    def _call_done(self) -> None:
        with self._lock:
            self._running -= 1
            thread = None if self._keep else self._take_idle_thread()
        if thread is not None:
            self._pool.release(thread)

    def _take_idle_thread(self) -> ThreadPoolExecutor | None:
        if self._running or self._thread is None:
            return None
        thread, self._thread = self._thread, None
        return thread


_request_thread: contextvars.ContextVar[RequestThread] = contextvars.ContextVar(
    "omnigent_request_thread"
)


class PooledThreadsASGIHandler(ASGIHandler):
    """``ASGIHandler`` whose requests run their sync code on pooled threads."""

    def __init__(self, *, max_idle_threads: int, max_running_threads: int = 0) -> None:
        super().__init__()
        self.threads = RequestThreadPool(max_idle=max_idle_threads, max_running=max_running_threads)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = RequestThread(self.threads)
        token = _request_thread.set(executor)
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            _request_thread.reset(token)
            executor.close()

    def load_middleware(self, is_async: bool = False) -> None:
        """Django's chain from ``settings.MIDDLEWARE``, with the inline-hooks equivalent
        of each stock class (``middleware.py``).

        Django builds the chain from the setting, which names the stock classes so that
        its system checks see them; for the length of this call (once, when the handler
        is made) the setting reads the equivalents instead. The guard test checks that
        ``BaseHandler.load_middleware`` still takes the classes from the setting.
        """
        # Imported here: the middleware classes need the app registry, which is ready
        # only once the handler is made (``get_pooled_asgi_application``).
        from omnigent_site.runtime.middleware import with_inline_equivalents

        stock = settings.MIDDLEWARE
        settings.MIDDLEWARE = with_inline_equivalents(list(stock))
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = stock

    def create_request(
        self, scope: Mapping[str, Any], body_file: IO[bytes]
    ) -> tuple[ASGIRequest, None] | tuple[None, HttpResponseBase]:
        """Django's request, with ``CONTENT_LENGTH`` set to the body's size when the client
        sent none (a chunked body).

        The whole body is in ``body_file`` before the request is made, but Django's and
        DRF's parsers take its size from ``CONTENT_LENGTH`` only: without it they read
        nothing, and a chunked upload was a 400 "missing part" however small it was.
        """
        made = super().create_request(scope, body_file)
        request = made[0]
        if request is not None and not request.META.get("CONTENT_LENGTH"):
            size = body_file.seek(0, io.SEEK_END)
            body_file.seek(0)
            if size:
                request.META["CONTENT_LENGTH"] = str(size)
        return made

    async def send_response(self, response: HttpResponseBase, send: Any) -> None:
        if response.streaming:
            request_thread = _request_thread.get(None)
            if request_thread is not None:
                request_thread.detach()
        await super().send_response(response, send)


def get_pooled_asgi_application() -> PooledThreadsASGIHandler:
    """Like ``django.core.asgi.get_asgi_application``, with the pooled handler."""
    django.setup(set_prefix=False)
    handler = PooledThreadsASGIHandler(
        max_idle_threads=settings.OMNIGENT_REQUEST_THREADS_IDLE,
        max_running_threads=settings.OMNIGENT_REQUEST_THREADS_RUNNING,
    )
    use_request_gate(handler.threads.gate)
    return handler
