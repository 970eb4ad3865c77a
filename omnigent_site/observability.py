"""Request ids, log context and request metrics (operations.md, "Metrics and logs").

``RequestObservationMiddleware`` (outermost in ``MIDDLEWARE``) gives every request an
id: the client's ``X-Request-ID`` when it is a plain token of up to 128 characters,
else a new one. The id is returned in the response's ``X-Request-ID``, kept in a
context variable for the request's task (and the threads its sync code runs on, which
copy the context), and handed to the runner with the turn a message starts
(``turn.start``'s ``request_id``), so the runner's log lines for that turn carry it.
The middleware also counts the request and its latency by route pattern and status
(``omnigent_site/metrics.py``).

``LogContextFilter`` puts ``request_id``, ``user``, ``session_id`` and ``runner_id``
on every log record when they are known; ``JSON_FORMATTER`` renders one JSON object
per line with ``OMNIGENT_LOG_FORMAT=json`` (settings.py wires both to the root handler).
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from pythonjsonlogger.json import JsonFormatter

from . import metrics

REQUEST_ID_HEADER = "X-Request-ID"
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@+=-]{1,128}")

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "omnigent_request_id", default=None
)
_request_var: contextvars.ContextVar[HttpRequest | None] = contextvars.ContextVar(
    "omnigent_request", default=None
)
session_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "omnigent_log_session_id", default=None
)
runner_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "omnigent_log_runner_id", default=None
)


def current_request_id() -> str | None:
    """The id of the request this code runs for, if any."""
    return request_id_var.get()


def request_id_for(raw: str | None) -> str:
    """The client's id when it is a plain token (never echoed otherwise), else a new one."""
    if raw and _CLIENT_REQUEST_ID.fullmatch(raw):
        return raw
    return uuid.uuid4().hex


def _user_name(request: HttpRequest | None) -> str | None:
    """The request's user if authentication already found it (never triggers it)."""
    if request is None:
        return None
    user = vars(request).get("user")
    if user is None:
        return None
    wrapped = getattr(user, "_wrapped", user)  # a lazy user not evaluated yet: unknown
    if wrapped is None or type(wrapped).__name__ == "object":
        return None
    if not getattr(wrapped, "is_authenticated", False):
        return None
    return str(getattr(wrapped, "username", "")) or None


class LogContextFilter(logging.Filter):
    """Adds what is known of the current request and tunnel to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, var in (
            ("request_id", request_id_var),
            ("session_id", session_id_var),
            ("runner_id", runner_id_var),
        ):
            if getattr(record, key, None) is None:
                value = var.get()
                if value is not None:
                    setattr(record, key, value)
        if getattr(record, "user", None) is None:
            user = _user_name(_request_var.get())
            if user is not None:
                record.user = user
        return True


class JsonLogFormatter(JsonFormatter):
    """``{"timestamp", "level", "logger", "message", …}`` per line; the context keys
    when known, and ``exc_info`` with a traceback."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("rename_fields", {"levelname": "level", "name": "logger"})
        kwargs.setdefault("timestamp", True)
        super().__init__("%(levelname)s %(name)s %(message)s", *args, **kwargs)


def route_of(request: HttpRequest) -> str:
    """The URL pattern the request matched (bounded label values), or ``unmatched``."""
    match = getattr(request, "resolver_match", None)
    route = getattr(match, "route", None) if match is not None else None
    return f"/{route}" if route else metrics.UNMATCHED_ROUTE


class RequestObservationMiddleware:
    """Request id in and out, log context, and the request's metrics."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        # A sync server reuses its threads: the context is put back after the request.
        tokens = self._begin(request)
        started = time.perf_counter()
        try:
            response = self.get_response(request)
            return self._finish(request, response, started)
        finally:
            for var, token in tokens:
                var.reset(token)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        # Each ASGI request runs in a task of its own, whose context ends with it; the
        # values stay set while a streaming body is sent after this returns.
        self._begin(request)
        started = time.perf_counter()
        response: Awaitable[HttpResponseBase] = self.get_response(request)
        return self._finish(request, await response, started)

    @staticmethod
    def _begin(request: HttpRequest) -> list[tuple[contextvars.ContextVar[Any], Any]]:
        request_id = request_id_for(request.headers.get(REQUEST_ID_HEADER))
        request.request_id = request_id  # type: ignore[attr-defined]
        return [
            (request_id_var, request_id_var.set(request_id)),
            (_request_var, _request_var.set(request)),
            (session_id_var, session_id_var.set(None)),
            (runner_id_var, runner_id_var.set(None)),
        ]

    async def process_view(
        self, request: HttpRequest, view: Any, args: Any, kwargs: dict[str, Any]
    ) -> None:
        # A coroutine, so Django calls it without a thread hop (and the values it sets
        # stay in the request's context).
        session_id = kwargs.get("session_id")
        if isinstance(session_id, str):
            session_id_var.set(session_id)
        runner_id = kwargs.get("runner_id")
        if isinstance(runner_id, str):
            runner_id_var.set(runner_id)

    @staticmethod
    def _finish(
        request: HttpRequest, response: HttpResponseBase, started: float
    ) -> HttpResponseBase:
        response[REQUEST_ID_HEADER] = getattr(request, "request_id", "")
        metrics.request_answered(
            route=route_of(request),
            method=request.method or "",
            status=response.status_code,
            seconds=time.perf_counter() - started,
        )
        return response
