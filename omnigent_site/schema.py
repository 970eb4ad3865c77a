"""drf-spectacular descriptions of the project's own authentication classes."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ForwardedHeaderScheme(OpenApiAuthenticationExtension):
    target_class = "omnigent_site.authentication.ForwardedHeaderAuthentication"
    name = "forwardedHeader"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": settings.OMNIGENT_AUTH_HEADER or "X-Forwarded-Email",
            "description": "The user's identity, set by an authenticating proxy.",
        }


class LocalSingleUserScheme(OpenApiAuthenticationExtension):
    target_class = "omnigent_site.authentication.LocalSingleUserAuthentication"
    name = "localSingleUser"
    optional = True

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "none",
            "description": "Local single-user mode: requests without identity act as 'local'.",
        }
