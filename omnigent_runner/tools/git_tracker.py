"""Change tracking for git workspaces: the working tree against ``HEAD``.

After every tool call (shell included, failed ones too: a failing command may still
have changed files) and at the end of each turn, the tracker asks git what differs
from ``HEAD`` under the tracker root and sends the **full** set, which replaces the
session's stored set on the server. Because git sees everything, shell side effects
are tracked in this mode.

To keep events small, the tracker remembers a fingerprint per path of what it last
sent (status, size, mtime, ``HEAD``): an entry whose fingerprint did not change is
sent without ``before``/``after`` (the server keeps the stored content), and a set
whose fingerprints did not change at all produces no event.

Git runs as asyncio subprocesses with a 30 s deadline per snapshot, with
``GIT_OPTIONAL_LOCKS=0`` so the tracker never holds the index lock while the agent's
own git commands run.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import sys_os
from .changes import ChangeTracker, R, Status, make_entry, touches
from .fsutil import MAX_TEXT_BYTES, count_file_lines, decode_text, file_state, read_text_capped
from .git_parse import (
    EXCLUDE_PATHSPECS,
    is_excluded,
    parse_numstat,
    parse_status,
    status_from_codes,
)

logger = logging.getLogger(__name__)

GIT_DEADLINE = 30.0
_Fingerprint = tuple[str, int | None, int | None, str | None]
# Renames are detected (whatever the user's git config says) so that a staged rename is
# reported under its new path, with line counts and ``before`` from its old path.
_STATUS_ARGS = ("status", "--porcelain=v1", "-z", "--renames", "--untracked-files=all")
_DIFF_ARGS = ("diff", "--numstat", "-z", "--find-renames", "--no-ext-diff", "--no-textconv")


class GitError(Exception):
    """A git command failed; the snapshot is skipped (and logged)."""


@dataclass(frozen=True)
class _Change:
    rel: str  # relative to the tracker root
    baseline: str  # the path in HEAD, relative to the repository top level (its old
    # path for a rename)
    status: Status
    numstat: tuple[int | None, int | None] | None


class GitTracker(ChangeTracker):
    """Reports ``git status`` / ``git diff HEAD`` under the root after every tool call."""

    mode = "git"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._prefix: str | None = None  # the root relative to the repo top level
        self._sent: dict[str, _Fingerprint] = {}
        self._lock = asyncio.Lock()
        self._env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"}

    async def run_tool(
        self, name: str, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        result = await sys_os.run_tool(name, arguments, root=self.root)
        return result, await self._payload_or_none()

    async def turn_end(self) -> dict[str, Any] | None:
        return await self._payload_or_none()

    async def user_change(
        self, paths: list[str], action: Callable[[], R]
    ) -> tuple[R, dict[str, Any] | None]:
        """Run a person's change, then snapshot: what changed under ``paths`` is ``user``'s.

        Both under the snapshot lock, so an agent's snapshot cannot come in between and
        report the person's change as the agent's.
        """
        async with self._lock:
            result = await asyncio.to_thread(action)
            return result, await self._payload_or_none(user_paths=paths, locked=True)

    async def _payload_or_none(
        self, user_paths: list[str] | None = None, *, locked: bool = False
    ) -> dict[str, Any] | None:
        """A snapshot within the deadline; tracking trouble is logged, never raised."""
        try:
            async with asyncio.timeout(GIT_DEADLINE):
                if locked:
                    return await self._snapshot(user_paths or [])
                return await self.snapshot(user_paths=user_paths)
        except TimeoutError:
            logger.warning("git change tracking in %s took over %ss", self.root, GIT_DEADLINE)
        except (GitError, OSError) as exc:
            logger.warning("git change tracking in %s failed: %s", self.root, exc)
        return None

    async def snapshot(self, user_paths: list[str] | None = None) -> dict[str, Any] | None:
        """The payload for the current working tree, or None if unchanged since the last.

        Entries that changed since the last snapshot are attributed ``user`` when they
        lie under ``user_paths`` (a person's change through the server), else ``agent``.
        """
        async with self._lock:
            return await self._snapshot(user_paths or [])

    async def _snapshot(self, user_paths: list[str]) -> dict[str, Any] | None:
        """:meth:`snapshot` for a caller that holds the lock."""
        if self._prefix is None:
            self._prefix = (await self._git("rev-parse", "--show-prefix")).decode().strip()
        head = await self._head()
        changes = await self._changes(head)
        entries, fingerprints, wanted = await asyncio.to_thread(
            self._local, changes, head, user_paths
        )
        if fingerprints == self._sent:
            return None
        if wanted and head is not None:
            blobs = await self._head_texts(wanted)
            for entry in entries:
                if entry["path"] in wanted:
                    entry["before"] = blobs.get(entry["path"])
        self._sent = fingerprints
        return self.payload(entries)

    async def _head(self) -> str | None:
        """The ``HEAD`` commit id, or None in a repository without commits."""
        try:
            out = await self._git("rev-parse", "--verify", "-q", "HEAD^{commit}")
        except GitError:
            return None
        return out.decode().strip() or None

    async def _changes(self, head: str | None) -> list[_Change]:
        status_out = await self._git(*_STATUS_ARGS, "--", ".", *EXCLUDE_PATHSPECS)
        numstat: dict[str, tuple[int | None, int | None]] = {}
        if head is not None:
            diff_out = await self._git(*_DIFF_ARGS, head, "--", ".", *EXCLUDE_PATHSPECS)
            numstat = parse_numstat(diff_out)
        prefix = self._prefix or ""
        changes = []
        report = parse_status(status_out)
        for top, codes in report.codes.items():
            if not top.startswith(prefix):
                continue
            rel = top[len(prefix) :]
            if not rel or rel.endswith("/") or is_excluded(rel):  # "/": a nested repository
                continue
            status = status_from_codes(codes)
            if status is not None:
                baseline = report.renamed_from.get(top, top)
                changes.append(_Change(rel, baseline, status, numstat.get(top)))
        return sorted(changes, key=lambda c: c.rel)

    def _local(
        self, changes: list[_Change], head: str | None, user_paths: list[str]
    ) -> tuple[list[dict[str, Any]], dict[str, _Fingerprint], dict[str, str]]:
        """Blocking part (runs in a thread): file states, line counts and ``after`` texts.

        Returns the entries, their fingerprints, and {path: top-level path} of the
        entries whose ``before`` must still be read from ``HEAD``.
        """
        entries: list[dict[str, Any]] = []
        fingerprints: dict[str, _Fingerprint] = {}
        wanted: dict[str, str] = {}
        for change in changes:
            path = self.root / change.rel
            state = file_state(path)
            added, removed = change.numstat or (None, None)
            if change.numstat is None and change.status == "created":
                added = count_file_lines(path) if state.exists else None
                removed = 0 if added is not None else None
            entry = make_entry(change.rel, change.status, state, added, removed)
            fingerprint = (change.status, state.size, state.mtime_ns, head)
            fingerprints[change.rel] = fingerprint
            if self._sent.get(change.rel) != fingerprint:
                entry["before"] = None
                entry["after"] = read_text_capped(path) if state.exists else None
                entry["attribution"] = "user" if touches(change.rel, user_paths) else "agent"
                if change.status != "created":
                    wanted[change.rel] = change.baseline
            entries.append(entry)
        return entries, fingerprints, wanted

    async def _head_texts(self, wanted: dict[str, str]) -> dict[str, str | None]:
        """``HEAD:<path>`` texts of ≤ 1 MiB, in two ``git cat-file`` calls in total."""
        specs = {rel: f"HEAD:{top}" for rel, top in wanted.items() if "\n" not in top}
        if not specs:
            return {}
        checks = await self._git(
            "cat-file", "--batch-check", stdin="".join(s + "\n" for s in specs.values())
        )
        small: dict[str, str] = {}  # rel -> blob id
        for rel, line in zip(specs, checks.decode("utf-8", "replace").splitlines(), strict=False):
            parts = line.split(" ")
            if (
                len(parts) == 3
                and parts[1] == "blob"
                and parts[2].isdigit()
                and int(parts[2]) <= MAX_TEXT_BYTES
            ):
                small[rel] = parts[0]
        if not small:
            return {}
        data = await self._git(
            "cat-file", "--batch", stdin="".join(oid + "\n" for oid in small.values())
        )
        texts: dict[str, str | None] = {}
        pos = 0
        for rel in small:
            header_end = data.index(b"\n", pos)
            size = int(data[pos:header_end].split(b" ")[2])
            start = header_end + 1
            texts[rel] = decode_text(data[start : start + size])
            pos = start + size + 1
        return texts

    async def _git(self, *args: str, stdin: str | None = None) -> bytes:
        """Run git in the root; its stdout, or :class:`GitError` on a non-zero exit."""
        proc = await asyncio.create_subprocess_exec(
            "git",
            *args,
            cwd=self.root,
            env=self._env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        except BaseException:  # deadline or cancellation: do not leave git running
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            raise
        if proc.returncode != 0:
            message = err.decode("utf-8", "replace").strip()
            raise GitError(f"git {args[0]} exited with {proc.returncode}: {message}")
        return out
