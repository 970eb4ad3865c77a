"""``python -m omnigent_site.serve``: the documented way to start one server process.

A thin front for daphne's command line: ``--host``/``-b`` and ``--port``/``-p``
default to ``127.0.0.1`` and ``8000`` and become a Twisted endpoint with a listen backlog
of ``LISTEN_BACKLOG`` (daphne's own ``-b``/``-p`` listen with Twisted's 50, and a burst of
new connections beyond it lost SYNs that the clients resent a second later). Any other
argument goes to daphne unchanged (``WEBSOCKET_DEFAULTS`` fill in two WebSocket
timeouts not given), and the application is
``omnigent_site.asgi:application``. Before daphne is loaded it
picks the event loop daphne will create (``OMNIGENT_EVENT_LOOP``, uvloop by default:
``runtime/event_loop.py``), the one thing that cannot wait for the application.
Everything else the project
changes in daphne and Twisted (the tunnel's WebSocket frame limit, no form parsing
by Twisted, the garbage-collector freeze, the background tasks, the clean shutdown
of streams) is applied when that application is built
(``omnigent_site/runtime/server.py``), so a bare ``daphne
omnigent_site.asgi:application`` behaves the same.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from omnigent_site.runtime.event_loop import EventLoopChoiceError, install_event_loop

APPLICATION = "omnigent_site.asgi:application"
# daphne's defaults for WebSockets, replaced unless given: it closed every tunnel after
# 24 hours (``--websocket_timeout 86400``), and refused an upgrade its application had
# not accepted within 5 s with an HTTP 403, which the runner must take as a bad token
# (tunnel.md) and exit. Under a reconnect storm (10,000 runners after a restart, measured
# with ``bench/scale.py``) the tunnel's token check can take longer than that; past the
# runner's own 10 s open timeout the runner simply dials again.
WEBSOCKET_DEFAULTS = {"--websocket_timeout": "-1", "--websocket_connect_timeout": "60"}
# The accept queue asked for; the kernel caps it at its own limit (net.core.somaxconn).
LISTEN_BACKLOG = 2048
SOMAXCONN = Path("/proc/sys/net/core/somaxconn")


def listen_backlog() -> int:
    """``LISTEN_BACKLOG``, or the system's limit on an accept queue if that is lower."""
    try:
        system = int(SOMAXCONN.read_text().strip())
    except (OSError, ValueError):
        system = socket.SOMAXCONN
    return max(1, min(LISTEN_BACKLOG, system))


def tcp_endpoint(host: str, port: str) -> str:
    """Twisted's endpoint description for ``host:port`` (as daphne writes it for
    ``-b``/``-p``) with the listen backlog."""
    try:
        number = int(port)
    except ValueError:
        raise SystemExit(f"omnigent_site.serve: --port must be a number, not {port!r}") from None
    interface = host.strip("[]").replace(":", r"\:")
    return f"tcp:port={number}:interface={interface}:backlog={listen_backlog()}"


def daphne_argv(argv: list[str]) -> list[str]:
    host, port, rest = "127.0.0.1", "8000", []
    args = iter(argv)
    for arg in args:
        if arg in ("--host", "-b"):
            host = next(args)
        elif arg in ("--port", "-p"):
            port = next(args)
        else:
            rest.append(arg)
    given = {arg.split("=", 1)[0] for arg in rest}
    for option, value in WEBSOCKET_DEFAULTS.items():
        if option not in given:
            rest += [option, value]
    return ["-e", tcp_endpoint(host, port), *rest, APPLICATION]


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnigent_site.settings")
    try:
        install_event_loop(os.environ.get("OMNIGENT_EVENT_LOOP", ""))
    except EventLoopChoiceError as exc:
        raise SystemExit(f"omnigent_site.serve: {exc}") from None
    from daphne.cli import CommandLineInterface

    CommandLineInterface().run(daphne_argv(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
