"""One error format for every 4xx/5xx: ``{"error": {"code", "message"}}`` (http-api.md).

The shape is ``omnigent_site.shapes.ErrorBody``; every error body is built by
``error_body`` so that the shape the schema documents is the one rendered.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import DataError
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import set_rollback

from .domain_errors import DomainError, PayloadTooLarge
from .shapes import ErrorBody, ErrorDetail

log = logging.getLogger(__name__)


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
    503: "runner_unavailable",
}


def error_body(
    status_code: int, message: str, *, code: str | None = None, fields: Any = None
) -> ErrorBody:
    """The error format; ``code`` defaults to the status code's, ``fields`` is optional."""
    if code is None:
        code = _CODES.get(status_code, "internal_error" if status_code >= 500 else "invalid_input")
    detail: ErrorDetail = {"code": code, "message": message}
    if fields is not None:
        detail["fields"] = fields
    return {"error": detail}


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
        return Response(
            error_body(
                exc.http_status,
                exc.public_message,
                code=exc.code,
                fields={exc.field: [exc.message]} if exc.field else None,
            ),
            status=exc.http_status,
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


def json_error(status_code: int, message: str) -> JsonResponse:
    return JsonResponse(error_body(status_code, message), status=status_code)


def not_found_view(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return json_error(404, f"no route for {request.path}")


def server_error_view(request: HttpRequest) -> JsonResponse:
    return json_error(500, "internal server error")


def bad_request_view(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    if isinstance(exception, RequestDataTooBig):
        return json_error(413, "the request body is too large")
    return json_error(400, "bad request")


def permission_denied_view(
    request: HttpRequest, exception: Exception | None = None
) -> JsonResponse:
    return json_error(403, str(exception) or "forbidden")
