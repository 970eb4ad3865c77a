"""``GET /v1/``: the API's entry points as links, and ``/`` sends a browser there.

The browsable API renders this as a page of links, so a person who opens the server in
a browser has somewhere to start (http-api.md lists the endpoints).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from omnigent_site.errors import not_found_view

ENTRY_POINTS = {
    "me": "me",
    "sessions": "session-list",
    "agents": "agent-list",
    "runners": "runner-list",
    "schema": "schema",
    "docs": "docs",
}


class ApiRootView(APIView):
    """Links to the collections and the schema; nothing here needs a login."""

    permission_classes = [AllowAny]

    @extend_schema(
        responses=inline_serializer(
            "ApiRoot", {name: serializers.URLField() for name in ENTRY_POINTS}
        )
    )
    def get(self, request: Request) -> Response:
        return Response(
            {name: reverse(url_name, request=request) for name, url_name in ENTRY_POINTS.items()}
        )


@csrf_exempt
def unknown_route(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
    """The ``/v1`` fallback: unknown API routes answer in the error format even with
    DEBUG on, for every method (CSRF-exempt like the API views, or a POST would get
    Django's HTML 403)."""
    return not_found_view(request)
