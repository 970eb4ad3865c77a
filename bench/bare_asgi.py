"""The floor below Django: an ASGI application that answers every request with ``ok``.

``bench/throughput.py`` serves it with daphne alone (no Django, no Channels) and times it
like ``/bench/noop``, so the floor table shows what the server itself costs per request
against what Django, the middleware and the request's thread add on top.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


async def application(scope: Message, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": b"ok"})
