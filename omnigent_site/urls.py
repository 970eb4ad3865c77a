from django.contrib import admin
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularSwaggerView

from .api_docs import OfflineRedocView, SchemaView
from .api_root import ApiRootView
from .errors import not_found_view
from .health import health

urlpatterns = [
    # The API first: Django tries routes in order, and every route tried before the
    # match costs time on each request (pollers ask many times a second). The snapshot
    # and the message POST first of all (runners/session_urls.py), then the session
    # routes.
    path("v1/", include("runners.session_urls")),
    path("v1/", include("sessions.urls")),
    path("v1/", include("runners.urls")),
    path("v1/", include("workspaces.urls")),
    path("v1/", ApiRootView.as_view(), name="api-root"),
    path("v1/schema", SchemaView.as_view(), name="schema"),
    path("v1/docs", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("v1/redoc", OfflineRedocView.as_view(url_name="schema"), name="redoc"),
    # Unknown API routes answer in the error format even with DEBUG on, for every
    # method: CSRF-exempt like the API views, or a POST would get Django's HTML 403.
    re_path(r"^v1/", csrf_exempt(not_found_view)),
    # The web page (web/): sessions at "/", a session at "/s/<id>", runners, sign-in.
    path("", include("web.urls")),
    path("health", health, name="health"),
    path("admin/", admin.site.urls),
    path("api-auth/", include("rest_framework.urls")),
]

handler400 = "omnigent_site.errors.bad_request_view"
handler403 = "omnigent_site.errors.permission_denied_view"
handler404 = "omnigent_site.errors.not_found_view"
handler500 = "omnigent_site.errors.server_error_view"
