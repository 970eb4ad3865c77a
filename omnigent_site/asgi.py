"""ASGI entry point: HTTP goes to Django, WebSocket to the runner tunnel consumer.

Serve it with ``python -m omnigent_site.serve`` or a bare ``daphne
omnigent_site.asgi:application``: building the application here applies the
project's server runtime (``omnigent_site/runtime/server.py``), so both behave the
same.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnigent_site.settings")

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from omnigent_site.runtime.handler import get_pooled_asgi_application  # noqa: E402

# daphne serves no files. The admin's, the browsable API's and the schema page's few
# assets are served from the apps by Django's async static handler; a sync-only
# static middleware would force every async view (events, stream) onto a thread.
django_asgi_app = ASGIStaticFilesHandler(get_pooled_asgi_application())

from omnigent_site.runtime.server import server_application  # noqa: E402
from runners.routing import websocket_urlpatterns  # noqa: E402

application = server_application(
    ProtocolTypeRouter(
        {
            "http": django_asgi_app,
            "websocket": URLRouter(websocket_urlpatterns),
        }
    )
)
