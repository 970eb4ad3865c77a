"""Checks that every JSON input goes through before it is stored.

Every JSON text the server takes from a client (request bodies through
``omnigent_site.parsers.JSONParser``, JSON inside multipart parts) is parsed by
:func:`loads_json`: the project's one JSON path (``omnigent_runner.json_text``, shared
with the tunnel decoders) with the ``OMNIGENT_MAX_JSON_DEPTH`` limit, so deep nesting
and lone surrogates are a 400 before anything is stored.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from omnigent_runner.json_text import JsonTextError, loads

__all__ = ["UNSTORABLE_TEXT", "JsonTextError", "has_unstorable_text", "loads_json"]


def loads_json(data: str | bytes) -> Any:
    """Parse JSON from a client; a refusal is a :class:`JsonTextError` to show it."""
    return loads(data, max_depth=settings.OMNIGENT_MAX_JSON_DEPTH)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
UNSTORABLE_TEXT = "text must not contain NUL characters or lone surrogates"


def has_unstorable_text(value: Any) -> bool:
    """True if a string anywhere in ``value`` (keys too) holds NUL or a lone surrogate.

    PostgreSQL cannot store NUL and UTF-8 cannot encode a lone surrogate, so such JSON
    would fail on write or on render (a 500) instead of being refused as bad input.
    """
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, str):
            if _UNSTORABLE.search(current):
                return True
        elif isinstance(current, dict):
            stack.extend(current.keys())
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return False
