"""The one way JSON text from outside is parsed: request bodies and tunnel frames.

Two kinds of valid-looking JSON broke the server before this module existed:

* **Deep nesting.** Parsers and encoders recurse once per level. About 1,000 levels made
  the parser raise ``RecursionError`` (a 500); about 500 levels parsed, were stored, and
  then could not be encoded into the frame for the runner (a 503 with the runner fine).
  So the nesting of the *text* is measured before anything parses it, and text deeper
  than the limit is refused as bad input. The measurement runs at C speed: a frame or
  body with fewer opening brackets than the limit cannot be too deep and is not scanned
  at all; otherwise the strings are cut out with one regular expression and the depth
  is the largest running sum of the remaining brackets.
* **Lone surrogates.** ``"\\ud800"`` is valid JSON syntax, but Python's ``json`` turns
  it into a ``str`` that UTF-8 cannot encode, so storing it, relaying it or echoing it
  in an error message failed later. msgspec refuses it while parsing; the error says
  what was wrong.

Text that is not UTF-8 at all (an overlong form such as ``\\xc0\\xaf``, an encoded
surrogate ``\\xed\\xa0\\x80``, a truncated sequence, a lone continuation byte inside a
string; or a ``str`` holding a raw surrogate) makes msgspec raise ``UnicodeError``
rather than its ``DecodeError``; :func:`loads` and the tunnel decoders refuse it the
same way, with a message that names the byte and its offset, never the bytes.

The server's request parser (``omnigent_site.json_input``) and the tunnel decoders
(``omnigent_runner.protocol``) both parse through :func:`loads` / :func:`check_depth`.
This module is Django-free: the runner uses it too.
"""

from __future__ import annotations

import operator
import re
from itertools import accumulate, count
from typing import Any

import msgspec

DEFAULT_MAX_DEPTH = 64
# The largest limit a deployment may configure: far below the depth at which the JSON
# libraries run out of stack, however deep the caller's own stack already is.
MAX_DEPTH_CEILING = 256
# A tunnel frame wraps what came in through the API in a few levels of its own (the
# frame, ``history``/``input``, the item, its ``data``), so frames may be this much deeper
# than request bodies: whatever the API accepted can always be relayed.
FRAME_DEPTH_MARGIN = 16

_STRING_BYTES = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_KEEP_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# After the strings are gone and only brackets remain: an opening one counts 2, a
# closing one 0, so that ``running sum - position`` is the depth after each bracket.
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_LONE_SURROGATE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_decoder = msgspec.json.Decoder()


class JsonTextError(ValueError):
    """JSON text that is refused; the message is safe to show to whoever sent it."""


def too_deep_message(max_depth: int) -> str:
    return f"JSON nesting deeper than {max_depth} levels"


def nesting_depth(data: str | bytes) -> int:
    """The deepest nesting of arrays and objects in ``data`` (0 for a scalar)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    brackets = _STRING_BYTES.sub(b"", raw).translate(None, _KEEP_BRACKETS)
    steps = brackets.translate(_STEP)
    return max(map(operator.sub, accumulate(steps), count(1)), default=0)


def is_too_deep(data: str | bytes, max_depth: int) -> bool:
    """True if ``data`` nests deeper than ``max_depth`` levels (cheap when it cannot)."""
    if isinstance(data, str):
        openings = data.count("[") + data.count("{")
    else:
        openings = data.count(b"[") + data.count(b"{")
    return openings > max_depth and nesting_depth(data) > max_depth


def check_depth(data: str | bytes, max_depth: int) -> None:
    """Raise :class:`JsonTextError` if ``data`` nests deeper than ``max_depth`` levels."""
    if is_too_deep(data, max_depth):
        raise JsonTextError(too_deep_message(max_depth))


def has_lone_surrogate_escape(data: str | bytes) -> bool:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return _LONE_SURROGATE.search(text) is not None


def not_utf8_message(data: str | bytes, exc: UnicodeError) -> str:
    """What was wrong with text that is not UTF-8, without repeating the text itself
    (the offset is of the whole text: msgspec's counts from the string it was in)."""
    if isinstance(data, bytes):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as whole:
            exc = whole
    if isinstance(exc, UnicodeDecodeError):
        bad = exc.object[exc.start : exc.start + 1].hex()
        return (
            f"not valid JSON text: it is not UTF-8 (byte 0x{bad} at offset {exc.start}: "
            f"{exc.reason})"
        )
    return "not valid JSON text: it contains a lone surrogate, which UTF-8 cannot encode"


def explain_decode_error(data: str | bytes, exc: Exception) -> str:
    """What was wrong with JSON text msgspec refused, in words a client can act on."""
    if has_lone_surrogate_escape(data):
        return "not valid JSON text: it contains a lone surrogate escape (\\ud800-\\udfff)"
    return f"not valid JSON: {exc}"


def loads(data: str | bytes, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse JSON text into plain Python values, refusing what cannot be handled safely.

    Valid UTF-8 only (RFC 8259), no ``NaN``/``Infinity``, no integers beyond 64 bits, no lone
    surrogates, at most ``max_depth`` levels of nesting; every refusal is a
    :class:`JsonTextError`.
    """
    check_depth(data, max_depth)
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise JsonTextError(explain_decode_error(data, exc)) from None
    except (msgspec.ValidationError, RecursionError) as exc:
        raise JsonTextError(f"not valid JSON: {exc}") from None
    except UnicodeError as exc:
        raise JsonTextError(not_utf8_message(data, exc)) from None


_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def shallow(text: str) -> str:
    """``text`` with every array or object below the top level replaced by ``0``.

    For JSON refused as too deep, so that its top-level fields (a frame's ``type`` and
    ``id``) can still be read to answer it. Only used on that error path: it walks the
    brackets in Python.
    """
    parts: list[str] = []
    depth = 0
    kept_from = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        if token in "[{":
            depth += 1
            if depth == 2:
                parts.append(text[kept_from : match.start()])
        else:
            if depth == 2:
                parts.append("0")
                kept_from = match.end()
            depth -= 1
    parts.append(text[kept_from:])
    return "".join(parts)
