"""``python -m omnigent_site.serve``: daphne's arguments and request class."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from daphne import http_protocol
from twisted.web import http

from omnigent_site.serve import daphne_argv, freeze_startup_objects, skip_twisted_form_parsing


@pytest.fixture
def daphne_request_class() -> Iterator[None]:
    """Restore daphne's own request class after the test."""
    original = http_protocol.WebRequest
    try:
        yield
    finally:
        http_protocol.WebRequest = original


def test_daphne_gets_the_frame_limit_the_address_and_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMNIGENT_MAX_FRAME_BYTES", "1234")
    argv = daphne_argv(["--host", "0.0.0.0", "--port", "9000", "--proxy-headers"])
    assert argv[:4] == ["-b", "0.0.0.0", "-p", "9000"]
    assert argv[argv.index("--websocket-max-message-size") + 1] == "1234"
    assert argv[argv.index("--websocket-max-frame-size") + 1] == "1234"
    assert argv[-2:] == ["--proxy-headers", "omnigent_site.asgi:application"]


class FakeChannel:
    """What a request needs of its HTTP channel and daphne server at construction."""

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
def test_twisted_no_longer_parses_post_bodies_as_forms() -> None:
    assert skip_twisted_form_parsing()
    request_class = http_protocol.WebRequest
    assert issubclass(request_class, http.Request)
    request = request_class(FakeChannel())
    assert request._parsePOSTFormSubmission is False
    # Installing twice does not stack subclasses.
    assert skip_twisted_form_parsing()
    assert http_protocol.WebRequest is request_class


def test_startup_objects_are_frozen_out_of_full_collections() -> None:
    gc.unfreeze()
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > 10_000  # Django, DRF, Twisted, the app
    finally:
        gc.unfreeze()
