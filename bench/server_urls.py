"""Benchmark-only URLconf (``bench.server_settings``): two bench routes, then the project's."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, URLResolver, path

from omnigent_site import urls as site_urls


async def noop(request: HttpRequest) -> HttpResponse:
    """The floor: an async view that does nothing, through the production middleware."""
    return HttpResponse(b"ok", content_type="text/plain")


async def queries(request: HttpRequest) -> JsonResponse:
    """The SQL counters of ``bench.server_settings`` (no database access of its own)."""
    from bench import server_settings

    return JsonResponse(server_settings.snapshot())


urlpatterns: list[URLPattern | URLResolver] = [
    path("bench/noop", noop),
    path("bench/queries", queries),
]
urlpatterns += site_urls.urlpatterns  # type: ignore[arg-type]  # the module is untyped

handler400 = site_urls.handler400
handler403 = site_urls.handler403
handler404 = site_urls.handler404
handler500 = site_urls.handler500
