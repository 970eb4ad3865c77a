"""``sys_os_read``, ``sys_os_write`` and ``sys_os_edit``: blocking implementations.

These functions do plain blocking I/O; :func:`omnigent_runner.tools.sys_os.run_tool` calls
them through ``asyncio.to_thread`` so a large file never stalls the runner's event
loop (which also carries the tunnel heartbeats). Each returns the result dict of
agents.md or raises :class:`ToolError` / :class:`PathError`.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

from .arguments import ToolError, optional_int, require_str
from .fsutil import atomic_write, resolve_in_root

DEFAULT_READ_LIMIT = 2000


def _existing_file(root: Path, path: str) -> tuple[Path, str]:
    """Resolve ``path`` and require an existing regular file (not a directory)."""
    target, rel = resolve_in_root(root, path)
    if target.is_dir():
        raise ToolError(f"'{path}' is a directory, not a file")
    if not target.exists():
        raise ToolError(f"File not found: '{path}'")
    return target, rel


def read_file(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Return lines ``offset``..``offset+limit-1`` (1-based) of a text file.

    The file is streamed line by line so only the requested window is held in
    memory, while every line is still decoded to tell text from binary and counted
    for ``total_lines``. Binary files are not returned: the model gets the size.
    """
    path = require_str(args, "path", allow_empty=False)
    offset = optional_int(args, "offset", 1, minimum=1)
    limit = optional_int(args, "limit", DEFAULT_READ_LIMIT, minimum=1)
    target, rel = _existing_file(root, path)

    decoder = codecs.getincrementaldecoder("utf-8")()
    selected: list[str] = []
    total = 0
    size = 0
    binary = False
    try:
        with open(target, "rb") as fh:
            for raw in fh:  # splits on b"\n", which never occurs inside a UTF-8 sequence
                size += len(raw)
                total += 1
                if binary:
                    continue
                if b"\x00" in raw:
                    binary = True
                    continue
                try:
                    line = decoder.decode(raw)
                except UnicodeDecodeError:
                    binary = True
                    continue
                if offset <= total < offset + limit:
                    selected.append(line)
    except OSError as exc:
        raise ToolError(f"Cannot read '{path}': {exc.strerror or exc}") from exc

    if binary:
        return {
            "path": rel,
            "content": "",
            "encoding": "base64",
            "offset": offset,
            "limit": limit,
            "returned_lines": 0,
            "total_lines": 0,
            "bytes": size,
            "note": f"binary file ({size} bytes); content not shown",
        }
    result: dict[str, Any] = {
        "path": rel,
        "content": "".join(selected),
        "encoding": "utf-8",
        "offset": offset,
        "limit": limit,
        "returned_lines": len(selected),
        "total_lines": total,
    }
    if offset > total and total > 0:
        result["note"] = f"offset {offset} is past the end of the file ({total} lines)"
    return result


def write_file(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Replace (or create) a file with ``content``, creating parent folders."""
    path = require_str(args, "path", allow_empty=False)
    content = require_str(args, "content")
    target, rel = resolve_in_root(root, path)
    if target.is_dir():
        raise ToolError(f"'{path}' is a directory, not a file")
    data = content.encode("utf-8")
    created = not target.exists()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, data)
    except OSError as exc:
        raise ToolError(f"Cannot write '{path}': {exc.strerror or exc}") from exc
    return {"path": rel, "bytes_written": len(data), "created": created}


def _edit_list(args: dict[str, Any]) -> list[tuple[str, str]]:
    """The requested replacements, from either ``oldText``/``newText`` or ``edits``."""
    has_single = "oldText" in args or "newText" in args
    edits = args.get("edits")
    if has_single and edits is not None:
        raise ToolError("give either 'oldText' and 'newText' or 'edits', not both")
    if edits is None:
        if not has_single:
            raise ToolError("missing required parameter 'oldText' (or 'edits')")
        return [(require_str(args, "oldText", allow_empty=False), require_str(args, "newText"))]
    if not isinstance(edits, list) or not edits:
        raise ToolError("parameter 'edits' must be a non-empty list of {oldText, newText}")
    pairs = []
    for number, edit in enumerate(edits, start=1):
        if not isinstance(edit, dict):
            raise ToolError(f"edits #{number} must be an object with 'oldText' and 'newText'")
        try:
            pairs.append(
                (require_str(edit, "oldText", allow_empty=False), require_str(edit, "newText"))
            )
        except ToolError as exc:
            raise ToolError(f"edits #{number}: {exc}") from exc
    return pairs


def _count_matches(text: str, needle: str) -> int:
    """Occurrences of ``needle``, overlapping ones included (they make a match ambiguous)."""
    count = 0
    start = text.find(needle)
    while start != -1:
        count += 1
        start = text.find(needle, start + 1)
    return count


def editable_text(target: Path, path: str) -> str:
    """The UTF-8 text of a file about to be edited (binary and non-UTF-8 files refuse)."""
    try:
        data = target.read_bytes()
    except OSError as exc:
        raise ToolError(f"Cannot read '{path}': {exc.strerror or exc}") from exc
    if b"\x00" in data:
        raise ToolError(f"'{path}' is a binary file and cannot be edited")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"'{path}' is not UTF-8 text and cannot be edited") from exc


def apply_edits(
    text: str, pairs: list[tuple[str, str]], *, single: bool, replace_all: bool = False
) -> str:
    """``text`` with each (old, new) replacement applied in order, or :class:`ToolError`.

    Each ``old`` must occur exactly once in the text as it is at that point; with
    ``replace_all`` (the workspace API's option) every occurrence is replaced and at
    least one is needed. Shared by ``sys_os_edit`` and ``PATCH …/filesystem/{path}``.
    """
    for number, (old, new) in enumerate(pairs, start=1):
        matches = _count_matches(text, old)
        label = "oldText" if single else f"oldText #{number}"
        if replace_all and matches >= 1:
            text = text.replace(old, new)
            continue
        if matches != 1:
            raise ToolError(
                f"{label} matched {matches} times; it must match "
                + ("at least once" if replace_all else "exactly once")
                + (" (no changes were made)" if not single else "")
            )
        text = text.replace(old, new, 1)
    return text


def edit_file(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Apply exact-text replacements, all or nothing.

    Replacements apply in order to an in-memory copy; each ``oldText`` must occur
    exactly once in the copy as it is at that point. The file is written once, only
    when every replacement matched, so a failed edit leaves it untouched.
    """
    path = require_str(args, "path", allow_empty=False)
    pairs = _edit_list(args)
    target, rel = _existing_file(root, path)
    text = apply_edits(editable_text(target, path), pairs, single=args.get("edits") is None)
    out = text.encode("utf-8")
    try:
        atomic_write(target, out)
    except OSError as exc:
        raise ToolError(f"Cannot write '{path}': {exc.strerror or exc}") from exc
    return {"path": rel, "replacements": len(pairs), "bytes_written": len(out)}
