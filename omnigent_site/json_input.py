"""Checks that every JSON input goes through before it is stored."""

from __future__ import annotations

import re
from typing import Any

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
