"""Session files: name and type rules, the byte store, the body limit, and what the
runner gives each model API (files.md §1). No database."""

from __future__ import annotations

import base64
import hashlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daphne import http_protocol
from twisted.web import http

from omnigent_runner.transcript import to_chat_messages, to_responses_input
from omnigent_site.domain_errors import InvalidInput, UnsupportedMediaType
from omnigent_site.runtime import body_limit
from sessions import file_store
from sessions.file_types import check_filename, detect_type, served_type
from testing.mockllm import files_received

from ..api.files_helpers import PDF_BYTES, ZIP_BYTES, png_bytes

# --- names ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/abs", "a\\b", "nul\x00", "é" * 128])
def test_refused_names(name: str) -> None:
    with pytest.raises(InvalidInput):
        check_filename(name)


@pytest.mark.parametrize("name", ["report.txt", ".hidden", "a b (1).md", "ü" * 127 + "x"])
def test_accepted_names(name: str) -> None:
    assert check_filename(name) == name


def test_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(InvalidInput):
        check_filename("bad\udc80.txt")


# --- served types -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "stored",
    [
        "text/html",
        "application/xhtml+xml",
        "image/svg+xml",
        "text/xml",
        "application/xml",
        "application/xslt+xml",
        "text/javascript",
        "application/javascript",
        "text/css",
        "text/x-python",
        "",
    ],
)
def test_anything_but_a_passive_type_is_served_as_bytes(stored: str) -> None:
    assert served_type(stored) == "application/octet-stream"


@pytest.mark.parametrize(
    ("stored", "served"),
    [
        ("text/plain", "text/plain; charset=utf-8"),
        ("text/markdown", "text/markdown; charset=utf-8"),
        ("application/json", "application/json; charset=utf-8"),
        ("image/png", "image/png"),
        ("application/pdf", "application/pdf"),
    ],
)
def test_passive_types_are_served_as_stored(stored: str, served: str) -> None:
    assert served_type(stored) == served


# --- types ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "head", "is_text", "expected"),
    [
        ("x.png", png_bytes(), False, "image/png"),
        ("no-extension", png_bytes(), False, "image/png"),
        ("renamed.txt", png_bytes(), False, "image/png"),
        ("doc.pdf", PDF_BYTES, True, "application/pdf"),
        ("photo.jpg", b"\xff\xd8\xff\xe0" + b"\x00" * 20, False, "image/jpeg"),
        ("anim.gif", b"GIF89a" + b"\x00" * 20, False, "image/gif"),
        ("pic.webp", b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 20, False, "image/webp"),
        ("data.json", b'{"a": 1}', True, "application/json"),
        ("rows.JSONL", b"{}\n", True, "application/jsonl"),
        ("rows.ndjson", b"{}\n", True, "application/jsonl"),
        ("notes.md", b"# hi", True, "text/markdown"),
        ("table.csv", b"a,b\n", True, "text/csv"),
        ("config.toml.bak", b"a = 1", True, "text/plain"),
        ("README", b"plain words", True, "text/plain"),
        ("empty.txt", b"", True, "text/plain"),
    ],
)
def test_detected_types(name: str, head: bytes, is_text: bool, expected: str) -> None:
    assert detect_type(name=name, head=head, is_text=is_text) == expected


@pytest.mark.parametrize(
    ("name", "head", "is_text"),
    [
        ("a.zip", ZIP_BYTES, False),
        ("a.txt", ZIP_BYTES, False),  # an archive whatever its name
        ("fake.png", b"just text", True),  # the name promises an image
        ("fake.pdf", b"just text", True),
        ("blob.bin", b"\x00\x01\x02", False),  # neither a known binary nor text
        ("song.mp3", b"ID3\x03\x00\x00\x00" + b"\x00" * 20, False),
    ],
)
def test_refused_types(name: str, head: bytes, is_text: bool) -> None:
    with pytest.raises(UnsupportedMediaType):
        detect_type(name=name, head=head, is_text=is_text)


# --- the byte store ---------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Path, settings: Any) -> Path:
    settings.DATA_DIR = tmp_path
    return tmp_path


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in (root / "files").rglob("*") if p.is_file())


def test_writer_hashes_counts_and_places_atomically(data_dir: Path) -> None:
    writer = file_store.BlobWriter(limit=100)
    for chunk in (b"hello ", "wörld".encode()):
        writer.write(chunk)
    # Before ``place`` only a temporary file exists, never the final name.
    assert [p.name.startswith(file_store.TEMP_PREFIX) for p in files_under(data_dir)] == [True]
    sha = writer.finish()
    assert sha == hashlib.sha256("hello wörld".encode()).hexdigest()
    assert writer.is_text and writer.size == len("hello wörld".encode())
    assert writer.place() is True
    assert files_under(data_dir) == [file_store.blob_path(sha)]
    again = file_store.BlobWriter(limit=100)
    again.write("hello wörld".encode())
    again.finish()
    assert again.place() is False  # deduplicated: the temporary copy is dropped
    assert files_under(data_dir) == [file_store.blob_path(sha)]


def test_writer_over_the_limit_leaves_nothing(data_dir: Path) -> None:
    writer = file_store.BlobWriter(limit=10)
    writer.write(b"12345")
    with pytest.raises(file_store.TooLarge):
        writer.write(b"678901")
    assert files_under(data_dir) == []
    writer.discard()  # harmless again


def test_writer_text_check_spans_chunks(data_dir: Path) -> None:
    encoded = "é".encode()
    writer = file_store.BlobWriter(limit=100)
    writer.write(encoded[:1])
    writer.write(encoded[1:])
    writer.finish()
    assert writer.is_text
    truncated = file_store.BlobWriter(limit=100)
    truncated.write(encoded[:1])
    truncated.finish()
    assert not truncated.is_text  # an incomplete sequence at the end
    with_nul = file_store.BlobWriter(limit=100)
    with_nul.write(b"a\x00b")
    with_nul.finish()
    assert not with_nul.is_text
    for used in (writer, truncated, with_nul):
        used.discard()


# --- the body limit at the socket (runtime guard) ----------------------------------------


@pytest.fixture
def limited_request_class() -> Iterator[type]:
    original = http_protocol.WebRequest
    saved = dict(body_limit._limits)
    body_limit.limit_request_body(r"^/upload$", lambda: 10)
    try:
        assert body_limit.install()
        yield http_protocol.WebRequest
    finally:
        http_protocol.WebRequest = original
        body_limit._limits.clear()
        body_limit._limits.update(saved)


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def loseConnection(self) -> None:  # noqa: N802 - Twisted's name
        self.closed = True


class FakeChannel:
    def __init__(self, path: bytes) -> None:
        self._path = path
        self.transport = FakeTransport()

    class factory:  # noqa: N801
        class server:  # noqa: N801
            @staticmethod
            def protocol_connected(request: object) -> None:
                return None

    def getPeer(self) -> None:  # noqa: N802
        return None

    def getHost(self) -> None:  # noqa: N802
        return None


def test_twisted_still_calls_what_the_body_limit_overrides() -> None:
    """Guard: the channel reads the body through ``gotLength`` (after the request line
    set ``_path``) and ``handleContentChunk``, and calls ``process`` at the end."""
    source = inspect.getsource(http.HTTPChannel)
    assert "req.gotLength(self.length)" in source
    assert "self._path = request" in source
    assert "self.requests[-1].handleContentChunk" in source
    assert "self.process()" in inspect.getsource(http.Request.requestReceived)


def test_a_length_over_the_limit_is_refused_before_the_body(limited_request_class: type) -> None:
    channel = FakeChannel(b"/upload?x=1")
    request = limited_request_class(channel)
    request.requestHeaders.setRawHeaders(b"expect", [b"100-continue"])
    request.gotLength(11)
    assert channel.transport.written.startswith(b"HTTP/1.1 413 Payload Too Large\r\n")
    assert b'"payload_too_large"' in channel.transport.written
    assert not request.requestHeaders.hasHeader(b"expect")
    request.handleContentChunk(b"x" * 100)
    assert request.content.getvalue() == b""  # dropped, not stored


def test_a_chunked_body_is_counted(limited_request_class: type) -> None:
    channel = FakeChannel(b"/upload")
    request = limited_request_class(channel)
    request.gotLength(None)
    request.handleContentChunk(b"x" * 10)
    assert channel.transport.written == b""
    request.handleContentChunk(b"y")
    assert channel.transport.written.startswith(b"HTTP/1.1 413")
    assert request.body_refused


def test_a_percent_encoded_path_is_caught(limited_request_class: type) -> None:
    channel = FakeChannel(b"/%75pload")
    request = limited_request_class(channel)
    request.gotLength(11)
    assert channel.transport.written.startswith(b"HTTP/1.1 413")


def test_other_paths_take_what_django_would_take(
    limited_request_class: type, settings: Any
) -> None:
    """Unregistered paths get the default limit: Django's caps plus 1 MiB of framing."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1000
    limit = 2000 + 1024 * 1024
    channel = FakeChannel(b"/v1/sessions")
    request = limited_request_class(channel)
    request.gotLength(limit)
    request.handleContentChunk(b"z" * 1000)
    assert channel.transport.written == b""
    request.content.seek(0)
    assert request.content.read() == b"z" * 1000
    refused = FakeChannel(b"/v1/sessions")
    limited_request_class(refused).gotLength(limit + 1)
    assert refused.transport.written.startswith(b"HTTP/1.1 413")


def test_no_django_limit_means_no_default_limit(limited_request_class: type, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = None
    channel = FakeChannel(b"/elsewhere")
    request = limited_request_class(channel)
    request.gotLength(10**12)
    assert channel.transport.written == b""


# --- what each model API receives --------------------------------------------------------


def uri(media: str, raw: bytes) -> str:
    return f"data:{media};base64," + base64.b64encode(raw).decode()


ITEM: dict[str, Any] = {
    "type": "message",
    "role": "user",
    "content": [
        {"type": "input_text", "text": "see"},
        {
            "type": "input_file",
            "file_id": "file_1",
            "filename": "a.txt",
            "file_data": uri("text/plain", b"hi there"),
        },
        {
            "type": "input_image",
            "file_id": "file_2",
            "filename": "p.png",
            "image_url": uri("image/png", png_bytes()),
        },
        {
            "type": "input_file",
            "file_id": "file_3",
            "filename": "d.pdf",
            "file_data": uri("application/pdf", PDF_BYTES),
        },
        {"type": "input_file", "file_id": "file_4", "filename": "old.txt"},
    ],
}
NOTE = "[file 'old.txt' was attached here; its content is not repeated in this history]"


def test_responses_input_parts() -> None:
    [message] = to_responses_input([ITEM])
    assert message["role"] == "user"
    assert message["content"] == [
        {"type": "input_text", "text": "see"},
        {"type": "input_file", "file_data": ITEM["content"][1]["file_data"], "filename": "a.txt"},
        {"type": "input_image", "image_url": ITEM["content"][2]["image_url"], "detail": "auto"},
        {"type": "input_file", "file_data": ITEM["content"][3]["file_data"], "filename": "d.pdf"},
        {"type": "input_text", "text": NOTE},
    ]
    received = files_received({"input": [message]})
    assert [(f["part"], f["media_type"]) for f in received] == [
        ("input_file", "text/plain"),
        ("input_image", "image/png"),
        ("input_file", "application/pdf"),
    ]


def test_chat_parts() -> None:
    [message] = to_chat_messages("", [ITEM])
    assert message["content"] == [
        {"type": "text", "text": "see"},
        {"type": "text", "text": "[file 'a.txt']\nhi there"},
        {"type": "image_url", "image_url": {"url": ITEM["content"][2]["image_url"]}},
        {
            "type": "file",
            "file": {"file_data": ITEM["content"][3]["file_data"], "filename": "d.pdf"},
        },
        {"type": "text", "text": NOTE},
    ]
    received = files_received({"messages": [message]})
    assert [(f["part"], f["filename"]) for f in received] == [
        ("image_url", None),
        ("file", "d.pdf"),
    ]


def test_messages_without_files_keep_their_old_form() -> None:
    plain = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    assert to_responses_input([plain]) == [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ]
    assert to_chat_messages("", [plain]) == [{"role": "user", "content": "hi"}]
