"""Parsing ``git status --porcelain=v1 -z`` and ``git diff --numstat -z`` output.

Kept apart from :mod:`workspaces.tools.git_tracker` so the mapping from git's status
codes to the contract's statuses can be read (and tested) on its own.
"""

from __future__ import annotations

import logging
from pathlib import PurePosixPath

from .changes import Status

logger = logging.getLogger(__name__)

EXCLUDED_SEGMENTS = frozenset({".git", "__pycache__", ".venv", "venv", "node_modules"})
# Keeps git from walking excluded trees at all (a large untracked node_modules would
# otherwise be listed file by file); :func:`is_excluded` stays authoritative.
EXCLUDE_PATHSPECS = tuple(
    f":(exclude,glob)**/{seg}/**" for seg in sorted(EXCLUDED_SEGMENTS - {".git"})
)


def is_excluded(rel: str) -> bool:
    return any(part in EXCLUDED_SEGMENTS for part in PurePosixPath(rel).parts)


def parse_status(output: bytes) -> dict[str, list[str]]:
    """``git status --porcelain=v1 -z`` → {top-level path: [XY codes]}.

    A rename or copy (``R``/``C``, followed by the source path) is reported as an
    added new path, and for a rename a deleted source path.
    """
    fields = output.split(b"\0")
    codes: dict[str, list[str]] = {}
    i = 0
    while i < len(fields):
        field = fields[i]
        i += 1
        if len(field) < 4:
            continue
        xy, raw = field[:2].decode("ascii", "replace"), field[3:]
        if xy[0] in "RC":
            source = fields[i] if i < len(fields) else b""
            i += 1
            if xy[0] == "R" and source:
                _add_code(codes, source, "D ")
            xy = "A" + xy[1]
        _add_code(codes, raw, xy)
    return codes


def _add_code(codes: dict[str, list[str]], raw: bytes, xy: str) -> None:
    try:
        path = raw.decode("utf-8")
    except UnicodeDecodeError:
        logger.info("change tracking skips a path that is not UTF-8: %r", raw)
        return
    codes.setdefault(path, []).append(xy)


def status_from_codes(codes: list[str]) -> Status | None:
    """Net status of one path from its status codes; None when there is no net change."""
    untracked = "??" in codes
    staged_delete = any("D" in code for code in codes if code != "??")
    if untracked and staged_delete:
        return "modified"  # deleted from the index, but back on disk
    if untracked:
        return "created"
    code = codes[0]
    if code[0] == "A":
        return None if code[1] == "D" else "created"  # added then removed: nothing
    if "D" in code:
        return "deleted"
    return "modified"


def parse_numstat(output: bytes) -> dict[str, tuple[int | None, int | None]]:
    """``git diff --numstat -z`` (no renames) → {top-level path: (added, removed)}."""
    stats: dict[str, tuple[int | None, int | None]] = {}
    for record in output.split(b"\0"):
        parts = record.split(b"\t", 2)
        if len(parts) != 3:
            continue
        added, removed, raw = parts
        try:
            path = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        stats[path] = (
            None if added == b"-" else int(added),
            None if removed == b"-" else int(removed),
        )
    return stats
