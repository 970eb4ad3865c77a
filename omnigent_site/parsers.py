"""DRF's parsers, refusing what DRF and Django would accept damaged.

* JSON, on the project's one JSON path (``omnigent_site.json_input``). DRF's own parser
  uses ``json.load``: about 1,000 levels of nesting raise ``RecursionError`` (a 500), and
  ``"\\ud800"`` becomes a string that cannot be stored or echoed. This one refuses both,
  text that is not UTF-8, and anything else that is not JSON, as 400 ``invalid_input``
  before a view sees the data.
* Multipart bodies (the uploads; every other body is JSON): Django decodes their text
  fields with ``errors="replace"``, so bytes that are not UTF-8 became ``U+FFFD`` in a stored title.
  These decode UTF-8 strictly (``omnigent_site.utf8_input``) and answer 400 instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from .json_input import JsonTextError, loads_json
from .utf8_input import not_utf8_message, strict_encoding


class JSONParser(parsers.JSONParser):
    def parse(
        self,
        stream: IO[bytes] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            return loads_json(raw)
        except JsonTextError as exc:
            raise ParseError(str(exc)) from None


def strict_context(parser_context: Mapping[str, Any] | None) -> dict[str, Any]:
    """``parser_context`` with a UTF-8 charset (the default) made strict."""
    context = dict(parser_context or {})
    context["encoding"] = strict_encoding(context.get("encoding") or settings.DEFAULT_CHARSET)
    return context


class MultiPartParser(parsers.MultiPartParser):
    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            return super().parse(stream, media_type, strict_context(parser_context))
        except UnicodeDecodeError as exc:
            raise ParseError(not_utf8_message("a multipart field", exc)) from None
