"""The change-tracker interface and the ``workspace.changes`` payload shape.

A tracker wraps the built-in tools of one session: the agent loop calls
:meth:`ChangeTracker.run_tool` instead of ``sys_os.run_tool`` and emits the returned
payload (when not None) as a ``workspace.changes`` event, and calls
:meth:`ChangeTracker.turn_end` when a turn ends. Payload::

    {"environment_id": "default", "mode": "agent_edit" | "git", "entries": [entry, ...]}

with each entry::

    {"path": "sub/hello.txt", "name": "hello.txt",
     "status": "created" | "modified" | "deleted" | "none",
     "bytes": int | None, "modified_at": int | None,       # unix seconds
     "lines_added": int | None, "lines_removed": int | None,
     "before": str | None, "after": str | None}

``path`` is posix and relative to the tracker root. ``before``/``after`` are the two
sides of the diff endpoint (text up to 1 MiB, else None). An entry **without** the
``before``/``after`` keys tells the server to keep what it stored for that path (git
mode uses this to avoid resending unchanged content). Status ``none`` means the path
has no net change any more and the server drops it. ``attribution`` (``agent`` or
``user``: who made the path's latest change; :meth:`ChangeTracker.user_change` records
a person's) comes with every entry that changed; an entry without it keeps the stored
attribution.
"""

from __future__ import annotations

import abc
import difflib
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

from .fsutil import FileState

Mode = Literal["git", "agent_edit"]
Status = Literal["created", "modified", "deleted", "none"]
Attribution = Literal["agent", "user"]
R = TypeVar("R")

ENVIRONMENT_ID = "default"


class ChangeTracker(abc.ABC):
    """Runs the built-in tools of one session and reports what they changed."""

    mode: Mode
    root: Path

    @abc.abstractmethod
    async def run_tool(
        self, name: str, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Run ``sys_os.run_tool`` in the tracker's root.

        Returns the tool result and the ``workspace.changes`` payload to emit, or None
        when there is nothing new to report. Tracking problems never fail the tool.
        """

    @abc.abstractmethod
    async def turn_end(self) -> dict[str, Any] | None:
        """The payload to emit when a turn ends, or None."""

    @abc.abstractmethod
    async def user_change(
        self, paths: list[str], action: Callable[[], R]
    ) -> tuple[R, dict[str, Any] | None]:
        """Run ``action`` (blocking; in a thread) that writes or deletes ``paths``.

        A change a person makes through the server's workspace API (files.md §2): it
        enters the change set like the agent's own, its entries attributed ``user``.
        ``paths`` are root-relative; a directory stands for everything under it.
        Returns the action's result and the payload to emit, or None. The action's
        exception propagates (nothing is recorded then).
        """

    def payload(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"environment_id": ENVIRONMENT_ID, "mode": self.mode, "entries": entries}


def make_entry(
    path: str,
    status: Status,
    state: FileState,
    lines_added: int | None,
    lines_removed: int | None,
) -> dict[str, Any]:
    """An entry without ``before``/``after`` (the caller adds them when it sends content)."""
    return {
        "path": path,
        "name": PurePosixPath(path).name,
        "status": status,
        "bytes": state.size if state.exists else None,
        "modified_at": state.modified_at if state.exists else None,
        "lines_added": lines_added,
        "lines_removed": lines_removed,
    }


def _split_lines(text: str) -> list[str]:
    """Lines split on "\\n" only (``str.splitlines`` also splits on form feeds etc.)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def diff_line_counts(before: str, after: str) -> tuple[int, int]:
    """Lines added and removed between two texts, as a unified diff would count them."""
    a, b = _split_lines(before), _split_lines(after)
    added = removed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            removed += i2 - i1
        if tag in ("replace", "insert"):
            added += j2 - j1
    return added, removed


def touches(rel: str, paths: Iterable[str]) -> bool:
    """Whether ``rel`` is one of ``paths`` or lies under one of them."""
    return any(rel == path or rel.startswith(path + "/") or path == "." for path in paths)
