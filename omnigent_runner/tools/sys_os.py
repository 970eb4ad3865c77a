"""The built-in ``sys_os_*`` tools of the runner (agents.md, "Built-in tools").

Registered when an agent's spec has ``os_env``. The tool root is the runner workspace
(or ``os_env.cwd`` inside it).

* ``sys_os_read``, ``sys_os_write`` and ``sys_os_edit`` are **confined** to the root: a
  path is joined to the root and resolved with symlinks followed, and must stay
  inside it (see :func:`omnigent_runner.tools.fsutil.resolve_in_root`).
* ``sys_os_shell`` is **not confined**. ``sandbox.type: none`` is the only sandbox
  implemented, so a command can reach anything the runner's user can; it only starts
  in the root, with credentials scrubbed from its environment
  (:mod:`omnigent_runner.tools.shell`).

:func:`run_tool` never raises for a tool-level failure; the model gets
``{"error": "<message>"}`` and the turn goes on. Stdlib only: no Django here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .arguments import ToolError
from .file_tools import edit_file, read_file, write_file
from .fsutil import PathError
from .shell import run_shell

logger = logging.getLogger(__name__)

TOOL_NAMES: tuple[str, ...] = ("sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell")

_STRING = {"type": "string"}

_DEFINITIONS: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "sys_os_read": (
        "Read a UTF-8 text file in the workspace. Returns up to `limit` lines starting at "
        "line `offset` (1-based) and the file's total line count; binary files are not "
        "shown, only their size.",
        {
            "path": {**_STRING, "description": "File path, relative to the workspace root."},
            "offset": {
                "type": "integer",
                "minimum": 1,
                "description": "First line to return (1-based). Default 1.",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "description": "Maximum number of lines to return. Default 2000.",
            },
        },
        ["path"],
    ),
    "sys_os_write": (
        "Write a file in the workspace, replacing its whole content. Parent folders are "
        "created as needed.",
        {
            "path": {**_STRING, "description": "File path, relative to the workspace root."},
            "content": {**_STRING, "description": "The complete new content of the file."},
        },
        ["path", "content"],
    ),
    "sys_os_edit": (
        "Edit a text file by exact replacement. Give `oldText` and `newText`, or `edits` "
        "as a list of {oldText, newText} applied in order. Each oldText must match the "
        "file exactly once (whitespace included); if any does not, nothing is changed.",
        {
            "path": {**_STRING, "description": "File path, relative to the workspace root."},
            "oldText": {**_STRING, "description": "Exact text to replace (must be unique)."},
            "newText": {**_STRING, "description": "Replacement text."},
            "edits": {
                "type": "array",
                "description": "Several replacements, applied in order, all or nothing.",
                "items": {
                    "type": "object",
                    "properties": {"oldText": _STRING, "newText": _STRING},
                    "required": ["oldText", "newText"],
                },
            },
        },
        ["path"],
    ),
    "sys_os_shell": (
        "Run a bash command in the workspace root and return its stdout, stderr and exit "
        "code. stdin is empty; each output stream is capped at 100,000 characters.",
        {
            "command": {**_STRING, "description": "The command, run with `bash -c`."},
            "timeout": {
                "type": "number",
                "description": "Seconds before the command is killed. Default 120.",
            },
        },
        ["command"],
    ),
}


def tool_definitions() -> list[dict[str, Any]]:
    """The tools in Chat Completions function format, in ``TOOL_NAMES`` order.

    A fresh structure each call, so a caller may adapt it (e.g. flatten it for the
    Responses API) without affecting other sessions.
    """
    definitions = []
    for name in TOOL_NAMES:
        description, properties, required = _DEFINITIONS[name]
        definitions.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {
                        "type": "object",
                        "properties": {k: dict(v) for k, v in properties.items()},
                        "required": list(required),
                    },
                },
            }
        )
    return definitions


_FILE_TOOLS: dict[str, Callable[[Path, dict[str, Any]], dict[str, Any]]] = {
    "sys_os_read": read_file,
    "sys_os_write": write_file,
    "sys_os_edit": edit_file,
}


async def run_tool(name: str, arguments: dict[str, Any], *, root: Path) -> dict[str, Any]:
    """Run one built-in tool in ``root`` and return its JSON-able result.

    Every tool-level failure (unknown tool, bad arguments, path outside the root,
    I/O errors, a failing command) comes back as ``{"error": message}``; only
    cancellation propagates, so an interrupted turn still stops the tool.
    """
    if not isinstance(arguments, dict):
        return {"error": "tool arguments must be a JSON object"}
    try:
        if name == "sys_os_shell":
            return await run_shell(root, arguments)
        impl = _FILE_TOOLS.get(name)
        if impl is None:
            return {"error": f"unknown tool '{name}'; available: {', '.join(TOOL_NAMES)}"}
        return await asyncio.to_thread(impl, root, arguments)
    except (ToolError, PathError) as exc:
        return {"error": str(exc)}
    except OSError as exc:
        return {"error": f"{name} failed: {exc}"}
    except Exception as exc:  # a bug must not fail the turn; the model sees the error
        logger.exception("built-in tool %s failed unexpectedly", name)
        return {"error": f"{name} failed: {type(exc).__name__}: {exc}"}
