"""Text from a request that is not UTF-8 is refused, not guessed at (http-api.md, Input
strictness).

Django and the libraries under it decode what a client sends with ``errors="replace"``
wherever it is text: multipart fields, form bodies, query strings and, under daphne, the
URL's path. ``\\xc0\\xaf`` (an overlong ``/``), ``\\xed\\xa0\\x80`` (an encoded surrogate), a
truncated sequence or a lone continuation byte silently became ``U+FFFD`` and was stored
or acted on: a session titled ``"\\ufffd("``, a workspace file named ``\\ufffd.txt``. Here
each of those is a 400 ``invalid_input`` instead, and the message names where the bad
byte was and its offset, never the bytes themselves. JSON bodies are checked by
``omnigent_runner.json_text`` (``omnigent_site.json_input``).

* Multipart fields and form bodies: the parsers in ``omnigent_site.parsers`` decode with
  :data:`STRICT_UTF8`, a codec that is UTF-8 refusing every error whatever error handler
  the caller asks for (Django asks for ``replace`` and has no hook for it).
* The URL's path and query string on API paths: :func:`url_problem`, which
  ``omnigent_site.utf8_urls.Utf8UrlMiddleware`` asks before any view runs.
* The identity header: ``omnigent_site.authentication`` through :func:`header_text`.
"""

from __future__ import annotations

import codecs
from urllib.parse import unquote_to_bytes

from django.http import HttpRequest

__all__ = [
    "STRICT_UTF8",
    "NotUtf8",
    "header_text",
    "not_utf8_message",
    "percent_encoded_problem",
    "strict_encoding",
    "url_problem",
    "utf8_problem",
]

STRICT_UTF8 = "omnigent_strict_utf_8"


class NotUtf8(ValueError):
    """Text from a request that is not UTF-8; the message is safe to show."""


def _decode(data: bytes, errors: str = "strict") -> tuple[str, int]:
    # ``errors`` is what the caller asked for ("replace", from Django): always strict.
    return codecs.utf_8_decode(data, "strict", True)


def _encode(text: str, errors: str = "strict") -> tuple[bytes, int]:
    return codecs.utf_8_encode(text, "strict")


def _search(name: str) -> codecs.CodecInfo | None:
    if name != STRICT_UTF8:
        return None
    return codecs.CodecInfo(_encode, _decode, name=STRICT_UTF8)  # type: ignore[arg-type]


codecs.register(_search)


def strict_encoding(encoding: str) -> str:
    """The codec to decode a body declared as ``encoding``: the strict one for UTF-8 (the
    default), the declared one otherwise (every byte of it decodes to text)."""
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        return encoding  # DRF's ``get_encoding`` answers an unknown charset
    return STRICT_UTF8 if name == "utf-8" else encoding


def not_utf8_message(where: str, exc: UnicodeDecodeError) -> str:
    bad = exc.object[exc.start : exc.start + 1].hex()
    return f"{where} is not valid UTF-8 (byte 0x{bad} at offset {exc.start}: {exc.reason})"


def percent_encoded_problem(raw: bytes, where: str) -> str | None:
    """Why ``raw`` (percent-encoded, as in a URL or a form body) does not decode to
    UTF-8, or None. Splitting at ``&``, ``=`` or ``/`` cannot make valid UTF-8 of
    invalid bytes or the reverse (ASCII is never inside a multi-byte sequence), so the
    whole text is decoded at once."""
    if b"%" not in raw and raw.isascii():
        return None
    return utf8_problem(unquote_to_bytes(raw), where)


def utf8_problem(raw: bytes, where: str) -> str | None:
    """Why ``raw`` is not UTF-8, or None."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return not_utf8_message(where, exc)
    return None


def _server_bytes(text: str) -> bytes:
    """Text a server made of bytes, one ISO-8859-1 character each, as those bytes."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8")  # already text (a test client's), not bytes


def header_text(value: str, name: str) -> str:
    """A header's value as the text its bytes spell in UTF-8.

    Servers hand headers over as ISO-8859-1 text (one character per byte); a value
    that is not ASCII is re-read as UTF-8, and refused when it is not.
    """
    if value.isascii():
        return value
    try:
        raw = value.encode("latin-1")
    except UnicodeEncodeError:
        return value  # already text (a test client's header), not bytes
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(not_utf8_message(name, exc)) from None


def url_problem(request: HttpRequest) -> str | None:
    """Why the request's URL (path or query string) is not UTF-8, or None.

    ASGI servers pass the path as sent in ``raw_path`` beside a ``path`` they already
    decoded (daphne with ``errors="replace"``). Under WSGI only the query string is
    checked: Django re-encodes a path's invalid bytes as ``%XX`` there, so nothing is
    replaced, and the bytes as sent are gone."""
    scope = getattr(request, "scope", None)
    raw = scope.get("raw_path") if isinstance(scope, dict) else None
    if isinstance(raw, bytes):
        problem = percent_encoded_problem(raw, "the URL's path")
        if problem:
            return problem
    query = request.META.get("QUERY_STRING") or ""
    return percent_encoded_problem(_server_bytes(query), "the query string") if query else None
