"""``python -m omnigent_site.serve``: daphne's arguments and the Content-Type parse cache."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from twisted.web import http

from omnigent_site.serve import cache_content_type_parsing, daphne_argv


@pytest.fixture
def twisted_parse() -> Iterator[None]:
    """Restore Twisted's own function after the test."""
    original = http._parseContentType
    try:
        yield
    finally:
        http._parseContentType = original


def test_daphne_gets_the_frame_limit_the_address_and_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMNIGENT_MAX_FRAME_BYTES", "1234")
    argv = daphne_argv(["--host", "0.0.0.0", "--port", "9000", "--proxy-headers"])
    assert argv[:4] == ["-b", "0.0.0.0", "-p", "9000"]
    assert argv[argv.index("--websocket-max-message-size") + 1] == "1234"
    assert argv[argv.index("--websocket-max-frame-size") + 1] == "1234"
    assert argv[-2:] == ["--proxy-headers", "omnigent_site.asgi:application"]


@pytest.mark.usefixtures("twisted_parse")
def test_content_type_parsing_is_cached_with_the_same_answers() -> None:
    original = getattr(http._parseContentType, "__wrapped__", http._parseContentType)
    headers = [
        b"application/json",
        b"application/json; charset=utf-8",
        b"Multipart/Form-Data; boundary=abc",
        b"application/x-www-form-urlencoded",
        b"text/plain;charset=latin-1",
        b"not a content type",
    ]
    assert cache_content_type_parsing()
    cached = http._parseContentType
    assert hasattr(cached, "cache_info")
    for header in headers:
        assert cached(header) == original(header)
        assert cached(header) == original(header)
    assert cached.cache_info().hits >= len(headers)
    # Installing twice does not wrap the cache in another cache.
    assert cache_content_type_parsing()
    assert http._parseContentType is cached
