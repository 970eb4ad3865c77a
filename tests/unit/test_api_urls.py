"""Every ``/v1`` route is in ``api/urls.py`` and its view is defined in the ``api`` package.

One URLconf in route order is where a newcomer finds an endpoint; a route added in an
app's own ``urls.py``, or a view left in an app below ``api``, would split it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.http import HttpResponse
from django.urls import URLPattern, URLResolver, get_resolver, path, resolve
from django.urls.exceptions import Resolver404


def _routes(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, Callable[..., Any]]]:
    """Each route of a URLconf as (its full pattern, its view), in the order tried."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route, pattern.callback


def _defined_in(view: Callable[..., Any]) -> str:
    """The module that defines a view: a class-based view's class, else the function."""
    cls = getattr(view, "view_class", None) or getattr(view, "cls", None)
    return str((cls or view).__module__)


def _foreign_api_views(patterns: list[Any]) -> list[str]:
    return [
        f"{route} -> {_defined_in(view)}"
        for route, view in _routes(patterns)
        if route.lstrip("^").startswith("v1/") and not _defined_in(view).startswith("api.")
    ]


def test_every_v1_view_is_defined_in_the_api_package() -> None:
    routes = [route for route, _ in _routes(get_resolver().url_patterns)]
    assert sum(route.startswith("v1/") for route in routes) > 30
    assert _foreign_api_views(get_resolver().url_patterns) == []


def test_every_v1_route_is_in_api_urls() -> None:
    """The project's URLconf has one ``/v1`` entry: the include of ``api.urls``."""
    v1 = [p for p in get_resolver().url_patterns if str(p.pattern).lstrip("^").startswith("v1")]
    assert len(v1) == 1
    assert isinstance(v1[0], URLResolver)
    assert v1[0].urlconf_module.__name__ == "api.urls"


def _elsewhere(request: Any) -> HttpResponse:
    return HttpResponse()


def test_the_check_finds_a_view_defined_elsewhere() -> None:
    patterns = [path("v1/", ([path("things", _elsewhere)], "x", "x")), path("other", _elsewhere)]
    assert _foreign_api_views(patterns) == [f"v1/things -> {__name__}"]


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("/v1/sessions/updates", "session-updates"),
        ("/v1/sessions/s1", "session-detail"),
        ("/v1/sessions/s1/resources/environments/default/filesystem/a/b", "workspace-path"),
        ("/v1/sessions/s1/resources/environments/default/diff/a/b", "session-diff"),
        ("/v1/", "api-root"),
    ],
)
def test_routes_resolve_in_order(url: str, name: str) -> None:
    """``sessions/updates`` is tried before ``sessions/<id>`` would take it for an id."""
    assert resolve(url).url_name == name


def test_an_unknown_v1_route_reaches_the_api_fallback() -> None:
    match = resolve("/v1/no/such/thing")
    assert _defined_in(match.func) == "api.api_root"
    with pytest.raises(Resolver404):
        resolve("/no/such/thing")
