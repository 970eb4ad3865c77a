"""The API's documents: the schema (``/v1/schema``) and its Redoc page (``/v1/redoc``).

The schema's JSON ends with a newline, as every JSON answer does
(``omnigent_site/renderers.py``); its YAML does already.

The Redoc page is served with no request to another host.

drf-spectacular's template links Google Fonts, and Redoc's bundle draws the Redocly
logo from Redocly's CDN (it has no option to leave it out). The project's template
(``templates/omnigent_site/redoc.html``) drops the font links, and the page's
Content-Security-Policy lets the browser load only from the server itself, so the
logo is never fetched (Redoc hides an image that fails). Inline styles stay allowed:
Redoc styles its components that way.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.renderers import (
    OpenApiJsonRenderer,
    OpenApiJsonRenderer2,
    OpenApiYamlRenderer,
    OpenApiYamlRenderer2,
)
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerView,
)
from rest_framework.request import Request
from rest_framework.response import Response

from omnigent_site.renderers import FinalNewlineMixin

REDOC_CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "img-src 'self' data:",
        "style-src 'self' 'unsafe-inline'",
        "font-src 'self' data:",
        "worker-src 'self' blob:",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class SchemaJSONRenderer(FinalNewlineMixin, OpenApiJsonRenderer):
    pass


class SchemaPlainJSONRenderer(FinalNewlineMixin, OpenApiJsonRenderer2):
    pass


class SchemaView(SpectacularAPIView):
    renderer_classes = [
        OpenApiYamlRenderer,
        OpenApiYamlRenderer2,
        SchemaJSONRenderer,
        SchemaPlainJSONRenderer,
    ]


class SwaggerView(SpectacularSwaggerView):
    """Swagger UI (``/v1/docs``) as drf-spectacular serves it; named here so that every
    ``/v1`` view is this package's."""


class OfflineRedocView(SpectacularRedocView):
    template_name = "omnigent_site/redoc.html"

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        response.headers.setdefault("Content-Security-Policy", REDOC_CONTENT_SECURITY_POLICY)
        return response
