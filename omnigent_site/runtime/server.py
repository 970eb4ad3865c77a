"""What daphne and Twisted do differently in this project, however the server starts.

``server_application`` wraps the project's ASGI router when ``omnigent_site/asgi.py``
builds it. Daphne imports that module before it creates its server and starts the
reactor, both under ``python -m omnigent_site.serve`` and under a bare ``daphne
omnigent_site.asgi:application``, so everything here applies to both:

- **WebSocket frame limit.** Daphne refuses WebSocket messages over 1 MiB by default,
  which would cut a runner's tunnel on its first large frame (a long answer) and make
  it reconnect forever. Daphne builds its autobahn factory from the module global
  ``daphne.server.WebSocketFactory`` when it starts; that global is replaced by a
  subclass that turns daphne's *default* message and frame limits into
  ``OMNIGENT_MAX_FRAME_BYTES`` (16 MiB). A limit given explicitly on daphne's command
  line is kept; one smaller than ``OMNIGENT_MAX_FRAME_BYTES`` is logged as a warning
  at start.
- **No form parsing by Twisted** (``skip_twisted_form_parsing``).
- **Health checks out of the access log** unless the log level is DEBUG
  (``hide_health_checks_from_access_log``): a load balancer or ``runlocal`` asks
  ``/health`` every few seconds.
- **Request bodies over a registered path's limit** refused while they arrive
  (``runtime.body_limit``).
- **Startup objects frozen** out of the garbage collector's full passes once the
  reactor runs (``freeze_startup_objects``).
- **Background tasks** registered with ``runtime.on_serve`` start on daphne's event
  loop once the reactor runs (``reactor.callWhenRunning``): daphne sends no ASGI
  lifespan events, and a process that holds no tunnel and gets no request must still
  sweep stale runners. ``runtime.on_start`` hooks run just before, synchronously,
  before the first request is served (the runners app marks the tunnels of dead
  processes offline there).
- **Shutdown**: ``runtime.shutdown.begin`` is a before-shutdown trigger of the
  reactor, and HTTP requests get a moment to finish (``DrainOnShutdown``).
- **Write watch**: every HTTP request gets a ``runtime.flow.WriteWatch`` in its scope.

Once the reactor runs, one line at INFO (logger ``omnigent_site.runtime.server``) says
where to go: ``Omnigent on http://127.0.0.1:8000/ (web page), API at /v1/``. One line at
DEBUG reports what was applied, and which event loop daphne runs on: uvloop under
``python -m omnigent_site.serve``, which chooses it before daphne is loaded
(``runtime/event_loop.py``), asyncio's own under a bare ``daphne`` command.

Outside a Twisted reactor (tests that call the application directly) the patches
are applied to daphne's classes all the same, and nothing starts: no background
task, no freeze.
"""

from __future__ import annotations

import gc
import inspect
import logging
import sys
from typing import Any

from django.conf import settings

from omnigent_site import metrics
from omnigent_site.runtime import background, body_limit, shutdown
from omnigent_site.runtime.event_loop import loop_name
from omnigent_site.runtime.flow import WriteWatchMiddleware

log = logging.getLogger(__name__)

_prepared = False


def server_application(app: Any) -> Any:
    """The outermost ASGI application around ``app`` (the project's protocol router)."""
    prepare_process()
    return shutdown.DrainOnShutdown(WriteWatchMiddleware(app))


def prepare_process() -> None:
    """Apply the daphne and Twisted changes and hook into the reactor (once)."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    skip_twisted_form_parsing()
    hide_health_checks_from_access_log()
    body_limit.install()
    raise_websocket_frame_limit(settings.OMNIGENT_MAX_FRAME_BYTES)
    background.on_start(metrics.process_started)
    background.on_stop(_metrics_process_stopping)
    reactor = installed_reactor()
    if reactor is None:
        return
    reactor.callWhenRunning(_reactor_started, reactor)
    reactor.addSystemEventTrigger("before", "shutdown", shutdown.begin)


async def _metrics_process_stopping() -> None:
    metrics.process_stopping()


def installed_reactor() -> Any | None:
    """The Twisted reactor if one is installed (daphne installs its asyncio reactor when
    ``daphne.server`` is imported: by the ``daphne`` app and by daphne's command line).
    Never installs one: importing ``twisted.internet.reactor`` first would install the
    default reactor and break daphne's."""
    return sys.modules.get("twisted.internet.reactor")


def _reactor_started(reactor: Any) -> None:
    """Called by Twisted when the reactor starts, before its loop runs."""
    background.run_start_hooks()  # before the loop serves the first request
    frozen = freeze_startup_objects()
    reactor.callLater(0, background.start_background_tasks)
    message, frame = TunnelWebSocketLimits.applied or (None, None)
    where = listening_urls(RunningServer.server)
    if where:
        log.info("%s%s (web page), API at /v1/", WHERE_TO_GO, ", ".join(where))
    log.debug(
        "server runtime: %d startup objects frozen out of full collections; Twisted "
        "form parsing off: %s; WebSocket message/frame limit: %s/%s bytes; background tasks: %s; event loop: %s",
        frozen,
        not getattr(_daphne_request_class(), "parses_post_forms", True),
        message,
        frame,
        ", ".join(background.registered()) or "none",
        _daphne_loop_name(),
    )
    wanted = settings.OMNIGENT_MAX_FRAME_BYTES
    for name, value in (("message", message), ("frame", frame)):
        if value is not None and value != 0 and (wanted == 0 or value < wanted):
            log.warning(
                "daphne's WebSocket %s limit (%d bytes) is below OMNIGENT_MAX_FRAME_BYTES "
                "(%d): runner tunnels will be closed on larger frames; drop the daphne "
                "option or raise it",
                name,
                value,
                wanted,
            )


# The start of the INFO line that says where the server listens; ``runlocal``, which
# prints its own summary, leaves it out of what it relays.
WHERE_TO_GO = "Omnigent on "


def listening_urls(daphne_server: Any) -> list[str]:
    """``http://host:port/`` for each TCP address daphne listens on (the port it was
    given, or the one the system chose for port 0); daphne's endpoint descriptions for
    anything else (a UNIX socket, a file descriptor)."""
    if daphne_server is None:
        return []
    urls = []
    for host, port in getattr(daphne_server, "listening_addresses", []):
        shown = f"[{host}]" if ":" in str(host) else host
        urls.append(f"http://{shown}:{port}/")
    return urls or [str(endpoint) for endpoint in getattr(daphne_server, "endpoints", [])]


class RunningServer:
    """The daphne ``Server`` of this process, once it has built its HTTP factory."""

    server: Any = None


class HealthChecksAtDebug:
    """Daphne's access logger, minus the answered health checks (``GET /health`` 200)
    while this module's logger is above DEBUG. A failing check is always logged."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, protocol: str, action: str, details: dict[str, Any]) -> None:
        if (
            protocol == "http"
            and action == "complete"
            and details.get("path") == "/health"
            and details.get("status") == 200
            and not log.isEnabledFor(logging.DEBUG)
        ):
            return
        self.inner(protocol, action, details)


class _LogLines:
    """A stream whose lines become INFO records of ``logger``."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                self.logger.info(line)
        return len(text)

    def flush(self) -> None:
        pass


def access_log_to_logging(action_logger: Any) -> bool:
    """With JSON logs, daphne's access log (written to stdout as plain lines) goes through
    the logger ``daphne.access`` instead, so it is JSON like every other line. An access
    log written to a file (daphne's ``--access-log FILE``) is left alone."""
    if getattr(action_logger, "stream", None) is not sys.stdout:
        return False
    action_logger.stream = _LogLines(logging.getLogger("daphne.access"))
    return True


def hide_health_checks_from_access_log() -> bool:
    """Keep answered health checks out of daphne's access log, and note the running server.

    Daphne writes its access log through the ``action_logger`` its ``Server`` was built
    with; its HTTP factory is built from the module global ``daphne.server.HTTPFactory``
    with that server. The
    subclass installed here wraps the logger in :class:`HealthChecksAtDebug` and keeps
    the server in :class:`RunningServer` (its listening addresses, for the start-up
    line). Returns False, changing nothing, if daphne has no such global.
    """
    from daphne import server as daphne_server

    current = getattr(daphne_server, "HTTPFactory", None)
    if current is None:
        log.warning("daphne.server has no HTTPFactory: health checks stay in the access log")
        return False
    if getattr(current, "hides_health_checks", False):
        return True

    class HealthQuietHTTPFactory(current):  # type: ignore[misc, valid-type]
        hides_health_checks = True

        def __init__(self, server: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(server, *args, **kwargs)
            RunningServer.server = server
            action_logger = getattr(server, "action_logger", None)
            if action_logger is not None and not isinstance(action_logger, HealthChecksAtDebug):
                if settings.OMNIGENT_LOG_FORMAT == "json":
                    access_log_to_logging(action_logger)
                server.action_logger = HealthChecksAtDebug(action_logger)

    daphne_server.HTTPFactory = HealthQuietHTTPFactory
    return True


def freeze_startup_objects() -> int:
    """Keep what was loaded at startup out of the garbage collector's full passes.

    Django, DRF, Twisted and the app's modules leave about 100,000 objects that live as
    long as the process, and every full collection walked them all: those pauses were
    the slowest requests (``docs/performance.md``, overrides). Returns how many objects
    are frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _daphne_loop_name() -> str:
    """The loop daphne created for its reactor (``runtime/event_loop.py``)."""
    from daphne import server as daphne_server

    return loop_name(getattr(daphne_server, "twisted_loop", None))


def _daphne_request_class() -> Any:
    from daphne import http_protocol

    return http_protocol.WebRequest


def skip_twisted_form_parsing() -> bool:
    """Stop Twisted from parsing POST bodies as forms before daphne sees them.

    Twisted's ``Request`` parses the Content-Type of every POST with the ``email``
    package, and a ``multipart/form-data`` body entirely, into ``request.args``.
    Daphne never reads ``args``: it hands the raw body to Django, which parses it
    again (the cost is in ``docs/performance.md``, overrides). Twisted's ``Request`` takes
    ``parsePOSTFormSubmission=False`` for exactly this; daphne does not pass it, so
    daphne's request class (``daphne.http_protocol.WebRequest``, which daphne's HTTP
    factory reads for every new connection) is replaced by a subclass that does.
    Returns False, changing nothing, if Twisted's ``Request`` does not take the
    parameter.
    """
    from daphne import http_protocol
    from twisted.web import http

    base = http_protocol.WebRequest
    if getattr(base, "parses_post_forms", True) is False:
        return True
    if "parsePOSTFormSubmission" not in inspect.signature(http.Request.__init__).parameters:
        log.warning("Twisted's Request takes no parsePOSTFormSubmission: forms are parsed")
        return False

    class FormlessWebRequest(base):  # type: ignore[misc, valid-type]
        parses_post_forms = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["parsePOSTFormSubmission"] = False
            super().__init__(*args, **kwargs)

    http_protocol.WebRequest = FormlessWebRequest
    return True


def daphne_default_frame_limit() -> int:
    """Daphne's own WebSocket message limit (the same for frames), 1 MiB in 4.x."""
    from daphne.server import Server

    default = inspect.signature(Server.__init__).parameters["websocket_max_message_size"]
    return int(default.default)


class TunnelWebSocketLimits:
    """What ``raise_websocket_frame_limit`` applied: (message, frame) limits in bytes,
    once daphne has configured its WebSocket factory."""

    applied: tuple[int, int] | None = None


def raise_websocket_frame_limit(limit: int) -> None:
    """Make daphne's default WebSocket message and frame limits ``limit`` bytes.

    Daphne's ``Server.run`` builds ``WebSocketFactory(...)`` (a module global of
    ``daphne.server``) and calls its ``setProtocolOptions`` with the limits from its
    command line, 1 MiB unless given. The subclass installed here replaces a limit
    equal to daphne's default with ``limit``; a value set on daphne's command line
    (anything else) is kept. Autobahn copies the factory's options into each
    connection's protocol when it connects.
    """
    from daphne import server as daphne_server

    current = daphne_server.WebSocketFactory
    if getattr(current, "omnigent_frame_limit", None) is not None:
        current.omnigent_frame_limit = limit
        return
    default = daphne_default_frame_limit()

    class TunnelWebSocketFactory(current):  # type: ignore[misc, valid-type]
        omnigent_frame_limit = limit

        def setProtocolOptions(self, **options: Any) -> None:  # noqa: N802 - autobahn's name
            for key in ("maxMessagePayloadSize", "maxFramePayloadSize"):
                if options.get(key) == default:
                    options[key] = self.omnigent_frame_limit
            super().setProtocolOptions(**options)
            TunnelWebSocketLimits.applied = (
                int(self.maxMessagePayloadSize),
                int(self.maxFramePayloadSize),
            )

    daphne_server.WebSocketFactory = TunnelWebSocketFactory
