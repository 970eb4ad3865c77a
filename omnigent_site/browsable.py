"""The browsable API as a person uses it: upload forms, and links between endpoints.

DRF builds the browsable API's HTML form from a view's serializer; the project's views
validate input without a DRF serializer attribute (so the schema is not inferred from
one), which left only the raw-JSON form: no way to attach a bundle file. A view names
the form it wants in ``browsable_form`` (a serializer class, used for the page only),
and may add links to the page's description with ``browsable_links``.
"""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from rest_framework.renderers import BrowsableAPIRenderer
from rest_framework.request import Request


class FormsBrowsableAPIRenderer(BrowsableAPIRenderer):
    """``BrowsableAPIRenderer`` that renders a view's ``browsable_form`` for POST."""

    def get_rendered_html_form(self, data: Any, view: Any, method: str, request: Request) -> Any:
        form_class = getattr(view, "browsable_form", None)
        if form_class is None or method != "POST":
            return super().get_rendered_html_form(data, view, method, request)
        if method not in view.allowed_methods:
            return None
        if not self.show_form_for_method(view, method, request, None):
            return None
        return self.render_form_for_serializer(form_class(context={"request": request}))

    def get_description(self, view: Any, status_code: int) -> str:
        description = super().get_description(view, status_code)
        links = getattr(view, "browsable_links", None)
        if links is None or status_code >= 400:
            return description
        rows = format_html_join("", '<li><a href="{}">{}</a></li>', links())
        return format_html("{}<p>Related:</p><ul>{}</ul>", description, rows)
