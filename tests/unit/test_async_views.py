"""``omnigent_site.async_views.AsyncAPIView`` (adrf's ``APIView``): sync and async throttles."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import RequestFactory
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


async def _get(throttles: list[type[BaseThrottle]]) -> Response:
    view = _View.as_view(throttle_classes=throttles)
    response: Response = await view(RequestFactory().get("/"))
    return response


@pytest.mark.timeout(30)
async def test_a_sync_throttle_refuses_with_its_wait() -> None:
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
