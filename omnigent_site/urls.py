from django.contrib import admin
from django.urls import include, path

from .health import health
from .metrics_view import metrics_view

urlpatterns = [
    # The API first (api/urls.py: every /v1 route, in the order they are tried, and
    # the /v1 404), since every route tried before the match costs time on each request.
    path("v1/", include("api.urls")),
    # The web page (web/): sessions at "/", a session at "/s/<id>", runners, sign-in.
    path("", include("web.urls")),
    path("health", health, name="health"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("api-auth/", include("rest_framework.urls")),
]

handler400 = "omnigent_site.errors.bad_request_view"
handler403 = "omnigent_site.errors.permission_denied_view"
handler404 = "omnigent_site.errors.not_found_view"
handler500 = "omnigent_site.errors.server_error_view"
