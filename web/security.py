"""The headers every page carries: a strict Content-Security-Policy and friends.

The pages run only the app's own script modules (``script-src 'self'``, no inline
script) and the app's own style sheet (no inline style), talk only to their own
origin, and may not be framed. Set per response here rather than site-wide, so the
admin, the browsable API and the Swagger page (which have inline scripts of their
own) keep working as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponseBase

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)

PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def with_page_headers(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        for name, value in PAGE_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    return wrapper
