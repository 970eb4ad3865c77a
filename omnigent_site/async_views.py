"""The base and helpers of the async DRF views (``adrf``).

Every async view derives from :class:`AsyncAPIView`. adrf's ``check_throttles``
checks the async throttles through ``async_to_sync`` even when there are none: from
the request's thread back to the event loop and back, holding the thread (and its
running place, ``runtime.running_gate``) while the loop gets round to it. The
project's throttles are all sync, so the base checks them as DRF's own
``APIView.check_throttles`` does, on the thread, and leaves any async throttle to
adrf. It removes a wait rather than CPU (``docs/performance.md``, overrides).

Django renders a DRF ``Response`` (a ``SimpleTemplateResponse``) after the view
returns, and for an async view it does so through ``sync_to_async``: a trip to
the request's thread for every response, on the way out of the relay's hot
path. JSON, which is what API clients accept, is rendered on the event loop
instead; any other renderer (the browsable API's HTML page, which may read the
database) keeps DRF's ``Response`` and its thread.
"""

from __future__ import annotations

from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import Any

from adrf.views import APIView as AdrfAPIView
from django.http import HttpResponse, HttpResponseBase
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .renderers import JSONRenderer


class AsyncAPIView(AdrfAPIView):
    """adrf's async ``APIView``, with sync throttles checked without a loop trip (the
    throttles are those of ``throttle_classes``, as DRF's ``get_throttles`` makes them)."""

    def check_throttles(self, request: Request) -> None:
        if any(iscoroutinefunction(throttle.allow_request) for throttle in self.throttle_classes):
            super().check_throttles(request)
        else:
            APIView.check_throttles(self, request)


class RenderJSONOnLoopMixin:
    """For async views: ``self.render_now(data, status=...)`` instead of ``Response``."""

    # Provided by DRF's APIView.
    request: Request
    get_renderer_context: Callable[[], dict[str, Any]]

    def render_now(self, data: Any, *, status: int) -> HttpResponseBase:
        renderer = getattr(self.request, "accepted_renderer", None)
        if not isinstance(renderer, JSONRenderer):
            return Response(data, status=status)
        content = renderer.render(
            data, self.request.accepted_media_type, self.get_renderer_context()
        )
        return HttpResponse(content, status=status, content_type=renderer.media_type)
