"""Workspace change tracking (agents.md, "Workspace change tracking"): the entry point.

The runner makes one tracker per session with :func:`make_tracker`, runs the session's
built-in tools through it, and emits the payloads it returns as ``workspace.changes``
events. The mode follows the workspace:

* **git** (:class:`~omnigent_runner.tools.git_tracker.GitTracker`) when the tool root or an
  ancestor has ``.git``: the full working-tree change set against ``HEAD``, shell side
  effects included.
* **agent_edit** (:class:`~omnigent_runner.tools.agent_edit.AgentEditTracker`) otherwise:
  only the agent's successful ``sys_os_write``/``sys_os_edit`` calls; shell side
  effects are **not** tracked.

Stdlib only: the runner imports this without Django.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from .agent_edit import NET_STATUS, AgentEditTracker, is_editor_leftover
from .changes import ChangeTracker, Mode, diff_line_counts
from .git_tracker import GitTracker

__all__ = [
    "NET_STATUS",
    "AgentEditTracker",
    "ChangeTracker",
    "GitTracker",
    "Mode",
    "detect_mode",
    "diff_line_counts",
    "is_editor_leftover",
    "make_tracker",
]

logger = logging.getLogger(__name__)


def detect_mode(root: Path) -> Mode:
    """``git`` if ``root`` or an ancestor has ``.git`` (a folder, or a worktree's file)."""
    start = root.resolve()
    for directory in (start, *start.parents):
        if (directory / ".git").exists():
            return "git"
    return "agent_edit"


def make_tracker(*, root: Path) -> ChangeTracker:
    """The tracker for one session whose tools run in ``root``.

    Falls back to agent_edit when the workspace is a git repository but no ``git``
    executable is installed, so a runner without git still reports the agent's edits.
    """
    if detect_mode(root) == "git":
        if shutil.which("git"):
            return GitTracker(root)
        logger.warning("%s is in a git repository but git is not installed; using agent_edit", root)
    return AgentEditTracker(root)
