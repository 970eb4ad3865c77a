"""Change tracking for workspaces without git: record what the agent's tools changed.

Only a **successful** ``sys_os_write`` or ``sys_os_edit`` is recorded. Side effects of
``sys_os_shell`` (files a command creates, edits or deletes) are **not tracked** in
this mode: there is no cheap, reliable way to attribute them to a session without a
version-control baseline. Use a git workspace for full tracking.

Each path keeps the first and the last operation recorded for it in the session, and
the content it had before the first one (the diff baseline). The reported status is
a function of (first, last), :data:`NET_STATUS`. The agent tools never delete a file,
but :meth:`AgentEditTracker.record` accepts a ``deleted`` operation so the whole table
holds for any future caller (and is tested as such).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from . import sys_os
from .changes import Attribution, ChangeTracker, R, Status, diff_line_counts, make_entry
from .fsutil import FileState, PathError, file_state, read_text_capped, resolve_in_root

Op = Literal["created", "modified", "deleted"]

#: (first op, last op) -> reported status (agents.md, "Workspace change tracking").
#: "none" = no net change: the path is sent with status "none" so the server drops it.
NET_STATUS: dict[tuple[Op, Op], Status] = {
    ("created", "created"): "created",
    ("created", "modified"): "created",
    ("created", "deleted"): "none",
    ("modified", "modified"): "modified",
    ("modified", "created"): "modified",
    ("modified", "deleted"): "deleted",
    ("deleted", "created"): "modified",
    ("deleted", "modified"): "modified",
    ("deleted", "deleted"): "deleted",
}

_RECORDING_TOOLS = frozenset({"sys_os_write", "sys_os_edit"})


def is_editor_leftover(name: str) -> bool:
    """Backup, swap and temp files editors leave behind; never worth reporting."""
    return name.endswith((".tmp", "~", ".swp", ".swo")) or (
        len(name) > 1 and name.startswith("#") and name.endswith("#")
    )


@dataclass
class _PathRecord:
    first: Op
    last: Op
    baseline_existed: bool
    baseline_text: str | None  # None: did not exist, binary, or larger than 1 MiB


@dataclass(frozen=True)
class _Baseline:
    existed: bool
    text: str | None


class AgentEditTracker(ChangeTracker):
    """Records the session's successful writes and edits, path by path."""

    mode = "agent_edit"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._records: dict[str, _PathRecord] = {}
        # Serialises write/edit calls so the baseline captured before a tool is the
        # content that tool replaced, even when the model issues parallel calls.
        self._lock = asyncio.Lock()

    def _normalise(self, path: str) -> str | None:
        """``path`` as a clean root-relative posix path, or None if it is not recordable."""
        pure = PurePosixPath(path)
        if not path or pure.is_absolute() or ".." in pure.parts:
            return None
        rel = pure.as_posix()
        if rel == "." or is_editor_leftover(pure.name):
            return None
        return rel

    def record(
        self,
        path: str,
        op: Op,
        *,
        baseline_existed: bool | None = None,
        baseline_text: str | None = None,
    ) -> str | None:
        """Record ``op`` on ``path`` (relative to the root); return the recorded path.

        Returns None (and records nothing) for editor leftovers and paths outside the
        root. The baseline is only kept from a path's first operation; when not given
        it is inferred from ``op`` (a file that was created did not exist before).
        """
        if op not in ("created", "modified", "deleted"):
            raise ValueError(f"unknown operation {op!r}")
        rel = self._normalise(path)
        if rel is None:
            return None
        existing = self._records.get(rel)
        if existing is None:
            existed = op != "created" if baseline_existed is None else baseline_existed
            self._records[rel] = _PathRecord(op, op, existed, baseline_text if existed else None)
        else:
            existing.last = op
        return rel

    def net_status(self, path: str) -> Status | None:
        """The reported status of a recorded path, or None if it was never recorded."""
        record = self._records.get(path)
        return None if record is None else NET_STATUS[(record.first, record.last)]

    def entry(self, path: str, attribution: Attribution = "agent") -> dict[str, Any]:
        """The full entry of a recorded path, from its record and the file as it is now."""
        record = self._records[path]
        status = NET_STATUS[(record.first, record.last)]
        if status == "none":
            entry = make_entry(path, status, FileState(exists=False), None, None)
            entry.update(before=None, after=None, attribution=attribution)
            return entry
        state = file_state(self.root / path) if status != "deleted" else FileState(False)
        after = read_text_capped(self.root / path) if state.exists else None
        before_side = record.baseline_text if record.baseline_existed else ""
        after_side = after if state.exists else ""
        if before_side is None or after_side is None:
            added = removed = None  # one side is binary or too large to diff
        else:
            added, removed = diff_line_counts(before_side, after_side)
        entry = make_entry(path, status, state, added, removed)
        entry.update(before=record.baseline_text, after=after, attribution=attribution)
        return entry

    def _capture(self, path: Any) -> _Baseline | None:
        """The target's content before a write or edit (None if the path is invalid)."""
        try:
            target, _ = resolve_in_root(self.root, path)
        except PathError:
            return None
        state = file_state(target)
        return _Baseline(state.exists, read_text_capped(target) if state.exists else None)

    async def run_tool(
        self, name: str, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        if name not in _RECORDING_TOOLS or not isinstance(arguments, dict):
            return await sys_os.run_tool(name, arguments, root=self.root), None
        async with self._lock:
            baseline = await asyncio.to_thread(self._capture, arguments.get("path"))
            result = await sys_os.run_tool(name, arguments, root=self.root)
            if "error" in result or baseline is None:
                return result, None
            op: Op = "created" if name == "sys_os_write" and result.get("created") else "modified"
            rel = self.record(
                str(result.get("path", "")),
                op,
                baseline_existed=baseline.existed,
                baseline_text=baseline.text,
            )
            if rel is None:
                return result, None
            entry = await asyncio.to_thread(self.entry, rel)
        return result, self.payload([entry])

    async def turn_end(self) -> dict[str, Any] | None:
        """Nothing to do: every change was reported when it happened."""
        return None

    async def user_change(
        self, paths: list[str], action: Callable[[], R]
    ) -> tuple[R, dict[str, Any] | None]:
        """Record a person's write, edit or delete like the agent's, attributed ``user``.

        Under the same lock as the agent's tools, so the baseline captured is the
        content the action replaced. A directory in ``paths`` must already be expanded
        to its files by the caller (this mode records files only).
        """
        async with self._lock:
            baselines = await asyncio.to_thread(self._capture_many, paths)
            result = await asyncio.to_thread(action)
            entries = await asyncio.to_thread(self._user_entries, baselines)
        return result, (self.payload(entries) if entries else None)

    def _capture_many(self, paths: list[str]) -> dict[str, _Baseline]:
        return {
            rel: _Baseline(
                state.exists, read_text_capped(self.root / rel) if state.exists else None
            )
            for rel in paths
            for state in [file_state(self.root / rel)]
        }

    def _user_entries(self, baselines: dict[str, _Baseline]) -> list[dict[str, Any]]:
        entries = []
        for rel, baseline in baselines.items():
            exists = file_state(self.root / rel).exists
            if not baseline.existed and not exists:
                continue
            op: Op = (
                "modified" if baseline.existed and exists else "created" if exists else "deleted"
            )
            recorded = self.record(
                rel, op, baseline_existed=baseline.existed, baseline_text=baseline.text
            )
            if recorded is not None:
                entries.append(self.entry(recorded, "user"))
        return entries
