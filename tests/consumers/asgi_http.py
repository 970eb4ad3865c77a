"""An HTTP request's ASGI scope, for tests that drive ``omnigent_site.asgi.application``."""

from __future__ import annotations

from typing import Any


def http_scope(
    path: str, *, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None
) -> dict[str, Any]:
    """The scope daphne would build for ``method path`` from 127.0.0.1 (host ``testserver``)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *(headers or [])],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
