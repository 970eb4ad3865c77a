"""API URLs that are not UTF-8 are refused before any view sees them (``utf8_input``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from .errors import is_api_path, json_error
from .utf8_input import url_problem


class Utf8UrlMiddleware:
    """An API request whose path or query string does not decode to UTF-8 is a 400
    in the error format before any view sees it (Django would hand the view ``U+FFFD``)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def refusal(self, request: HttpRequest) -> HttpResponseBase | None:
        if not is_api_path(request.path):
            return None
        problem = url_problem(request)
        return json_error(400, problem) if problem else None

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        return self.refusal(request) or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        response: Awaitable[HttpResponseBase] = self.get_response(request)
        return await response
