"""ASGI HTTP requests, for tests that drive ``omnigent_site.asgi.application``."""

from __future__ import annotations

import asyncio
from typing import Any


def http_scope(
    path: str, *, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None
) -> dict[str, Any]:
    """The scope daphne would build for ``method path`` from 127.0.0.1 (host ``testserver``);
    ``path`` may carry a query string."""
    path, _, query = path.partition("?")
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"testserver"), *(headers or [])],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


async def asgi_request(
    application: Any,
    path: str,
    *,
    method: str = "GET",
    headers: list[tuple[bytes, bytes]] | None = None,
    body: bytes = b"",
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One complete request through ``application``: status, response headers, body."""
    sent: list[dict[str, Any]] = []
    incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    incoming.put_nowait({"type": "http.request", "body": body, "more_body": False})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    if body:
        headers = [*(headers or []), (b"content-length", str(len(body)).encode())]
    scope = http_scope(path, method=method, headers=headers)
    await asyncio.wait_for(application(scope, incoming.get, send), 30)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(start["status"]), list(start.get("headers") or []), content


async def asgi_get(
    application: Any, path: str, *, headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[int, bytes]:
    """One complete GET through ``application``; returns the status and the body."""
    status, _headers, body = await asgi_request(application, path, headers=headers)
    return status, body
