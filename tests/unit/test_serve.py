"""``python -m omnigent_site.serve``: daphne's arguments (the rest is the application's:
``tests/unit/test_runtime_guards.py``, ``tests/e2e/test_bare_daphne.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnigent_site import serve
from omnigent_site.serve import daphne_argv, listen_backlog

WEBSOCKET_DEFAULT_ARGS = ["--websocket_timeout", "-1", "--websocket_connect_timeout", "60"]


def test_daphne_gets_the_address_the_options_and_the_app() -> None:
    argv = daphne_argv(["--host", "0.0.0.0", "--port", "9000", "--proxy-headers"])
    assert argv == [
        "-e",
        f"tcp:port=9000:interface=0.0.0.0:backlog={listen_backlog()}",
        "--proxy-headers",
        *WEBSOCKET_DEFAULT_ARGS,
        "omnigent_site.asgi:application",
    ]


def test_loopback_and_port_8000_by_default() -> None:
    assert daphne_argv([]) == [
        "-e",
        f"tcp:port=8000:interface=127.0.0.1:backlog={listen_backlog()}",
        *WEBSOCKET_DEFAULT_ARGS,
        "omnigent_site.asgi:application",
    ]


def test_an_ipv6_host_is_escaped_as_daphne_escapes_it() -> None:
    assert daphne_argv(["-b", "[::1]", "-p", "1"])[1].startswith(r"tcp:port=1:interface=\:\:1:")


def test_a_port_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(SystemExit, match="--port must be a number"):
        daphne_argv(["--port", "http"])


def test_the_backlog_is_2048_or_the_system_limit_if_lower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = tmp_path / "somaxconn"
    monkeypatch.setattr(serve, "SOMAXCONN", limit)
    limit.write_text("4096\n")
    assert listen_backlog() == 2048
    limit.write_text("128\n")
    assert listen_backlog() == 128


def test_twisted_reads_the_backlog_from_the_endpoint_description() -> None:
    """Guard: the ``backlog`` argument of Twisted's ``tcp:`` endpoint description is what
    the listening socket gets (``tests/e2e/test_listen_backlog.py`` checks the socket)."""
    from twisted.internet import endpoints

    # Any object as the reactor: the endpoint only keeps it (importing Twisted's default
    # reactor here would install it in place of daphne's).
    endpoint = endpoints.serverFromString(object(), daphne_argv(["-p", "0"])[1])
    assert endpoint._backlog == listen_backlog()  # noqa: SLF001 - Twisted keeps no public copy


def test_the_frame_limit_is_not_an_argument_any_more() -> None:
    """The application applies it (``OMNIGENT_MAX_FRAME_BYTES``), so bare daphne gets it
    too; an explicit daphne option still reaches daphne."""
    argv = daphne_argv(["-b", "127.0.0.1", "--websocket-max-message-size", "123"])
    assert argv[argv.index("--websocket-max-message-size") + 1] == "123"
    assert daphne_argv([]).count("--websocket-max-frame-size") == 0


def test_tunnels_are_never_closed_for_age_nor_refused_for_a_slow_handshake() -> None:
    """daphne's defaults closed every WebSocket after a day and answered a handshake its
    application had not accepted within 5 s with a 403, which a runner takes as a bad
    token; a value given on the command line wins."""
    argv = daphne_argv(["--websocket_connect_timeout=7"])
    assert argv[argv.index("--websocket_timeout") + 1] == "-1"
    assert "--websocket_connect_timeout=7" in argv
    assert argv.count("--websocket_connect_timeout") == 0
