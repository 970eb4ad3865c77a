"""``omnigent_site.async_views.AsyncAPIView``: throttles without a trip to the event loop."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest
from adrf import views as adrf_views
from django.test import RequestFactory
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from omnigent_site.async_views import AsyncAPIView


class _Allow(BaseThrottle):
    def allow_request(self, request: Request, view: Any) -> bool:
        return True


class _Refuse(BaseThrottle):
    def allow_request(self, request: Request, view: Any) -> bool:
        return False

    def wait(self) -> float:
        return 7.0


class _AsyncRefuse(BaseThrottle):
    async def allow_request(self, request: Request, view: Any) -> bool:  # type: ignore[override]
        return False

    def wait(self) -> float:
        return 3.0


class _View(AsyncAPIView):
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    async def get(self, request: Request) -> Response:
        return Response({"ok": True})


def _no_loop_trip(*args: Any, **kwargs: Any) -> NoReturn:
    raise AssertionError("a sync throttle was checked through async_to_sync")


async def _get(throttles: list[type[BaseThrottle]]) -> Response:
    view = _View.as_view(throttle_classes=throttles)
    response: Response = await view(RequestFactory().get("/"))
    return response


@pytest.mark.timeout(30)
async def test_sync_throttles_are_checked_on_the_thread_without_a_loop_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(adrf_views, "async_to_sync", _no_loop_trip)
    assert (await _get([_Allow])).status_code == 200
    refused = await _get([_Allow, _Refuse])
    assert refused.status_code == 429
    assert refused["Retry-After"] == "7"


@pytest.mark.timeout(30)
async def test_an_async_throttle_is_still_checked_as_adrf_does() -> None:
    refused = await _get([_Allow, _AsyncRefuse])
    assert refused.status_code == 429
    assert refused["Retry-After"] == "3"
    assert (await _get([_Allow])).status_code == 200


def _views(patterns: list[Any]) -> list[type]:
    found: list[type] = []
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            found += _views(pattern.url_patterns)
        elif isinstance(pattern, URLPattern) and hasattr(pattern.callback, "cls"):
            found.append(pattern.callback.cls)
    return found


def test_every_async_api_view_derives_from_the_project_base() -> None:
    views = _views(get_resolver().url_patterns)
    async_views = [view for view in views if issubclass(view, adrf_views.APIView)]
    assert async_views, "no async view found in the URLconf"
    assert [view for view in async_views if not issubclass(view, AsyncAPIView)] == []
