"""Guards for ``omnigent_site/runtime``: one or more per change to a library's behaviour.

Each test asserts what a runtime change relies on in the library underneath: an
attribute, a signature, the shape of an argument, or the behaviour itself. When a
library upgrade changes it, the test fails here (with what to re-check) instead of
the change silently doing nothing or something else in production. The Redis
channel layer's guards are in ``test_scale_out_layer.py`` (they need Redis).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import hashlib
import inspect
import logging
import textwrap
import threading
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from autobahn.websocket.protocol import WebSocketServerProtocol
from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from daphne import cli as daphne_cli
from daphne import http_protocol
from daphne import server as daphne_server
from daphne.ws_protocol import WebSocketFactory as DaphneWebSocketFactory
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware
from django.utils.deprecation import MiddlewareMixin
from django.utils.module_loading import import_string
from twisted.internet import defer
from twisted.web import http
from twisted.web.test.requesthelper import DummyChannel

from omnigent_site.runtime import background, flow, middleware, server, shutdown
from omnigent_site.runtime.channel_layer import EmbeddedChannelLayer, ScaleOutChannelLayer
from omnigent_site.runtime.handler import PooledThreadsASGIHandler

pytestmark = pytest.mark.timeout(30)


def fingerprint(function: Any) -> str:
    source = textwrap.dedent(inspect.getsource(function))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def changed_since_audit(audited: dict[Any, str]) -> list[str]:
    """The audited functions whose source no longer has the fingerprint it was audited at."""
    return [
        function.__qualname__
        for function, expected in audited.items()
        if fingerprint(function) != expected
    ]


def names_used_by(function: Any) -> set[str]:
    """Global and attribute names a function's code (nested functions included) uses."""
    names: set[str] = set()
    codes = [function.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return names


# --- handler: pooled request threads ----------------------------------------------------


def test_guard_thread_sensitive_context_takes_an_executor() -> None:
    """``PooledThreadsASGIHandler`` hands each request its own executor through asgiref's
    ``ThreadSensitiveContext(executor=...)``: thread-sensitive calls inside must run on
    that executor's thread."""
    assert "executor" in inspect.signature(ThreadSensitiveContext).parameters
    from concurrent.futures import ThreadPoolExecutor

    executor = ThreadPoolExecutor(max_workers=1)
    try:
        expected = executor.submit(threading.get_ident).result(timeout=10)

        async def run() -> int:
            async with ThreadSensitiveContext(executor=executor):
                return await sync_to_async(threading.get_ident, thread_sensitive=True)()

        assert asyncio.run(run()) == expected
    finally:
        executor.shutdown(wait=True)


def test_guard_asgi_handler_call_and_send_response_are_as_copied() -> None:
    """``PooledThreadsASGIHandler.__call__`` is Django's ``ASGIHandler.__call__`` with an
    executor given to ``ThreadSensitiveContext``, and its ``send_response`` override
    must be what Django calls to send every response. If this fails, compare
    ``omnigent_site/runtime/handler.py`` with the new Django code and update the
    fingerprint."""
    assert fingerprint(ASGIHandler.__call__) == "fd60e60793c4542e", (
        "Django changed ASGIHandler.__call__, which PooledThreadsASGIHandler copies"
    )
    assert "await self.send_response(response, send)" in inspect.getsource(ASGIHandler.handle)
    assert list(inspect.signature(ASGIHandler.send_response).parameters) == [
        "self",
        "response",
        "send",
    ]


# --- middleware: hooks inline on the event loop -----------------------------------------

# The Django functions whose code was audited for the inline hooks: none reaches the
# database except where ``response_needs_thread`` sends it to a thread (a modified
# session; messages that spill into the session). If one of these fingerprints
# changes, read the new code: does the hook now touch the database, a file, the
# network? Then make it go through a thread (``response_needs_thread``) or drop the
# inline class, and update the fingerprint.
AUDITED_DJANGO_CODE = {
    MiddlewareMixin.__call__: "84f3fb5d6d1fdc78",
    MiddlewareMixin.__acall__: "5c839eda8e410120",
    SecurityMiddleware.process_request: "d5fdbe21b4b4134b",
    SecurityMiddleware.process_response: "527f0602ae289680",
    SessionMiddleware.process_request: "75aa45f3ac970a90",
    SessionMiddleware.process_response: "6c7ba28c4b9f3d93",
    CommonMiddleware.process_request: "c89424b1344cd422",
    CommonMiddleware.process_response: "16ee3f24a3ef9083",
    CsrfViewMiddleware.process_request: "60608b9e743f302e",
    CsrfViewMiddleware.process_view: "7ac9f2f4f6cd9ea4",
    CsrfViewMiddleware.process_response: "5236d0b2c7205d34",
    AuthenticationMiddleware.process_request: "c8bcdfb9e426c9a6",
    MessageMiddleware.process_request: "336cd8d0cdab2837",
    MessageMiddleware.process_response: "9a7aa57da7368b46",
    XFrameOptionsMiddleware.process_response: "100e93325f6465d1",
}

INLINE_CLASSES = {
    middleware.InlineSecurityMiddleware: ("process_request", "process_response"),
    middleware.InlineSessionMiddleware: ("process_request", "process_response"),
    middleware.InlineCommonMiddleware: ("process_request", "process_response"),
    middleware.InlineCsrfViewMiddleware: ("process_request", "process_view", "process_response"),
    middleware.InlineAuthenticationMiddleware: ("process_request",),
    middleware.InlineMessageMiddleware: ("process_request", "process_response"),
    middleware.InlineXFrameOptionsMiddleware: ("process_response",),
}


def test_guard_the_audited_django_middleware_code_is_unchanged() -> None:
    changed = changed_since_audit(AUDITED_DJANGO_CODE)
    assert not changed, (
        f"Django changed {changed}: audit them again for omnigent_site/runtime/middleware.py"
    )


def test_guard_each_inline_class_has_exactly_the_audited_hooks() -> None:
    hooks = ("process_request", "process_view", "process_response", "process_exception")
    for cls, expected in INLINE_CLASSES.items():
        assert tuple(hook for hook in hooks if hasattr(cls, hook)) == expected, cls
    # settings.MIDDLEWARE names Django's classes (for its system checks); each of them
    # has its inline equivalent, in order. RequestObservationMiddleware
    # (omnigent_site/observability.py), ErrorFormatMiddleware (omnigent_site/errors.py)
    # and Utf8UrlMiddleware (omnigent_site/utf8_urls.py) are the project's own.
    stock = [path for path in settings.MIDDLEWARE if path.startswith("django.")]
    assert [path for path in settings.MIDDLEWARE if path not in stock] == [
        "omnigent_site.observability.RequestObservationMiddleware",
        "omnigent_site.errors.ErrorFormatMiddleware",
        "omnigent_site.utf8_urls.Utf8UrlMiddleware",
    ]
    assert [middleware.INLINE_EQUIVALENTS[path].rsplit(".", 1)[-1] for path in stock] == [
        cls.__name__ for cls in INLINE_CLASSES
    ]
    for path in stock:
        inline = import_string(middleware.INLINE_EQUIVALENTS[path])
        assert inline.__mro__[1:3] == (middleware.InlineHooksMixin, import_string(path))


def test_guard_django_builds_the_chain_from_the_middleware_setting() -> None:
    """``PooledThreadsASGIHandler.load_middleware`` swaps the setting for the length of
    Django's ``load_middleware``: Django must still read the classes from it there."""
    assert {"settings", "MIDDLEWARE", "import_string"} <= names_used_by(BaseHandler.load_middleware)


async def test_guard_the_server_handler_runs_the_inline_equivalents(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server's handler runs every stock class of ``settings.MIDDLEWARE`` as its
    inline equivalent: each equivalent's ``process_response`` runs, on the loop thread,
    and the setting itself is left naming Django's classes."""
    loop_thread = threading.get_ident()
    ran: list[tuple[str, int]] = []
    with_response = [cls for cls in INLINE_CLASSES if "process_response" in INLINE_CLASSES[cls]]
    for cls in with_response:

        def spy(
            self: Any, request: HttpRequest, response: Any, _real: Any = cls.process_response
        ) -> Any:
            ran.append((type(self).__name__, threading.get_ident()))
            return _real(self, request, response)

        monkeypatch.setattr(cls, "process_response", spy)
    configured = list(settings.MIDDLEWARE)
    app = PooledThreadsASGIHandler(max_idle_threads=1)
    assert list(settings.MIDDLEWARE) == configured
    sent: list[dict[str, Any]] = []

    bodies = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()  # no disconnect: Django cancels this when done
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/no-such-route",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 404
    assert sorted(name for name, _ in ran) == sorted(cls.__name__ for cls in with_response)
    assert {thread for _, thread in ran} == {loop_thread}


def test_guard_csrf_secrets_come_from_the_cookie_not_the_session() -> None:
    """With ``CSRF_USE_SESSIONS`` the CSRF hooks would read the session (the database)
    on the event loop."""
    assert settings.CSRF_USE_SESSIONS is False


async def test_guard_async_middleware_runs_the_inline_hooks_on_the_event_loop() -> None:
    """Django must still route an async request through ``__acall__`` (ours): the hooks
    then run on the loop's thread, with no hop."""
    loop_thread = threading.get_ident()
    ran_on: list[int] = []

    class Probe(middleware.InlineXFrameOptionsMiddleware):
        def process_response(self, request: HttpRequest, response: Any) -> Any:
            ran_on.append(threading.get_ident())
            return super().process_response(request, response)

    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    probe = Probe(view)
    assert probe.async_mode
    response = await probe(HttpRequest())
    assert response["X-Frame-Options"] == "DENY"
    assert ran_on == [loop_thread]


# --- flow: daphne's send reaches Twisted's request ------------------------------------------


async def test_guard_daphne_send_is_a_partial_of_the_request_protocol() -> None:
    protocol = http.Request(DummyChannel())
    captured: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        captured["send"] = send

    fake_server = types.SimpleNamespace(
        connections={protocol: {}}, application=app, handle_reply=lambda *args: None
    )
    daphne_server.Server.create_application(fake_server, protocol, {"type": "http"})
    await fake_server.connections[protocol]["application_instance"]
    send = captured["send"]
    assert isinstance(send, functools.partial) and send.args[0] is protocol
    assert flow._request_protocol(send) is protocol


def test_guard_daphne_requests_take_a_push_producer() -> None:
    assert issubclass(http_protocol.WebRequest, http.Request)
    request = http.Request(DummyChannel())
    watch = flow.WriteWatch(request)
    watch.start()
    assert request.producer is watch and request.streamingProducer
    watch.stop()
    assert request.producer is None


# --- shutdown: streams end with [DONE] --------------------------------------------------------


def test_guard_daphne_cancels_applications_from_a_before_shutdown_trigger() -> None:
    names = names_used_by(daphne_server.Server.run)
    assert {"addSystemEventTrigger", "kill_all_applications"} <= names


def test_guard_twisted_waits_for_before_shutdown_deferreds() -> None:
    """``shutdown.begin`` returns a Deferred; Twisted must not start the next phase of
    the shutdown (closing every connection) before it fires."""
    from twisted.internet.base import _ThreePhaseEvent

    event = _ThreePhaseEvent()
    draining: defer.Deferred[None] = defer.Deferred()
    closed: list[str] = []
    event.addTrigger("before", lambda: draining)
    event.addTrigger("before", lambda: None)  # daphne's, say
    event.addTrigger("during", closed.append, "connections")
    event.fireEvent()
    assert closed == []
    draining.callback(None)
    assert closed == ["connections"]


def test_guard_stop_listening_finds_daphne_ports_among_the_reactor_readers() -> None:
    """``shutdown.stop_listening`` closes daphne's ports before the drain through the
    reactor's public ``getReaders`` and ``IListeningPort``. If Twisted stopped listing a
    listening port among its readers, a stopping process would go on accepting
    connections it then cuts off; this finds out."""
    import socket

    import omnigent_site.asgi  # noqa: F401 - installs the runtime's reactor

    reactor = server.installed_reactor()
    assert reactor is not None
    port = reactor.listenTCP(0, http_protocol.HTTPFactory(None), interface="127.0.0.1")
    address = port.getHost()
    try:
        assert port in reactor.getReaders()
        assert shutdown.stop_listening() == 1
        assert port not in reactor.getReaders()
    finally:
        if not port.disconnected:
            port.connectionLost(None)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address.host, address.port), timeout=5).close()


async def test_a_stream_writes_its_last_frame_before_the_connections_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Daphne's shutdown cancels every application instance; its wait ends with the
    first instance that ends cancelled (a tunnel). What Twisted waits on before it
    closes the connections (daphne's Deferred and ours) must include the draining
    stream's last frame."""
    monkeypatch.setattr(shutdown, "_stopping", False)
    monkeypatch.setattr(shutdown, "_events", type(shutdown._events)())
    monkeypatch.setattr(background, "_stop_hooks", {})
    written: list[str] = []

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await shutdown.stopping().wait()
        await asyncio.sleep(0.05)  # a few more steps, as a real stream takes
        written.append("[DONE]")

    async def tunnel() -> None:
        await asyncio.sleep(30)

    sse = asyncio.ensure_future(shutdown.DrainOnShutdown(stream)({"type": "http"}, None, None))
    ws = asyncio.ensure_future(tunnel())
    await asyncio.sleep(0.01)
    fake_server = types.SimpleNamespace(
        connections={
            object(): {"application_instance": ws},
            object(): {"application_instance": sse},
        }
    )
    ours = shutdown.begin()  # the project's trigger; daphne's follows in the same turn
    theirs = daphne_server.Server.kill_all_applications(fake_server)
    assert isinstance(ours, defer.Deferred) and isinstance(theirs, defer.Deferred)
    both = defer.DeferredList([ours, theirs])
    await asyncio.wait_for(both.asFuture(asyncio.get_running_loop()), 5)
    assert written == ["[DONE]"]
    assert sse.cancelled() and ws.cancelled()


async def test_stop_hooks_run_in_a_context_of_their_own_and_the_stop_waits_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stop begins inside whatever callback the reactor runs, whose context may be
    a finished request's (its ``ThreadSensitiveContext`` left): a hook started in that
    context could not reach the database (``sync_to_async`` refuses)."""
    monkeypatch.setattr(shutdown, "_stopping", False)
    monkeypatch.setattr(shutdown, "_events", type(shutdown._events)())
    ran: list[str] = []

    async def hook() -> None:
        await asyncio.sleep(0.05)
        ran.append(await sync_to_async(lambda: "in a thread")())

    monkeypatch.setattr(background, "_stop_hooks", {"hook": hook})
    loop = asyncio.get_running_loop()
    began: asyncio.Future[Any] = loop.create_future()
    # A request (the handler gives each its own executor) schedules a callback, then ends.
    with ThreadPoolExecutor(max_workers=1) as executor:
        async with ThreadSensitiveContext(executor=executor):
            loop.call_soon(lambda: began.set_result(shutdown.begin()))
    stopped = await began
    assert isinstance(stopped, defer.Deferred)
    await asyncio.wait_for(stopped.asFuture(loop), 5)
    assert ran == ["in a thread"]


async def test_a_cancellation_outside_a_shutdown_goes_through_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutdown, "_stopping", False)
    cancelled = asyncio.Event()

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    instance = asyncio.ensure_future(shutdown.DrainOnShutdown(slow)({"type": "http"}, None, None))
    await asyncio.sleep(0.01)
    instance.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(instance, 1)
    assert cancelled.is_set()


# --- server: frame limit, form parsing, gc, background tasks ----------------------------------


def test_guard_daphne_builds_its_websocket_factory_from_the_module_global() -> None:
    names = names_used_by(daphne_server.Server.run)
    assert {"WebSocketFactory", "setProtocolOptions"} <= names
    server.raise_websocket_frame_limit(settings.OMNIGENT_MAX_FRAME_BYTES)
    assert issubclass(daphne_server.WebSocketFactory, DaphneWebSocketFactory)


def test_guard_daphne_default_frame_limit_is_the_one_replaced() -> None:
    default = server.daphne_default_frame_limit()
    assert default == 1024 * 1024
    args = daphne_cli.CommandLineInterface().parser.parse_args(["app:app"])
    assert args.websocket_max_message_size == default
    assert args.websocket_max_frame_size == default
    parameters = inspect.signature(daphne_server.Server.__init__).parameters
    assert parameters["websocket_max_frame_size"].default == default


def test_guard_autobahn_copies_the_limits_into_each_connection() -> None:
    assert "maxMessagePayloadSize" in WebSocketServerProtocol.CONFIG_ATTRS
    assert "maxFramePayloadSize" in WebSocketServerProtocol.CONFIG_ATTRS


def test_the_default_limits_become_the_tunnel_limit_and_explicit_ones_stay() -> None:
    server.raise_websocket_frame_limit(settings.OMNIGENT_MAX_FRAME_BYTES)
    default = server.daphne_default_frame_limit()
    factory = daphne_server.WebSocketFactory(object(), server="daphne")
    factory.setProtocolOptions(maxMessagePayloadSize=default, maxFramePayloadSize=default)
    assert factory.maxMessagePayloadSize == settings.OMNIGENT_MAX_FRAME_BYTES == 16 * 1024 * 1024
    assert factory.maxFramePayloadSize == settings.OMNIGENT_MAX_FRAME_BYTES
    factory.setProtocolOptions(maxMessagePayloadSize=32 * 1024 * 1024, maxFramePayloadSize=0)
    assert (factory.maxMessagePayloadSize, factory.maxFramePayloadSize) == (32 * 1024 * 1024, 0)


def test_guard_daphne_builds_requests_from_the_module_global() -> None:
    assert "WebRequest" in names_used_by(http_protocol.HTTPFactory.buildProtocol)


@pytest.fixture
def daphne_request_class() -> Iterator[None]:
    """Restore the request class after the test (a stack of subclasses is harmless)."""
    original = http_protocol.WebRequest
    try:
        yield
    finally:
        http_protocol.WebRequest = original


def _form_post(request: http.Request) -> http.Request:
    request.requestHeaders.setRawHeaders(b"content-type", [b"application/x-www-form-urlencoded"])
    request.gotLength(3)
    request.handleContentChunk(b"a=1")
    request.requestReceived(b"POST", b"/", b"HTTP/1.1")
    return request


def test_guard_twisted_can_leave_post_bodies_unparsed() -> None:
    assert _form_post(http.Request(DummyChannel())).args == {b"a": [b"1"]}
    unparsed = _form_post(http.Request(DummyChannel(), parsePOSTFormSubmission=False))
    assert unparsed.args == {}
    unparsed.content.seek(0)
    assert unparsed.content.read() == b"a=1"  # the body daphne hands to Django


class FakeChannel:
    """What daphne's request needs of its HTTP channel and server at construction."""

    transport = None

    class factory:  # noqa: N801 - attribute access like Twisted's
        class server:  # noqa: N801
            @staticmethod
            def protocol_connected(request: object) -> None:
                return None

    def getPeer(self) -> None:  # noqa: N802
        return None

    def getHost(self) -> None:  # noqa: N802
        return None


@pytest.mark.usefixtures("daphne_request_class")
def test_daphne_requests_no_longer_parse_post_bodies_as_forms() -> None:
    assert server.skip_twisted_form_parsing()
    request_class = http_protocol.WebRequest
    assert issubclass(request_class, http.Request)
    request = request_class(FakeChannel())
    assert request._parsePOSTFormSubmission is False
    # Installing twice does not stack subclasses.
    assert server.skip_twisted_form_parsing()
    assert http_protocol.WebRequest is request_class


def test_answered_health_checks_leave_the_access_log_above_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A load balancer's (or runlocal's) ``/health`` every few seconds is not news; a
    failing check, and every other request, still is. At DEBUG all of them show."""
    assert server.hide_health_checks_from_access_log()
    factory_class = daphne_server.HTTPFactory
    lines: list[str] = []
    daphne = types.SimpleNamespace(
        verbosity=1, action_logger=lambda protocol, action, details: lines.append(details["path"])
    )
    factory_class(daphne)
    assert server.RunningServer.server is daphne
    assert isinstance(daphne.action_logger, server.HealthChecksAtDebug)
    factory_class(daphne)  # a second factory does not wrap the logger twice
    assert not isinstance(daphne.action_logger.inner, server.HealthChecksAtDebug)

    def complete(path: str, status: int) -> None:
        daphne.action_logger("http", "complete", {"path": path, "status": status})

    caplog.set_level(logging.INFO, logger=server.log.name)
    complete("/health", 200)
    complete("/health", 503)
    complete("/v1/sessions", 200)
    assert lines == ["/health", "/v1/sessions"]
    caplog.set_level(logging.DEBUG, logger=server.log.name)
    complete("/health", 200)
    assert lines[-1] == "/health" and len(lines) == 3
    # Installing twice does not stack subclasses.
    assert server.hide_health_checks_from_access_log()
    assert daphne_server.HTTPFactory is factory_class


def test_the_start_up_line_names_each_listening_address() -> None:
    tcp = types.SimpleNamespace(listening_addresses=[("127.0.0.1", 8000), ("::1", 8001)])
    assert server.listening_urls(tcp) == ["http://127.0.0.1:8000/", "http://[::1]:8001/"]
    unix = types.SimpleNamespace(listening_addresses=[], endpoints=["unix:/run/omnigent.sock"])
    assert server.listening_urls(unix) == ["unix:/run/omnigent.sock"]
    assert server.listening_urls(None) == []


def test_guard_daphne_builds_its_http_factory_from_the_global() -> None:
    """``hide_health_checks_from_access_log`` relies on ``Server.run`` building
    ``HTTPFactory(self)`` from ``daphne.server``'s global, and on daphne's command line
    offering no other way to filter its access log (``AccessLogGenerator`` writes to a
    stream). If this fails, compare ``daphne.server.Server.run`` and ``daphne.cli``."""
    run = inspect.getsource(daphne_server.Server.run)
    assert "self.http_factory = HTTPFactory(self)" in run
    cli = inspect.getsource(daphne_cli.CommandLineInterface.run)
    assert "AccessLogGenerator(access_log_stream)" in cli


def test_startup_objects_are_frozen_out_of_full_collections() -> None:
    gc.unfreeze()
    try:
        assert server.freeze_startup_objects() > 10_000  # Django, DRF, Twisted, the app
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()


def test_guard_the_reactor_starts_the_runtime_and_stops_it_cleanly() -> None:
    """Building the application registers the runtime with the reactor daphne installed:
    a startup trigger (freeze, background tasks) and a before-shutdown one."""
    import omnigent_site.asgi  # noqa: F401 - builds the application

    reactor = server.installed_reactor()
    assert reactor is not None and type(reactor).__name__ == "AsyncioSelectorReactor"
    startup = reactor._eventTriggers["startup"].after
    assert any(trigger[0] is server._reactor_started for trigger in startup)
    before = reactor._eventTriggers["shutdown"].before
    assert any(trigger[0] is shutdown.begin for trigger in before)


def test_the_stale_runner_sweep_is_registered_by_the_runners_app() -> None:
    assert "runners.upkeep.sweep_stale_runners_forever" in background.registered()
    assert "runners.upkeep.resend_unacked_starts_forever" in background.registered()
    assert "runners.liveness.beat_forever" in background.registered()
    assert "runners.liveness.start" in background._start_hooks
    assert "runners.liveness.stop" in background._stop_hooks


async def test_background_tasks_start_once_on_the_running_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(background, "_factories", {})
    monkeypatch.setattr(background, "_started", False)
    runs: list[str] = []

    async def loop_forever() -> None:
        runs.append("started")
        await asyncio.sleep(3600)

    background.on_serve(loop_forever)
    background.on_serve(loop_forever)  # registered twice: one loop
    tasks = background.start_background_tasks()
    assert background.start_background_tasks() == []
    await asyncio.sleep(0)
    assert runs == ["started"] and len(tasks) == 1
    tasks[0].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --- channel layers ---------------------------------------------------------------------------


def test_guard_in_memory_layer_sweeps_from_clean_expired_on_receive() -> None:
    """``EmbeddedChannelLayer`` rate-limits the stock layer's sweep by overriding
    ``_clean_expired``, which the stock ``receive`` calls."""
    assert "_clean_expired" in names_used_by(InMemoryChannelLayer.receive)
    assert EmbeddedChannelLayer._clean_expired is not InMemoryChannelLayer._clean_expired
    assert "prefix" in inspect.signature(InMemoryChannelLayer.new_channel).parameters


def test_guard_redis_layer_keeps_buffers_hosts_and_timeouts_where_expected() -> None:
    """``ScaleOutChannelLayer`` reads ``hosts``, ``brpop_timeout`` and ``expiry``, and drops
    entries of ``receive_buffer``; receiving pops into that buffer."""
    layer = RedisChannelLayer(hosts=[{"address": "redis://127.0.0.1:6379/0"}])
    assert isinstance(layer.receive_buffer, dict)
    assert isinstance(layer.hosts[0], dict) and "address" in layer.hosts[0]
    assert isinstance(layer.brpop_timeout, int) and isinstance(layer.expiry, int)
    assert "receive_buffer" in names_used_by(RedisChannelLayer.receive)
    assert "prefix" in inspect.signature(RedisChannelLayer.new_channel).parameters


# channels-redis' code that ``ScaleOutChannelLayer.send`` and ``group_send`` do in fewer
# round trips (the same commands in Lua scripts), by fingerprint: a release that
# changes what they store, where or for how long fails here until the scripts and the
# parity tests (``test_scale_out_layer.py``) are checked against it again.
AUDITED_CHANNELS_REDIS_CODE = {
    RedisChannelLayer.send: "e40b2cc7b0b94983",
    RedisChannelLayer.group_send: "af0ad08fdefcdd4b",
    RedisChannelLayer._map_channel_keys_to_connection: "a339f7cfdb5cc766",
}


def test_guard_the_redis_layer_sends_as_audited() -> None:
    changed = changed_since_audit(AUDITED_CHANNELS_REDIS_CODE)
    assert not changed, (
        f"channels-redis changed {changed}: check the scripts of "
        "omnigent_site/runtime/channel_layer.py against them again"
    )
    # What the overrides use of the stock layer is still there.
    stock = RedisChannelLayer(hosts=[{"address": "redis://127.0.0.1:6379/0"}])
    used = (
        names_used_by(ScaleOutChannelLayer.send)
        | names_used_by(ScaleOutChannelLayer.group_send)
        | names_used_by(ScaleOutChannelLayer._run)
    )
    for name in (
        "_send_index_generator",
        "consistent_hash",
        "non_local_name",
        "get_capacity",
        "serialize",
        "_group_key",
        "_map_channel_keys_to_connection",
        "connection",
        "group_expiry",
        "expiry",
    ):
        assert name in used, name
        assert hasattr(stock, name), f"channels-redis no longer has {name}"
