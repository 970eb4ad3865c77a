"""Parsing ``git status --porcelain=v1 -z`` and ``git diff --numstat -z`` output.

Kept apart from :mod:`omnigent_runner.tools.git_tracker` so the mapping from git's status
codes to the contract's statuses can be read (and tested) on its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
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


@dataclass
class StatusReport:
    """``git status`` per top-level path, and where each staged rename came from."""

    codes: dict[str, list[str]] = field(default_factory=dict)
    renamed_from: dict[str, str] = field(default_factory=dict)  # new path -> old path


def parse_status(output: bytes) -> StatusReport:
    """``git status --porcelain=v1 -z --renames`` → codes per top-level path.

    A rename (``R``, followed by the source path) is reported under its new path
    only, as the contract says; its source is remembered as the diff baseline. A
    renamed file that was then deleted from the working tree is the source path
    deleted. A copy (``C``) is an added new path.
    """
    fields = output.split(b"\0")
    report = StatusReport()
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        xy, raw = entry[:2].decode("ascii", "replace"), entry[3:]
        if xy[0] in "RC":
            source = fields[i] if i < len(fields) else b""
            i += 1
            if xy[0] == "C":
                xy = "A" + xy[1]
            elif xy[1] == "D":
                if source:
                    _add_code(report.codes, source, "D ")
                continue
            elif source and (old := _decode(source)) is not None and (new := _decode(raw)):
                report.renamed_from[new] = old
        _add_code(report.codes, raw, xy)
    return report


def _decode(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        logger.info("change tracking skips a path that is not UTF-8: %r", raw)
        return None


def _add_code(codes: dict[str, list[str]], raw: bytes, xy: str) -> None:
    path = _decode(raw)
    if path is not None:
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
    if code[0] == "R":
        return "modified"  # the contract: anything but untracked, added or deleted
    if code[0] == "A":
        return None if code[1] == "D" else "created"  # added then removed: nothing
    if "D" in code:
        return "deleted"
    return "modified"


def parse_numstat(output: bytes) -> dict[str, tuple[int | None, int | None]]:
    """``git diff --numstat -z`` → {top-level path: (added, removed)}.

    A rename's record has an empty path followed by the old and the new path; its
    counts (against the old content) go to the new path.
    """
    stats: dict[str, tuple[int | None, int | None]] = {}
    fields = output.split(b"\0")
    i = 0
    while i < len(fields):
        parts = fields[i].split(b"\t", 2)
        i += 1
        if len(parts) != 3:
            continue
        added, removed, raw = parts
        if raw == b"":  # a rename: old path, then new path
            raw = fields[i + 1] if i + 1 < len(fields) else b""
            i += 2
        path = _decode(raw) if raw else None
        if path is None:
            continue
        stats[path] = (
            None if added == b"-" else int(added),
            None if removed == b"-" else int(removed),
        )
    return stats
