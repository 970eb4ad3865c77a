"""``workspace.*`` rpc (tunnel.md; files.md §2): a session's workspace through the server.

The server relays a person's browse, read, write, edit, delete and search of a session's
workspace as ``rpc`` commands; :meth:`WorkspaceRpc.call` answers them in the session's
tool root (the one its ``sys_os_*`` tools use). The file work itself is blocking and
lives in :mod:`omnigent_runner.workspace_fs`; it runs in a worker thread here.

Writes, edits and deletes go through the session's change tracker
(:meth:`~omnigent_runner.tools.changes.ChangeTracker.user_change`), so they enter the
change set like the agent's own edits, attributed ``user``; the payload is emitted as a
``workspace.changes`` event by the caller's ``emit``.

Errors are :class:`~omnigent_runner.executor.CommandRejected` with the HTTP ``status``
the server answers with, and name paths as the API does (relative to the workspace),
never as this machine does. Stdlib only: no Django here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnigent_runner import protocol, workspace_fs
from omnigent_runner.executor import CommandRejected
from omnigent_runner.tools.changes import ChangeTracker
from omnigent_runner.workspace_fs import WorkspaceError, bad_input

logger = logging.getLogger(__name__)

# Each method, and the verb its errors use ("cannot write 'a.txt': ...").
_VERBS = {
    "workspace.list": "list",
    "workspace.read": "read",
    "workspace.read_chunk": "read",
    "workspace.write": "write",
    "workspace.edit": "edit",
    "workspace.delete": "delete",
    "workspace.search": "search",
}
METHODS = frozenset(_VERBS)
# Used when the server sends no cap of its own (files.md §2 defaults).
DEFAULT_READ_MAX_BYTES = 2 * 1024 * 1024
DEFAULT_WRITE_MAX_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class SessionWorkspace:
    """Where a session's workspace requests run, and who records their changes."""

    root: Path
    tracker: ChangeTracker | None


Emit = Callable[[str, protocol.AnyEvent], None]


def _flag(params: dict[str, Any], name: str) -> bool:
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise bad_input(f"'{name}' must be a boolean")
    return value


def _int(params: dict[str, Any], name: str, default: int) -> int:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_input(f"'{name}' must be a non-negative integer")
    return value


def _text(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str):
        raise bad_input(f"'{name}' must be a string")
    return value


class WorkspaceRpc:
    """Answers ``workspace.*`` for the sessions an executor holds."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit

    async def call(
        self, method: str, params: dict[str, Any], *, session_id: str, workspace: SessionWorkspace
    ) -> dict[str, Any]:
        try:
            try:
                return await self._call(method, params, session_id, workspace)
            except OSError as exc:
                # One the file functions did not expect (the change tracker's, a race):
                # its text names this machine's absolute path, so it is answered from
                # the API's path instead.
                logger.warning("session %s: %s failed: %s", session_id, method, exc)
                path = params.get("path")
                shown = path if isinstance(path, str) else "."
                raise workspace_fs.os_failure(exc, shown, _VERBS.get(method, "use")) from None
        except WorkspaceError as exc:
            raise CommandRejected(exc.code, exc.message, status=exc.status) from None

    async def _call(
        self, method: str, params: dict[str, Any], session_id: str, workspace: SessionWorkspace
    ) -> dict[str, Any]:
        root = workspace.root
        path = params.get("path", ".")
        if method in ("workspace.list", "workspace.read"):
            return await asyncio.to_thread(
                workspace_fs.list_or_read,
                root,
                path,
                limit=params.get("limit"),
                after=params.get("after"),
                max_bytes=_int(params, "max_bytes", DEFAULT_READ_MAX_BYTES),
            )
        if method == "workspace.read_chunk":
            return await asyncio.to_thread(
                workspace_fs.read_chunk,
                root,
                path,
                offset=params.get("offset"),
                length=params.get("length"),
            )
        if method == "workspace.search":
            return await asyncio.to_thread(
                workspace_fs.search,
                root,
                query=params.get("q"),
                path=params.get("path"),
                glob=params.get("glob"),
                regex=_flag(params, "regex"),
                limit=params.get("limit"),
            )
        if method == "workspace.write":
            return await self._write(params, session_id, workspace)
        if method == "workspace.edit":
            return await self._edit(params, session_id, workspace)
        if method == "workspace.delete":
            return await self._delete(params, session_id, workspace)
        raise WorkspaceError(400, "unknown_method", f"unknown rpc method {method!r}")

    async def _write(
        self, params: dict[str, Any], session_id: str, workspace: SessionWorkspace
    ) -> dict[str, Any]:
        root = workspace.root
        data = await asyncio.to_thread(  # base64 of up to 10 MiB: off the loop too
            workspace_fs.decode_content,
            params.get("content"),
            params.get("encoding"),
            max_bytes=_int(params, "max_bytes", DEFAULT_WRITE_MAX_BYTES),
        )
        create_parents = _flag(params, "create_parents")
        target, rel = await asyncio.to_thread(
            workspace_fs.confine, root, params.get("path"), write=True
        )

        def action() -> dict[str, Any]:
            workspace_fs.write_file(target, rel, data, create_parents=create_parents)
            return workspace_fs.entry_of(root, rel)

        return await self._tracked(session_id, workspace, [rel], action)

    async def _edit(
        self, params: dict[str, Any], session_id: str, workspace: SessionWorkspace
    ) -> dict[str, Any]:
        root = workspace.root
        old, new = _text(params, "old_text"), _text(params, "new_text")
        if not old:
            raise bad_input("'old_text' must not be empty")
        replace_all = _flag(params, "replace_all")
        target, rel = await asyncio.to_thread(
            workspace_fs.confine, root, params.get("path"), write=True
        )

        def action() -> dict[str, Any]:
            workspace_fs.edit_file(target, rel, old, new, replace_all=replace_all)
            return workspace_fs.entry_of(root, rel)

        return await self._tracked(session_id, workspace, [rel], action)

    async def _delete(
        self, params: dict[str, Any], session_id: str, workspace: SessionWorkspace
    ) -> dict[str, Any]:
        root = workspace.root
        recursive = _flag(params, "recursive")
        entry, rel = await asyncio.to_thread(workspace_fs.confine_entry, root, params.get("path"))
        paths = [rel]
        tracker = workspace.tracker
        if tracker is not None and tracker.mode == "agent_edit" and entry.is_dir():
            paths = await asyncio.to_thread(workspace_fs.files_under, entry, rel)

        def action() -> dict[str, Any]:
            workspace_fs.delete_path(entry, rel, recursive=recursive)
            return {"path": rel, "deleted": True}

        return await self._tracked(session_id, workspace, paths, action)

    async def _tracked(
        self,
        session_id: str,
        workspace: SessionWorkspace,
        paths: list[str],
        action: Callable[[], dict[str, Any]],
    ) -> dict[str, Any]:
        """Run a write through the tracker and emit the change it reports."""
        tracker = workspace.tracker
        if tracker is None:
            return await asyncio.to_thread(action)
        result, payload = await tracker.user_change(paths, action)
        if payload is not None:
            try:
                self._emit(session_id, protocol.workspace_changes(payload))
            except protocol.ProtocolError:
                logger.exception("session %s: an unreportable change payload", session_id)
        return result
