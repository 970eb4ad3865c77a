"""``python -m omnigent_site.serve``: daphne's arguments (the rest is the application's:
``tests/unit/test_runtime_guards.py``, ``tests/e2e/test_bare_daphne.py``)."""

from __future__ import annotations

from omnigent_site.serve import daphne_argv


def test_daphne_gets_the_address_the_options_and_the_app() -> None:
    argv = daphne_argv(["--host", "0.0.0.0", "--port", "9000", "--proxy-headers"])
    assert argv == [
        "-b",
        "0.0.0.0",
        "-p",
        "9000",
        "--proxy-headers",
        "omnigent_site.asgi:application",
    ]


def test_loopback_and_port_8000_by_default() -> None:
    assert daphne_argv([]) == ["-b", "127.0.0.1", "-p", "8000", "omnigent_site.asgi:application"]


def test_the_frame_limit_is_not_an_argument_any_more() -> None:
    """The application applies it (``OMNIGENT_MAX_FRAME_BYTES``), so bare daphne gets it
    too; an explicit daphne option still reaches daphne."""
    argv = daphne_argv(["-b", "127.0.0.1", "--websocket-max-message-size", "123"])
    assert argv[argv.index("--websocket-max-message-size") + 1] == "123"
    assert daphne_argv([]).count("--websocket-max-frame-size") == 0
