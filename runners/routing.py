from django.urls import path

from .consumers import TunnelConsumer

websocket_urlpatterns = [
    path("v1/runners/<str:runner_id>/tunnel", TunnelConsumer.as_asgi()),
]
