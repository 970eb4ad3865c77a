"""``python -m omnigent_site.serve``: daphne with this project's limits.

Daphne refuses WebSocket messages over 1 MiB by default, which would cut a
runner's tunnel on the first large frame (a bundle, a long answer) and make it
reconnect forever. This entry point starts daphne with the tunnel's frame limit
(``OMNIGENT_MAX_FRAME_BYTES``, 16 MiB by default) and the project's ASGI app;
any other daphne option can be appended.
"""

from __future__ import annotations

import functools
import os
import sys


def daphne_argv(argv: list[str]) -> list[str]:
    limit = os.environ.get("OMNIGENT_MAX_FRAME_BYTES", str(16 * 1024 * 1024)).strip()
    host, port, rest = "127.0.0.1", "8000", []
    args = iter(argv)
    for arg in args:
        if arg in ("--host", "-b"):
            host = next(args)
        elif arg in ("--port", "-p"):
            port = next(args)
        else:
            rest.append(arg)
    return [
        "-b",
        host,
        "-p",
        port,
        "--websocket-max-message-size",
        limit,
        "--websocket-max-frame-size",
        limit,
        *rest,
        "omnigent_site.asgi:application",
    ]


def cache_content_type_parsing() -> bool:
    """Remember Twisted's parse of each Content-Type header value.

    Twisted's HTTP server parses the Content-Type of every POST through the
    ``email`` package before daphne sees the request (to find form bodies, which
    daphne does not use): about 0.3 ms per request here, a tenth of the relay's
    whole server-side time. The parse is a pure function of a header value, and
    clients send few distinct ones, so a bounded cache of its answers changes
    nothing but the cost. Returns False, changing nothing, if Twisted no longer
    has the function.
    """
    from twisted.web import http

    parse = getattr(http, "_parseContentType", None)
    if parse is None or hasattr(parse, "cache_info"):
        return parse is not None
    http._parseContentType = functools.lru_cache(maxsize=256)(parse)
    return True


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnigent_site.settings")
    from daphne.cli import CommandLineInterface

    cache_content_type_parsing()
    CommandLineInterface().run(daphne_argv(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
