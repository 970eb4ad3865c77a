"""DRF's JSON parser, on the project's one JSON path (``omnigent_site.json_input``).

DRF's own parser uses ``json.load``: about 1,000 levels of nesting raise
``RecursionError`` (a 500), and ``"\\ud800"`` becomes a string that cannot be stored or
echoed. This one refuses both, and anything else that is not JSON, as 400
``invalid_input`` before a view sees the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

from .json_input import JsonTextError, loads_json


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
