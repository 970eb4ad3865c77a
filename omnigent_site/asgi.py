"""ASGI entry point: HTTP goes to Django, WebSocket to the runner tunnel consumer."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnigent_site.settings")

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from omnigent_site.handler import get_pooled_asgi_application  # noqa: E402

# daphne serves no files. The admin's, the browsable API's and the schema page's few
# assets are served from the apps by Django's async static handler; a sync-only
# static middleware would force every async view (events, stream) onto a thread.
django_asgi_app = ASGIStaticFilesHandler(get_pooled_asgi_application())

from omnigent_site.flow import WriteWatchMiddleware  # noqa: E402
from runners.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": WriteWatchMiddleware(django_asgi_app),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
