"""Argument checking for the built-in tools.

The model writes the arguments, so anything may arrive: a missing key, a string where
a number belongs, a bool (which Python treats as an int). Each helper raises
:class:`ToolError` with a message naming the parameter, so the model can correct its
call instead of the turn failing.
"""

from __future__ import annotations

import math
from typing import Any


class ToolError(Exception):
    """A tool-level failure; ``run_tool`` turns it into ``{"error": message}``."""


def require_str(args: dict[str, Any], name: str, *, allow_empty: bool = True) -> str:
    """A required string parameter."""
    if name not in args or args[name] is None:
        raise ToolError(f"missing required parameter '{name}'")
    value = args[name]
    if not isinstance(value, str):
        raise ToolError(f"parameter '{name}' must be a string, got {type(value).__name__}")
    if not allow_empty and not value:
        raise ToolError(f"parameter '{name}' must not be empty")
    return value


def optional_int(args: dict[str, Any], name: str, default: int, *, minimum: int) -> int:
    """An optional integer parameter; integral floats and digit strings are accepted."""
    value = args.get(name)
    if value is None:
        return default
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value.strip())
    if number is None:
        raise ToolError(f"parameter '{name}' must be an integer, got {value!r}")
    if number < minimum:
        raise ToolError(f"parameter '{name}' must be at least {minimum}, got {number}")
    return number


def optional_seconds(args: dict[str, Any], name: str, default: float, *, maximum: float) -> float:
    """An optional positive duration in seconds (int, float or numeric string)."""
    value = args.get(name)
    if value is None:
        return default
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise ToolError(f"parameter '{name}' must be a number of seconds, got {value!r}")
    if number <= 0:
        raise ToolError(f"parameter '{name}' must be greater than 0, got {value!r}")
    if number > maximum:
        raise ToolError(f"parameter '{name}' must be at most {maximum:g} seconds, got {value!r}")
    return number
