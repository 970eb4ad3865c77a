"""``python -m omnigent_site.serve``: daphne with this project's limits.

Daphne refuses WebSocket messages over 1 MiB by default, which would cut a
runner's tunnel on the first large frame (a bundle, a long answer) and make it
reconnect forever. This entry point starts daphne with the tunnel's frame limit
(``OMNIGENT_MAX_FRAME_BYTES``, 16 MiB by default) and the project's ASGI app;
any other daphne option can be appended. It also keeps Twisted from parsing POST
bodies that only Django reads (``skip_twisted_form_parsing``), keeps startup
objects out of the garbage collector's full passes (``freeze_startup_objects``),
and starts the process-wide stale-runner sweep (``runners/upkeep.py``).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import sys
from typing import Any


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


def skip_twisted_form_parsing() -> bool:
    """Stop Twisted from parsing POST bodies as forms before daphne sees them.

    Twisted's ``Request`` parses the Content-Type of every POST with the ``email``
    package, and a ``multipart/form-data`` body entirely, into ``request.args``.
    Daphne never reads ``args``: it hands the raw body to Django, which parses it
    again. That cost a tenth of the server's time on the relay's hot path, and more
    than half a second of CPU for a 10 MiB bundle upload. Twisted's ``Request`` takes
    ``parsePOSTFormSubmission=False`` for exactly this; daphne does not pass it, so
    daphne's request class is replaced by a subclass that does. Returns False,
    changing nothing, if Twisted's ``Request`` does not take the parameter.
    """
    from daphne import http_protocol
    from twisted.web import http

    base = http_protocol.WebRequest
    if getattr(base, "parses_post_forms", True) is False:
        return True
    if "parsePOSTFormSubmission" not in inspect.signature(http.Request.__init__).parameters:
        return False

    class FormlessWebRequest(base):  # type: ignore[misc, valid-type]
        parses_post_forms = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["parsePOSTFormSubmission"] = False
            super().__init__(*args, **kwargs)

    http_protocol.WebRequest = FormlessWebRequest
    return True


_background: set[asyncio.Task[None]] = set()


def start_upkeep() -> None:
    """Start the process-wide loops (``runners/upkeep.py``) on daphne's event loop.

    Called once the reactor runs, when daphne has loaded the application (and so
    set Django up).
    """
    from runners.upkeep import sweep_stale_runners_forever

    task = asyncio.get_event_loop().create_task(sweep_stale_runners_forever())
    _background.add(task)
    task.add_done_callback(_background.discard)


def freeze_startup_objects() -> None:
    """Keep what was loaded at startup out of the garbage collector's full passes.

    Django, DRF, Twisted and the app's modules leave about 100,000 tracked objects
    that live as long as the process, and every full collection walked them all. In
    ``bench/relay.py`` the slowest requests took about 80 ms against a median of 6;
    with those objects frozen into a permanent generation (``gc.freeze``) the slowest
    took about 25 ms, and CPU per request fell by 2 to 4 %.
    """
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnigent_site.settings")
    from daphne.cli import CommandLineInterface
    from twisted.internet import reactor

    skip_twisted_form_parsing()
    reactor.callWhenRunning(freeze_startup_objects)  # type: ignore[attr-defined]
    reactor.callWhenRunning(start_upkeep)  # type: ignore[attr-defined]
    CommandLineInterface().run(daphne_argv(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
