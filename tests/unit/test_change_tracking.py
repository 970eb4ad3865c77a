"""Workspace change tracking (agents.md, "Workspace change tracking"), without Django."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from omnigent_runner.tools.git_parse import parse_numstat, parse_status, status_from_codes
from omnigent_runner.tools.tracking import (
    NET_STATUS,
    AgentEditTracker,
    GitTracker,
    detect_mode,
    diff_line_counts,
    make_tracker,
)

pytestmark = pytest.mark.timeout(60)

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

ENTRY_KEYS = {
    "path",
    "name",
    "status",
    "bytes",
    "modified_at",
    "lines_added",
    "lines_removed",
    "before",
    "after",
    "attribution",  # who made the latest change: "agent" here (user: the workspace API)
}


def only_entry(payload: dict[str, Any] | None) -> dict[str, Any]:
    assert payload is not None
    assert len(payload["entries"]) == 1, payload
    return payload["entries"][0]


def by_path(payload: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    assert payload is not None
    return {entry["path"]: entry for entry in payload["entries"]}


# --- mode detection ----------------------------------------------------------------


def test_detect_mode_git_dir_ancestor_file_and_none(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert detect_mode(plain) == "agent_edit"
    assert isinstance(make_tracker(root=plain), AgentEditTracker)

    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    assert detect_mode(repo) == "git"
    nested = repo / "a" / "b"
    nested.mkdir(parents=True)
    assert detect_mode(nested) == "git"

    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / ".git").write_text("gitdir: /somewhere/.git/worktrees/wt\n")
    assert detect_mode(worktree) == "git"


@needs_git
def test_make_tracker_picks_git_for_a_repository(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    tracker = make_tracker(root=tmp_path)
    assert isinstance(tracker, GitTracker)
    assert tracker.mode == "git"


# --- agent_edit: the net-status table ----------------------------------------------


@pytest.mark.parametrize(
    ("first", "last", "expected"),
    [
        ("created", "created", "created"),
        ("created", "modified", "created"),
        ("created", "deleted", "none"),
        ("modified", "modified", "modified"),
        ("modified", "created", "modified"),
        ("modified", "deleted", "deleted"),
        ("deleted", "created", "modified"),
        ("deleted", "modified", "modified"),
        ("deleted", "deleted", "deleted"),
    ],
)
def test_net_status_table(tmp_path: Path, first: str, last: str, expected: str) -> None:
    assert NET_STATUS[(first, last)] == expected  # type: ignore[index]
    tracker = AgentEditTracker(tmp_path)
    assert tracker.record("sub/f.txt", first) == "sub/f.txt"  # type: ignore[arg-type]
    tracker.record("sub/f.txt", "modified")  # only the first and the last op count
    tracker.record("sub/f.txt", last)  # type: ignore[arg-type]
    assert tracker.net_status("sub/f.txt") == expected
    entry = tracker.entry("sub/f.txt")
    assert set(entry) == ENTRY_KEYS
    assert entry["status"] == expected


def test_net_status_table_is_complete() -> None:
    ops = ("created", "modified", "deleted")
    assert set(NET_STATUS) == {(a, b) for a in ops for b in ops}


@pytest.mark.parametrize(
    "path", ["a.tmp", "notes.txt~", ".f.swp", "dir/.f.swo", "#draft#", "../x", "/etc/passwd", "."]
)
def test_record_ignores_editor_leftovers_and_outside_paths(tmp_path: Path, path: str) -> None:
    tracker = AgentEditTracker(tmp_path)
    assert tracker.record(path, "created") is None
    assert tracker.net_status(path) is None


def test_diff_line_counts() -> None:
    assert diff_line_counts("", "a\nb\n") == (2, 0)
    assert diff_line_counts("a\nb\nc\n", "a\nB\nc\nd") == (2, 1)
    assert diff_line_counts("same\n", "same\n") == (0, 0)


# --- agent_edit through the tools ---------------------------------------------------


async def test_agent_edit_new_file_written_then_edited_is_created(tmp_path: Path) -> None:
    tracker = AgentEditTracker(tmp_path)
    result, payload = await tracker.run_tool(
        "sys_os_write", {"path": "sub/hello.txt", "content": "hello\n"}
    )
    assert result["created"] is True
    assert payload is not None
    assert payload["environment_id"] == "default"
    assert payload["mode"] == "agent_edit"
    entry = only_entry(payload)
    assert set(entry) == ENTRY_KEYS
    assert entry["path"] == "sub/hello.txt"
    assert entry["name"] == "hello.txt"
    assert entry["status"] == "created"
    assert entry["bytes"] == 6
    assert isinstance(entry["modified_at"], int)
    assert (entry["lines_added"], entry["lines_removed"]) == (1, 0)
    assert (entry["before"], entry["after"]) == (None, "hello\n")

    _, payload = await tracker.run_tool(
        "sys_os_edit", {"path": "sub/hello.txt", "oldText": "hello", "newText": "hello\nworld"}
    )
    entry = only_entry(payload)
    assert entry["status"] == "created"
    assert (entry["before"], entry["after"]) == (None, "hello\nworld\n")
    assert (entry["lines_added"], entry["lines_removed"]) == (2, 0)
    assert await tracker.turn_end() is None


async def test_agent_edit_overwrite_keeps_the_first_baseline(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("old line\nkept\n")
    tracker = AgentEditTracker(tmp_path)
    result, payload = await tracker.run_tool(
        "sys_os_write", {"path": "notes.md", "content": "new line\nkept\n"}
    )
    assert result["created"] is False
    entry = only_entry(payload)
    assert entry["status"] == "modified"
    assert entry["before"] == "old line\nkept\n"
    assert entry["after"] == "new line\nkept\n"
    assert (entry["lines_added"], entry["lines_removed"]) == (1, 1)

    _, payload = await tracker.run_tool("sys_os_write", {"path": "notes.md", "content": "third\n"})
    entry = only_entry(payload)
    assert entry["status"] == "modified"
    assert entry["before"] == "old line\nkept\n"  # the baseline of the first change
    assert entry["after"] == "third\n"


async def test_agent_edit_binary_baseline_has_no_line_counts(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"\x00\x01\x02")
    tracker = AgentEditTracker(tmp_path)
    _, payload = await tracker.run_tool("sys_os_write", {"path": "data.bin", "content": "text\n"})
    entry = only_entry(payload)
    assert entry["status"] == "modified"
    assert entry["before"] is None
    assert entry["after"] == "text\n"
    assert (entry["lines_added"], entry["lines_removed"]) == (None, None)


async def test_agent_edit_failed_edit_records_nothing(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("abc")
    tracker = AgentEditTracker(tmp_path)
    result, payload = await tracker.run_tool(
        "sys_os_edit", {"path": "f.txt", "oldText": "zzz", "newText": "x"}
    )
    assert "error" in result
    assert payload is None
    assert tracker.net_status("f.txt") is None

    result, payload = await tracker.run_tool("sys_os_write", {"path": "../out", "content": "x"})
    assert "error" in result
    assert payload is None


async def test_agent_edit_shell_and_read_are_not_tracked(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("abc")
    tracker = AgentEditTracker(tmp_path)
    result, payload = await tracker.run_tool("sys_os_shell", {"command": "rm f.txt; echo x > g"})
    assert result["exit_code"] == 0
    assert payload is None
    assert not (tmp_path / "f.txt").exists()
    assert tracker.net_status("f.txt") is None
    assert tracker.net_status("g") is None
    _, payload = await tracker.run_tool("sys_os_read", {"path": "g"})
    assert payload is None


async def test_agent_edit_ignores_editor_leftovers(tmp_path: Path) -> None:
    tracker = AgentEditTracker(tmp_path)
    for name in ("notes.txt~", "x.tmp", ".x.swp", "#x#"):
        result, payload = await tracker.run_tool("sys_os_write", {"path": name, "content": "x"})
        assert result["created"] is True
        assert payload is None


# --- git mode ------------------------------------------------------------------------


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def isolated_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's global git configuration out of the tests."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def init_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "test@example.com")
    git(path, "config", "user.name", "Test")
    return path


@pytest.fixture
def repo(tmp_path: Path, isolated_git: None) -> Path:
    path = init_repo(tmp_path / "repo")
    (path / "tracked.txt").write_text("one\ntwo\nthree\n")
    (path / "keep").mkdir()
    (path / "keep" / "other.txt").write_text("other\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "initial")
    return path


@needs_git
async def test_git_shell_created_file_is_reported(repo: Path) -> None:
    tracker = GitTracker(repo)
    result, payload = await tracker.run_tool(
        "sys_os_shell", {"command": "mkdir -p sub && printf 'a\\nb\\nc' > sub/new.txt"}
    )
    assert result["exit_code"] == 0
    assert payload is not None
    assert (payload["environment_id"], payload["mode"]) == ("default", "git")
    entry = only_entry(payload)
    assert set(entry) == ENTRY_KEYS
    assert (entry["path"], entry["name"], entry["status"]) == ("sub/new.txt", "new.txt", "created")
    assert (entry["lines_added"], entry["lines_removed"]) == (3, 0)
    assert entry["bytes"] == 5
    assert isinstance(entry["modified_at"], int)
    assert (entry["before"], entry["after"]) == (None, "a\nb\nc")


@needs_git
async def test_git_edited_committed_file_is_modified(repo: Path) -> None:
    tracker = GitTracker(repo)
    _, payload = await tracker.run_tool(
        "sys_os_edit", {"path": "tracked.txt", "oldText": "two\n", "newText": "TWO\nextra\n"}
    )
    entry = only_entry(payload)
    assert (entry["path"], entry["status"]) == ("tracked.txt", "modified")
    assert (entry["lines_added"], entry["lines_removed"]) == (2, 1)
    assert entry["before"] == "one\ntwo\nthree\n"
    assert entry["after"] == "one\nTWO\nextra\nthree\n"


@needs_git
async def test_git_deleted_file_is_reported(repo: Path) -> None:
    tracker = GitTracker(repo)
    _, payload = await tracker.run_tool("sys_os_shell", {"command": "rm keep/other.txt"})
    entry = only_entry(payload)
    assert (entry["path"], entry["status"]) == ("keep/other.txt", "deleted")
    assert (entry["bytes"], entry["modified_at"]) == (None, None)
    assert (entry["lines_added"], entry["lines_removed"]) == (0, 1)
    assert (entry["before"], entry["after"]) == ("other\n", None)


@needs_git
async def test_git_excluded_directories_are_ignored(repo: Path) -> None:
    tracker = GitTracker(repo)
    command = (
        "mkdir -p node_modules/pkg .venv/lib venv sub/__pycache__ && "
        "echo x > node_modules/pkg/index.js && echo x > .venv/lib/a.py && "
        "echo x > venv/b && echo x > sub/__pycache__/c.pyc"
    )
    result, payload = await tracker.run_tool("sys_os_shell", {"command": command})
    assert result["exit_code"] == 0
    assert payload is None
    (repo / "sub" / "real.txt").write_text("real\n")
    assert list(by_path(await tracker.turn_end())) == ["sub/real.txt"]


@needs_git
async def test_git_unchanged_workspace_sends_nothing(repo: Path) -> None:
    tracker = GitTracker(repo)
    assert await tracker.turn_end() is None  # clean tree: no first payload

    (repo / "a.txt").write_text("a\n")
    first = await tracker.turn_end()
    assert "before" in only_entry(first)
    assert await tracker.turn_end() is None
    _, payload = await tracker.run_tool("sys_os_read", {"path": "a.txt"})
    assert payload is None

    # A further change resends the full set; the unchanged entry omits its content.
    (repo / "b.txt").write_text("b\n")
    entries = by_path(await tracker.turn_end())
    assert set(entries) == {"a.txt", "b.txt"}
    assert "before" not in entries["a.txt"] and "after" not in entries["a.txt"]
    assert entries["a.txt"]["status"] == "created"
    assert entries["b.txt"]["after"] == "b\n"

    # Reverting everything sends an empty set, which clears the stored one.
    (repo / "a.txt").unlink()
    (repo / "b.txt").unlink()
    assert (await tracker.turn_end()) == {"environment_id": "default", "mode": "git", "entries": []}
    assert await tracker.turn_end() is None


@needs_git
async def test_git_failed_tool_call_still_reports(repo: Path) -> None:
    tracker = GitTracker(repo)
    result, payload = await tracker.run_tool("sys_os_shell", {"command": "echo x > y.txt; exit 1"})
    assert result["error"] == "command exited with status 1"
    assert list(by_path(payload)) == ["y.txt"]


@needs_git
async def test_git_rename_is_reported_under_its_new_path_only(repo: Path) -> None:
    tracker = GitTracker(repo)
    _, payload = await tracker.run_tool("sys_os_shell", {"command": "git mv tracked.txt moved.txt"})
    entries = by_path(payload)
    assert list(entries) == ["moved.txt"]
    moved = entries["moved.txt"]
    assert moved["status"] == "modified"
    assert (moved["lines_added"], moved["lines_removed"]) == (0, 0)
    assert moved["before"] == "one\ntwo\nthree\n"  # the old path's content in HEAD
    assert moved["after"] == "one\ntwo\nthree\n"


@needs_git
async def test_git_renamed_and_edited_file_counts_lines_against_its_old_content(
    repo: Path,
) -> None:
    tracker = GitTracker(repo)
    command = "git mv tracked.txt moved.txt && printf 'four\\n' >> moved.txt"
    _, payload = await tracker.run_tool("sys_os_shell", {"command": command})
    moved = only_entry(payload)
    assert moved["path"] == "moved.txt" and moved["status"] == "modified"
    assert (moved["lines_added"], moved["lines_removed"]) == (1, 0)
    assert moved["before"] == "one\ntwo\nthree\n"


@needs_git
async def test_git_plain_move_is_a_deletion_and_a_new_file(repo: Path) -> None:
    # Not staged, so git itself sees no rename: the old path deleted, the new one untracked.
    tracker = GitTracker(repo)
    _, payload = await tracker.run_tool("sys_os_shell", {"command": "mv tracked.txt moved.txt"})
    entries = by_path(payload)
    assert entries["tracked.txt"]["status"] == "deleted"
    assert entries["moved.txt"]["status"] == "created"


@needs_git
async def test_git_renamed_then_deleted_file_is_its_old_path_deleted(repo: Path) -> None:
    tracker = GitTracker(repo)
    command = "git mv tracked.txt moved.txt && rm moved.txt"
    _, payload = await tracker.run_tool("sys_os_shell", {"command": command})
    entry = only_entry(payload)
    assert (entry["path"], entry["status"]) == ("tracked.txt", "deleted")
    assert entry["before"] == "one\ntwo\nthree\n"


def test_parse_status_renames_copies_and_plain_codes() -> None:
    output = b"\0".join(
        [b"R  new.txt", b"old.txt", b"C  copy.txt", b"orig.txt", b"RD gone.txt", b"was.txt"]
        + [b" M edited.txt", b"?? fresh.txt", b""]
    )
    report = parse_status(output)
    assert report.codes == {
        "new.txt": ["R "],
        "copy.txt": ["A "],
        "was.txt": ["D "],
        "edited.txt": [" M"],
        "fresh.txt": ["??"],
    }
    assert report.renamed_from == {"new.txt": "old.txt"}
    assert [status_from_codes(report.codes[p]) for p in report.codes] == [
        "modified",
        "created",
        "deleted",
        "modified",
        "created",
    ]


def test_parse_numstat_gives_a_rename_counts_to_its_new_path() -> None:
    output = b"\0".join(
        [b"1\t0\t", b"old.txt", b"new.txt", b"2\t3\tplain.txt", b"-\t-\tbin.dat", b""]
    )
    assert parse_numstat(output) == {
        "new.txt": (1, 0),
        "plain.txt": (2, 3),
        "bin.dat": (None, None),
    }


@needs_git
async def test_git_binary_file_has_no_line_counts(repo: Path) -> None:
    tracker = GitTracker(repo)
    (repo / "img.bin").write_bytes(b"\x89PNG\x00\x00data")
    entry = only_entry(await tracker.turn_end())
    assert entry["status"] == "created"
    assert (entry["lines_added"], entry["lines_removed"]) == (None, None)
    assert entry["after"] is None
    assert entry["bytes"] == 10


@needs_git
async def test_git_repository_without_commits(tmp_path: Path, isolated_git: None) -> None:
    path = init_repo(tmp_path / "fresh")
    (path / "staged.txt").write_text("1\n2\n")
    git(path, "add", "staged.txt")
    tracker = GitTracker(path)
    _, payload = await tracker.run_tool("sys_os_write", {"path": "new.txt", "content": "x\n"})
    entries = by_path(payload)
    assert set(entries) == {"staged.txt", "new.txt"}
    assert all(e["status"] == "created" for e in entries.values())
    assert (entries["staged.txt"]["lines_added"], entries["staged.txt"]["lines_removed"]) == (2, 0)
    assert entries["new.txt"]["lines_added"] == 1
    assert entries["staged.txt"]["before"] is None
    assert entries["new.txt"]["after"] == "x\n"


@needs_git
async def test_git_tracker_root_in_a_subdirectory(repo: Path) -> None:
    (repo / "keep" / "other.txt").write_text("other\nchanged\n")  # inside the root
    (repo / "tracked.txt").write_text("outside the root\n")  # outside it
    tracker = GitTracker(repo / "keep")
    _, payload = await tracker.run_tool("sys_os_write", {"path": "made.txt", "content": "m\n"})
    entries = by_path(payload)
    assert set(entries) == {"other.txt", "made.txt"}
    other = entries["other.txt"]
    assert other["status"] == "modified"
    assert (other["lines_added"], other["lines_removed"]) == (1, 0)
    assert (other["before"], other["after"]) == ("other\n", "other\nchanged\n")
    assert entries["made.txt"]["status"] == "created"


@needs_git
async def test_make_tracker_in_a_real_repository(repo: Path) -> None:
    sub = repo / "keep"
    tracker = make_tracker(root=sub)
    assert isinstance(tracker, GitTracker)
    (sub / "n.txt").write_text("n\n")
    assert list(by_path(await tracker.turn_end())) == ["n.txt"]


# --- a workspace inside another checkout ------------------------------------------------


@needs_git
async def test_ignored_workspace_inside_a_checkout_reports_the_agents_writes(
    repo: Path,
) -> None:
    """``make run`` in a clone: ``./workspace`` is in the clone's ``.gitignore``.

    Git lists no ignored file, so the enclosing repository's status would report
    nothing; the workspace is tracked in agent_edit mode and the write is reported.
    """
    (repo / ".gitignore").write_text("workspace/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore the workspace")
    workspace = repo / "workspace"
    workspace.mkdir()
    assert detect_mode(workspace) == "agent_edit"
    tracker = make_tracker(root=workspace)
    assert isinstance(tracker, AgentEditTracker)
    _, payload = await tracker.run_tool("sys_os_write", {"path": "hello.txt", "content": "hi\n"})
    entry = only_entry(payload)
    assert (entry["path"], entry["status"]) == ("hello.txt", "created")
    assert payload is not None and payload["mode"] == "agent_edit"


@needs_git
async def test_folder_of_a_monorepo_is_tracked_through_its_repository(repo: Path) -> None:
    """A workspace that is a (not ignored) folder of a repository keeps git mode, shell
    side effects included, with paths relative to the workspace."""
    package = repo / "keep"
    assert detect_mode(package) == "git"
    tracker = make_tracker(root=package)
    assert isinstance(tracker, GitTracker)
    _, payload = await tracker.run_tool("sys_os_shell", {"command": "printf 'x\\n' > made.txt"})
    entry = only_entry(payload)
    assert (entry["path"], entry["status"]) == ("made.txt", "created")


@needs_git
def test_a_broken_enclosing_repository_counts_as_not_ignoring(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()  # not a repository git can read
    inner = tmp_path / "inner"
    inner.mkdir()
    assert detect_mode(inner) == "git"
