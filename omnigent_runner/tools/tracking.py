"""Workspace change tracking (agents.md, "Workspace change tracking"): the entry point.

The runner makes one tracker per session with :func:`make_tracker`, runs the session's
built-in tools through it, and emits the payloads it returns as ``workspace.changes``
events. The mode follows the workspace:

* **git** (:class:`~omnigent_runner.tools.git_tracker.GitTracker`) when the tool root is
  the top of a git work tree, or a folder inside one that the enclosing repository does
  not ignore (a package of a monorepo): the full working-tree change set against
  ``HEAD``, shell side effects included.
* **agent_edit** (:class:`~omnigent_runner.tools.agent_edit.AgentEditTracker`) otherwise:
  only the agent's successful ``sys_os_write``/``sys_os_edit`` calls; shell side
  effects are **not** tracked. This includes a workspace inside another checkout that
  the checkout ignores (``./workspace`` in this project's own clone): git reports no
  ignored file, so git mode there would report nothing the agent wrote.

Stdlib only: the runner imports this without Django.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
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


# ``git check-ignore`` exits 0 for an ignored path, 1 for one that is not ignored.
_IGNORED = 0


def detect_mode(root: Path) -> Mode:
    """``git`` for the top of a work tree (``.git`` a folder, or a worktree's file) or a
    folder inside one that its repository does not ignore; ``agent_edit`` otherwise."""
    start = root.resolve()
    if (start / ".git").exists():
        return "git"
    for directory in start.parents:
        if (directory / ".git").exists():
            return "agent_edit" if ignored_by_enclosing_repository(start) else "git"
    return "agent_edit"


def ignored_by_enclosing_repository(root: Path) -> bool:
    """True if the repository around ``root`` ignores it (``.gitignore`` and the like).

    Git never lists an ignored file, so tracking such a folder through the enclosing
    repository's status would report nothing the agent did there. Anything that keeps
    git from answering (no git, a broken repository) counts as not ignored: git mode
    then decides as before (``make_tracker`` falls back when git is missing).
    """
    git = shutil.which("git")
    if git is None:
        return False
    try:
        result = subprocess.run(
            [git, "check-ignore", "-q", "."],
            cwd=root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == _IGNORED


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
