"""Client-side function tools the suites send with a message (http-api.md, Events:
``tools`` in OpenAI's format)."""

from __future__ import annotations

from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
