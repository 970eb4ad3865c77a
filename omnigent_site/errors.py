"""One error format for every 4xx/5xx: ``{"error": {"code", "message"}}`` (http-api.md).

The shape is ``omnigent_site.shapes.ErrorBody``; every error body is built by
``error_body`` so that the shape the schema documents is the one rendered, and
``error_body`` escapes text UTF-8 cannot encode, so an error about bad input can always
be rendered. ``ErrorFormatMiddleware`` turns Django's own error pages on API paths
(the DEBUG traceback and 404 pages) into the same format.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import DataError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponseBase
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import set_rollback

from . import metrics
from .domain_errors import DomainError, PayloadTooLarge
from .renderers import JSONResponse
from .shapes import ErrorBody, ErrorDetail

log = logging.getLogger(__name__)

try:  # redis-py is installed with the server; the embedded mode never raises its errors
    from redis.exceptions import ConnectionError as _RedisConnectionError
    from redis.exceptions import TimeoutError as _RedisTimeoutError

    _redis_errors: tuple[type[BaseException], ...] = (_RedisConnectionError, _RedisTimeoutError)
except ImportError:  # pragma: no cover
    _redis_errors = ()


_CODES: dict[int, str] = {
    400: "invalid_input",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    500: "internal_error",
    507: "insufficient_storage",
    503: "runner_unavailable",
}


def error_body(
    status_code: int, message: str, *, code: str | None = None, fields: Any = None
) -> ErrorBody:
    """The error format; ``code`` defaults to the status code's, ``fields`` is optional."""
    if code is None:
        code = _CODES.get(status_code, "internal_error" if status_code >= 500 else "invalid_input")
    detail: ErrorDetail = {"code": code, "message": renderable(message)}
    if fields is not None:
        detail["fields"] = renderable(fields)
    return {"error": detail}


def renderable(value: Any) -> Any:
    """``value`` with text UTF-8 cannot encode (lone surrogates) escaped as ``\\udxxx``.

    An error that names the bad input (a label key, an unknown field) must not carry
    that input raw: the renderer could not encode it and the 400 became a 500.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {renderable(key): renderable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [renderable(item) for item in value]
    return value


def _first_message(detail: Any, path: str = "") -> str:
    """The first human message of a (nested) DRF validation detail, prefixed by its field."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            prefix = path if key == "non_field_errors" else (f"{path}.{key}" if path else str(key))
            return _first_message(value, prefix)
        return "invalid input"
    if isinstance(detail, list):
        for index, value in enumerate(detail):
            if isinstance(value, (dict, list)) and path:
                return _first_message(value, f"{path}[{index}]")
            return _first_message(value, path)
        return "invalid input"
    return f"{path}: {detail}" if path else str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    if isinstance(exc, DomainError):
        set_rollback()
        retry_after = getattr(exc, "retry_after", None)
        return Response(
            error_body(
                exc.http_status,
                exc.public_message,
                code=exc.code,
                fields=exc.fields or ({exc.field: [exc.message]} if exc.field else None),
            ),
            status=exc.http_status,
            headers={"Retry-After": str(int(retry_after))} if retry_after is not None else None,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    elif isinstance(exc, RequestDataTooBig):
        return exception_handler(PayloadTooLarge("the request body is too large"), context)
    elif isinstance(exc, SuspiciousOperation):
        exc = exceptions.ParseError(str(exc))
    elif isinstance(exc, DataError):
        # The database refused a value taken from the request (PostgreSQL: a NUL
        # character in a path, query or header): bad input, not a server error.
        first_line = (str(exc).strip().splitlines() or ["invalid value"])[0]
        exc = exceptions.ValidationError(f"the input cannot be stored or searched: {first_line}")

    if storage_full(exc):
        log.warning("storage full: %s", exc.__class__.__name__)
        set_rollback()
        return Response(
            error_body(507, STORAGE_FULL_MESSAGE, code="insufficient_storage"), status=507
        )
    outage = backend_outage(exc)
    if outage is not None:
        backend, message = outage
        log.warning("%s: %s", message, exc.__class__.__name__)
        metrics.backend_error(backend)
        set_rollback()
        return Response(
            error_body(503, message, code="service_unavailable"),
            status=503,
            headers={"Retry-After": str(OUTAGE_RETRY_AFTER_S)},
        )
    if not isinstance(exc, exceptions.APIException):
        log.exception("unhandled error in %s", context.get("view").__class__.__name__)
        set_rollback()
        return Response(error_body(500, "internal server error"), status=500)

    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]

    fields = None
    if isinstance(exc, exceptions.ValidationError):
        message = _first_message(exc.detail)
        if isinstance(exc.detail, dict):
            fields = exc.detail
    elif isinstance(exc, exceptions.ParseError):
        message = str(exc.detail)
    else:
        message = str(exc.detail)

    status_code = exc.status_code
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        # DRF answers 403 when no authenticator names a scheme; our clients expect 401.
        status_code = 401
    set_rollback()
    return Response(
        error_body(status_code, message, fields=fields), status=status_code, headers=headers
    )


# What a client is told to wait when the database or Redis is down (operations.md:
# they come back within seconds in the accidents the deployment is tested against).
OUTAGE_RETRY_AFTER_S = 5


STORAGE_FULL_MESSAGE = "the server's storage is full: nothing was stored; try again later"


def storage_full(exc: BaseException) -> bool:
    """``exc`` (or what caused it) says the data directory's disk or quota is full."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def backend_outage(exc: BaseException) -> tuple[str, str] | None:
    """``(backend, message)`` when ``exc`` says the database or Redis cannot be reached
    (503 ``service_unavailable`` rather than 500), else None."""
    if isinstance(exc, OperationalError | InterfaceError):
        return "database", "the database is unavailable; try again shortly"
    if _redis_errors and isinstance(exc, _redis_errors):
        return "redis", "Redis is unavailable; try again shortly"
    return None


def json_error(status_code: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status_code, message), status=status_code)


def not_found_view(request: HttpRequest, exception: Exception | None = None) -> JSONResponse:
    return json_error(404, f"no route for {request.path}")


def server_error_view(request: HttpRequest) -> JSONResponse:
    return json_error(500, "internal server error")


def bad_request_view(request: HttpRequest, exception: Exception | None = None) -> JSONResponse:
    if isinstance(exception, RequestDataTooBig):
        return json_error(413, "the request body is too large")
    return json_error(400, "bad request")


def permission_denied_view(
    request: HttpRequest, exception: Exception | None = None
) -> JSONResponse:
    return json_error(403, str(exception) or "forbidden")


def is_api_path(path: str) -> bool:
    return path.startswith("/v1/") or path in ("/health", "/metrics")


class ErrorFormatMiddleware:
    """Django's own error pages on API paths become the error format (http-api.md).

    DRF views render every error through :func:`exception_handler`, and Django's error
    handlers above answer in the format when DEBUG is off. With DEBUG on, Django answers
    an exception that escapes a view (a non-DRF view, a response that fails to render,
    a middleware) with its HTML traceback page instead of ``handler500``, and a 404
    outside DRF with its HTML 404 page; an API client must get the error format in every
    mode. ``process_exception`` answers the first two before the page is built (and
    logs the traceback); outermost in ``MIDDLEWARE``, ``format`` replaces any other page
    Django built further in. DRF responses (the browsable API's HTML pages included) and
    JSON responses pass untouched.
    """

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
        return self.format(request, self.get_response(request))

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        response: Awaitable[HttpResponseBase] = self.get_response(request)
        return self.format(request, await response)

    def process_exception(self, request: HttpRequest, exception: Exception) -> JSONResponse | None:
        """With DEBUG on, an exception from a view or from rendering its response is
        answered here: Django's traceback page would be HTML, and it cannot even be built
        when the exception's text holds a lone surrogate. With DEBUG off, Django's
        ``handler500`` answers (``server_error_view``), after its own logging."""
        if storage_full(exception) and is_api_path(request.path):
            log.warning("storage full: %s", exception.__class__.__name__)
            return json_error(507, STORAGE_FULL_MESSAGE)
        outage = backend_outage(exception)
        if outage is not None and is_api_path(request.path):
            backend, message = outage
            log.warning("%s: %s", message, exception.__class__.__name__)
            metrics.backend_error(backend)
            response = JSONResponse(
                error_body(503, message, code="service_unavailable"), status=503
            )
            response["Retry-After"] = str(OUTAGE_RETRY_AFTER_S)
            return response
        if not settings.DEBUG or not is_api_path(request.path):
            return None
        log.error("unhandled error on %s", request.path, exc_info=exception)
        return json_error(500, "internal server error")

    @staticmethod
    def format(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if (
            response.status_code < 400
            or response.streaming
            or isinstance(response, Response | JSONResponse)
            or response.get("Content-Type", "").startswith("application/json")
            or not is_api_path(request.path)
        ):
            return response
        status_code = response.status_code
        message = "internal server error" if status_code >= 500 else response.reason_phrase.lower()
        return json_error(status_code, message)
