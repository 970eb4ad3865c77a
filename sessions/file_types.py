"""What a session file is allowed to be: its name and its type (files.md §1).

Pure functions, no Django, so the rules are unit-tested on their own.

**Type.** The client's ``Content-Type`` is ignored: the type is decided from the bytes
and the name.

1. The first bytes are matched against magic numbers (the ``filetype`` library). PNG,
   JPEG, GIF, WebP and PDF are taken as what the bytes say, whatever the extension.
   Any other recognised binary format (archives, executables, audio, ...) is refused.
2. Bytes with no known magic number are text only if they are valid UTF-8 and hold no
   NUL byte; anything else is refused. Text files must be UTF-8 because the runner
   decodes them to give them to a model as text (Chat Completions).
3. For text, the extension only chooses the subtype: ``.json`` is
   ``application/json``, ``.jsonl``/``.ndjson`` ``application/jsonl``, an extension
   the standard ``mimetypes`` table maps to ``text/*`` keeps that type
   (``text/markdown``, ``text/csv``, ...), everything else is ``text/plain``.
4. A name that promises a binary type (``.png``, ``.pdf``, ...) on bytes that are not
   that type is refused: it is either damaged or not what it says.
"""

from __future__ import annotations

import mimetypes

import filetype

from omnigent_site.domain_errors import InvalidInput, UnsupportedMediaType

# How many leading bytes the magic-number check reads (filetype needs at most 8 KiB).
HEAD_BYTES = 8192
MAX_NAME_BYTES = 255

BINARY_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf"})
IMAGE_TYPES = frozenset(t for t in BINARY_TYPES if t.startswith("image/"))
_BINARY_EXTENSIONS = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".pdf": "application/pdf",
}
_JSON_EXTENSIONS = {
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".ndjson": "application/jsonl",
}
# Text types that are not ``text/*`` but are text all the same.
TEXT_LIKE = frozenset({"application/json", "application/jsonl"})
# Types a browser only shows (with ``nosniff``): a download keeps them. Any other stored
# type (``text/html``, ``text/javascript``, ``text/css``, ``text/xml``, whatever the
# machine's MIME table gave an extension) is served as bytes: from the app's origin it
# could run script as the app (security.md, "Uploaded content").
PASSIVE_TYPES = BINARY_TYPES | TEXT_LIKE | {"text/plain", "text/markdown", "text/csv"}


def check_filename(name: str) -> str:
    """The name as given, or 400: empty, a path separator, NUL, or over 255 bytes."""
    if not name or name in (".", ".."):
        raise InvalidInput("the file needs a name", field="file")
    if "/" in name or "\\" in name:
        raise InvalidInput("a file name cannot contain '/' or '\\'", field="file")
    if "\x00" in name:
        raise InvalidInput("a file name cannot contain NUL", field="file")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput("a file name must be valid Unicode text", field="file") from exc
    if len(encoded) > MAX_NAME_BYTES:
        raise InvalidInput(
            f"a file name can be at most {MAX_NAME_BYTES} bytes of UTF-8", field="file"
        )
    return name


def _extension(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def detect_type(*, name: str, head: bytes, is_text: bool) -> str:
    """The content type of a file, or 415.

    ``head`` is the first ``HEAD_BYTES`` bytes; ``is_text`` says whether the *whole*
    file is valid UTF-8 without NUL (the caller checks it while the bytes stream in).
    """
    extension = _extension(name)
    kind = filetype.guess(head) if head else None
    if kind is not None:
        if kind.mime in BINARY_TYPES:
            return str(kind.mime)
        raise UnsupportedMediaType(
            f"files of type {kind.mime} are not accepted: use text, JSON, PDF, PNG, JPEG, "
            "GIF or WebP"
        )
    if extension in _BINARY_EXTENSIONS:
        raise UnsupportedMediaType(
            f"the name says {_BINARY_EXTENSIONS[extension]} but the bytes are not one"
        )
    if not is_text:
        raise UnsupportedMediaType(
            "the file is neither an accepted binary type (PDF, PNG, JPEG, GIF, WebP) nor UTF-8 text"
        )
    if extension in _JSON_EXTENSIONS:
        return _JSON_EXTENSIONS[extension]
    guessed, _encoding = mimetypes.guess_type("x" + extension) if extension else (None, None)
    if guessed and guessed.startswith("text/"):
        return guessed
    return "text/plain"


def is_text_type(content_type: str) -> bool:
    return content_type.startswith("text/") or content_type in TEXT_LIKE


def is_image_type(content_type: str) -> bool:
    return content_type in IMAGE_TYPES


def served_type(content_type: str) -> str:
    """The ``Content-Type`` a download of a file of this stored type is sent with."""
    if content_type not in PASSIVE_TYPES:
        return "application/octet-stream"
    return f"{content_type}; charset=utf-8" if is_text_type(content_type) else content_type
