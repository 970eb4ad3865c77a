"""``GET /health``: 200 when the database and the channel layer answer, 503 otherwise."""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest

from .renderers import JSONResponse

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 3.0


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except Exception:
        log.warning("health: database check failed", exc_info=True)
        return False


async def _channel_layer_ok() -> bool:
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "health.check"})
        message = await layer.receive(channel)
        return message.get("type") == "health.check"
    except Exception:
        log.warning("health: channel layer check failed", exc_info=True)
        return False


async def health(request: HttpRequest) -> JSONResponse:
    try:
        database, layer = await asyncio.wait_for(
            asyncio.gather(sync_to_async(_database_ok)(), _channel_layer_ok()),
            timeout=CHECK_TIMEOUT_S,
        )
    except TimeoutError:
        database, layer = False, False
    ok = database and layer
    body = {
        "status": "ok" if ok else "degraded",
        "database": "ok" if database else "unavailable",
        "channel_layer": "ok" if layer else "unavailable",
    }
    return JSONResponse(body, status=200 if ok else 503)
