"""``python -m omnigent_site.serve``: the documented way to start one server process.

A thin front for daphne's command line: ``--host``/``-b`` and ``--port``/``-p``
default to ``127.0.0.1`` and ``8000``, any other argument goes to daphne unchanged,
and the application is ``omnigent_site.asgi:application``. Before daphne is loaded it
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
import sys

from omnigent_site.runtime.event_loop import EventLoopChoiceError, install_event_loop

APPLICATION = "omnigent_site.asgi:application"


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
    return ["-b", host, "-p", port, *rest, APPLICATION]


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
