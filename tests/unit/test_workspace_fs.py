"""The runner's side of the workspace API (files.md §2): confinement, listing, reads,
writes, edit matching, search bounds, and changes attributed to the user."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from omnigent_runner import protocol, workspace_fs
from omnigent_runner.executor import CommandRejected
from omnigent_runner.tools.agent_edit import AgentEditTracker
from omnigent_runner.tools.git_tracker import GitTracker
from omnigent_runner.workspace_fs import WorkspaceError
from omnigent_runner.workspace_rpc import SessionWorkspace, WorkspaceRpc

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def status_of(call: Any, *args: Any, **kwargs: Any) -> int:
    with pytest.raises(WorkspaceError) as caught:
        call(*args, **kwargs)
    return caught.value.status


# --- confinement -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "\\etc", "C:/x", "../x", "a/../../x", "a/..", "..\\x", "a\x00b", "sub/\x00"],
)
def test_path_tricks_are_refused_with_400(root: Path, path: str) -> None:
    assert status_of(workspace_fs.confine, root, path) == 400
    assert status_of(workspace_fs.confine, root, path, write=True) == 400


def test_a_symlink_that_leaves_the_root_is_refused(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "escape").symlink_to(outside)
    (root / "secret-link").symlink_to(outside / "secret.txt")
    for path in ("escape", "escape/secret.txt", "secret-link", "escape/new.txt"):
        assert status_of(workspace_fs.confine, root, path) == 400, path
    assert status_of(workspace_fs.list_or_read, root, "secret-link", max_bytes=100) == 400
    assert status_of(workspace_fs.confine_entry, root, "secret-link") == 400
    # A link that stays inside is followed, as the sys_os tools do.
    (root / "docs").mkdir()
    (root / "inside").symlink_to(root / "docs")
    target, rel = workspace_fs.confine(root, "inside/new.txt", write=True)
    assert rel == "docs/new.txt" and target == (root / "docs" / "new.txt").resolve()


def test_writes_inside_git_are_403_even_through_a_symlink(root: Path) -> None:
    (root / ".git").mkdir()
    (root / "gitlink").symlink_to(root / ".git")
    for path in (".git/config", ".GIT/hooks/x", "sub/.git/x", "gitlink/config", ".git"):
        assert status_of(workspace_fs.confine, root, path, write=True) == 403, path
    assert status_of(workspace_fs.confine_entry, root, "gitlink/config") == 403
    # Reading .git is allowed.
    assert workspace_fs.confine(root, ".git")[1] == ".git"


def test_the_root_itself_cannot_be_written_or_deleted(root: Path) -> None:
    assert status_of(workspace_fs.confine, root, ".", write=True) == 400
    assert status_of(workspace_fs.confine_entry, root, "") == 400


# --- listing ---------------------------------------------------------------------------


def test_listing_puts_directories_first_then_names_and_pages_with_after(root: Path) -> None:
    for name in ("b.txt", "a.txt", "C.txt"):
        (root / name).write_text(name)
    for name in ("zdir", "adir"):
        (root / name).mkdir()
    (root / "link").symlink_to(root / "a.txt")
    page = workspace_fs.list_or_read(root, ".", limit=3, max_bytes=10)
    assert [e["name"] for e in page["data"]] == ["adir", "zdir", "C.txt"]
    assert page["has_more"] is True and page["last_id"] == "C.txt"
    rest = workspace_fs.list_or_read(root, ".", after="C.txt", max_bytes=10)
    assert [e["name"] for e in rest["data"]] == ["a.txt", "b.txt", "link"]
    assert rest["has_more"] is False
    kinds = {e["name"]: (e["type"], e["bytes"]) for e in page["data"] + rest["data"]}
    assert kinds["adir"] == ("directory", None)
    assert kinds["b.txt"] == ("file", 5)
    assert kinds["link"] == ("symlink", None)
    entry = rest["data"][0]
    assert entry["object"] == "session.environment.filesystem.entry"
    assert entry["path"] == "a.txt" and isinstance(entry["modified_at"], int)
    # A name that vanished between pages: listed after as a file would be.
    assert [
        e["name"] for e in workspace_fs.list_or_read(root, ".", after="B", max_bytes=1)["data"]
    ] == [
        "C.txt",
        "a.txt",
        "b.txt",
        "link",
    ]
    # Paths of a subfolder's entries are root-relative.
    (root / "adir" / "x.txt").write_text("x")
    assert workspace_fs.list_or_read(root, "adir", max_bytes=1)["data"][0]["path"] == "adir/x.txt"


@pytest.mark.parametrize("limit", [0, 1001, "5", True])
def test_listing_limit_is_checked(root: Path, limit: Any) -> None:
    assert status_of(workspace_fs.list_or_read, root, ".", limit=limit, max_bytes=1) == 400


# --- reads -----------------------------------------------------------------------------


def test_read_text_binary_and_truncated(root: Path) -> None:
    (root / "t.txt").write_text("héllo\n")
    (root / "b.bin").write_bytes(b"\x89PNG\x00\x01")
    text = workspace_fs.list_or_read(root, "t.txt", max_bytes=100)
    assert text == {
        "object": "session.environment.filesystem.file",
        "path": "t.txt",
        "bytes": 7,
        "modified_at": text["modified_at"],
        "encoding": "utf-8",
        "content": "héllo\n",
        "truncated": False,
    }
    binary = workspace_fs.list_or_read(root, "b.bin", max_bytes=100)
    assert binary["encoding"] == "base64"
    assert base64.b64decode(binary["content"]) == b"\x89PNG\x00\x01"
    # Cut inside the two-byte "é": the partial character is left out, still utf-8.
    cut = workspace_fs.list_or_read(root, "t.txt", max_bytes=2)
    assert (cut["content"], cut["truncated"], cut["bytes"], cut["encoding"]) == (
        "h",
        True,
        7,
        "utf-8",
    )
    assert status_of(workspace_fs.list_or_read, root, "nope.txt", max_bytes=1) == 404


def test_read_chunk_walks_the_file(root: Path) -> None:
    (root / "f.bin").write_bytes(bytes(range(256)) * 10)
    first = workspace_fs.read_chunk(root, "f.bin", offset=0, length=1000)
    last = workspace_fs.read_chunk(root, "f.bin", offset=2000, length=1000)
    assert (len(base64.b64decode(first["data"])), first["eof"], first["bytes"]) == (
        1000,
        False,
        2560,
    )
    assert base64.b64decode(last["data"]) == (bytes(range(256)) * 10)[2000:]
    assert last["eof"] is True
    assert status_of(workspace_fs.read_chunk, root, ".", offset=0, length=1) == 400
    assert status_of(workspace_fs.read_chunk, root, "f.bin", offset=-1, length=1) == 400


# --- writes, edits, deletes ------------------------------------------------------------


def test_write_needs_the_parent_unless_asked_and_checks_size(root: Path) -> None:
    target, rel = workspace_fs.confine(root, "a/b/c.txt", write=True)
    assert status_of(workspace_fs.write_file, target, rel, b"x", create_parents=False) == 409
    workspace_fs.write_file(target, rel, b"x", create_parents=True)
    assert (root / "a/b/c.txt").read_bytes() == b"x"
    assert status_of(workspace_fs.decode_content, "x" * 11, "utf-8", max_bytes=10) == 413
    assert status_of(workspace_fs.decode_content, "!!", "base64", max_bytes=10) == 400
    assert workspace_fs.decode_content("AAE=", "base64", max_bytes=10) == b"\x00\x01"
    target, rel = workspace_fs.confine(root, "a", write=True)
    assert status_of(workspace_fs.write_file, target, rel, b"x", create_parents=False) == 409


def test_edit_has_the_sys_os_edit_matching_rules(root: Path) -> None:
    path = root / "e.txt"
    path.write_text("one two one\n")
    target, rel = workspace_fs.confine(root, "e.txt", write=True)
    assert status_of(workspace_fs.edit_file, target, rel, "one", "1", replace_all=False) == 400
    assert status_of(workspace_fs.edit_file, target, rel, "three", "3", replace_all=True) == 400
    assert path.read_text() == "one two one\n"  # failed edits change nothing
    workspace_fs.edit_file(target, rel, "two", "2", replace_all=False)
    workspace_fs.edit_file(target, rel, "one", "1", replace_all=True)
    assert path.read_text() == "1 2 1\n"
    (root / "b.bin").write_bytes(b"a\x00b")
    target, rel = workspace_fs.confine(root, "b.bin", write=True)
    assert status_of(workspace_fs.edit_file, target, rel, "a", "c", replace_all=False) == 400
    target, rel = workspace_fs.confine(root, "none.txt", write=True)
    assert status_of(workspace_fs.edit_file, target, rel, "a", "c", replace_all=False) == 404


def test_delete_files_links_and_folders(root: Path, tmp_path: Path) -> None:
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "sub" / "f.txt").write_text("f")
    (root / "empty").mkdir()
    (root / "target.txt").write_text("t")
    (root / "link").symlink_to(root / "target.txt")
    entry, rel = workspace_fs.confine_entry(root, "link")
    workspace_fs.delete_path(entry, rel, recursive=False)
    assert not (root / "link").exists() and (root / "target.txt").exists()
    entry, rel = workspace_fs.confine_entry(root, "d")
    assert status_of(workspace_fs.delete_path, entry, rel, recursive=False) == 409
    assert workspace_fs.files_under(entry, rel) == ["d/sub/f.txt"]
    workspace_fs.delete_path(entry, rel, recursive=True)
    entry, rel = workspace_fs.confine_entry(root, "empty")
    workspace_fs.delete_path(entry, rel, recursive=False)
    assert sorted(os.listdir(root)) == ["target.txt"]
    entry, rel = workspace_fs.confine_entry(root, "gone")
    assert status_of(workspace_fs.delete_path, entry, rel, recursive=False) == 404


# --- search ----------------------------------------------------------------------------


def make_tree(root: Path, files: int) -> None:
    for i in range(files):
        folder = root / f"d{i % 10}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{i}.txt").write_text(f"line one\nneedle {i}\n")


def test_search_finds_lines_and_skips_git_and_binary(root: Path) -> None:
    make_tree(root, 20)
    (root / ".git").mkdir()
    (root / ".git" / "x.txt").write_text("needle in git\n")
    (root / "bin.dat").write_bytes(b"needle\x00")
    (root / "code.py").write_text("x = 1\nneedle = 2\n")
    result = workspace_fs.search(root, query="needle", limit=500)
    paths = {hit["path"] for hit in result["data"]}
    assert len(result["data"]) == 21 and result["truncated"] is False
    assert "code.py" in paths and not any(".git" in p or "bin.dat" in p for p in paths)
    hit = next(h for h in result["data"] if h["path"] == "code.py")
    assert hit == {"path": "code.py", "line": 2, "text": "needle = 2"}
    assert [h["path"] for h in workspace_fs.search(root, query="needle", glob="*.py")["data"]] == [
        "code.py"
    ]
    assert len(workspace_fs.search(root, query="needle", glob="d1/*")["data"]) == 2
    assert len(workspace_fs.search(root, query="needle", path="d3")["data"]) == 2
    regex = workspace_fs.search(root, query=r"needle 1\d$", regex=True)
    assert sorted(h["path"] for h in regex["data"]) == [
        f"d{i % 10}/f{i}.txt" for i in range(10, 20)
    ]
    assert status_of(workspace_fs.search, root, query="(", regex=True) == 400
    assert status_of(workspace_fs.search, root, query="") == 400
    assert status_of(workspace_fs.search, root, query="x", limit=501) == 400


def test_search_bounds_set_truncated(root: Path) -> None:
    make_tree(root, 50)
    by_results = workspace_fs.search(root, query="needle", limit=5)
    assert len(by_results["data"]) == 5 and by_results["truncated"] is True
    by_files = workspace_fs.search(root, query="needle", max_files=7)
    assert len(by_files["data"]) == 7 and by_files["truncated"] is True
    by_time = workspace_fs.search(root, query="needle", budget_s=0.0)
    assert by_time["truncated"] is True and by_time["data"] == []


def test_search_does_not_follow_links_out_of_the_root(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("needle secret\n")
    (root / "out").symlink_to(outside)
    (root / "out.txt").symlink_to(outside / "secret.txt")
    assert workspace_fs.search(root, query="needle")["data"] == []


# --- through the rpc, with change tracking ---------------------------------------------


async def rpc_call(
    rpc: WorkspaceRpc, workspace: SessionWorkspace, method: str, **params: Any
) -> Any:
    return await rpc.call(method, params, session_id="conv_1", workspace=workspace)


async def test_rpc_writes_are_reported_as_user_changes_in_agent_edit_mode(root: Path) -> None:
    events: list[tuple[str, protocol.AnyEvent]] = []
    rpc = WorkspaceRpc(lambda session_id, event: events.append((session_id, event)))
    workspace = SessionWorkspace(root, AgentEditTracker(root))
    (root / "old.txt").write_text("a\nb\n")
    entry = await rpc_call(rpc, workspace, "workspace.write", path="new.txt", content="hi\n")
    assert entry["path"] == "new.txt" and entry["type"] == "file" and entry["bytes"] == 3
    await rpc_call(rpc, workspace, "workspace.edit", path="old.txt", old_text="b", new_text="c")
    await rpc_call(rpc, workspace, "workspace.delete", path="old.txt")
    changes = [event for _, event in events]
    assert all(isinstance(c, protocol.WorkspaceChanges) for c in changes)
    entries = [(e["path"], e["status"], e["attribution"]) for c in changes for e in c.entries]  # type: ignore[union-attr]
    assert entries == [
        ("new.txt", "created", "user"),
        ("old.txt", "modified", "user"),
        ("old.txt", "deleted", "user"),
    ]
    assert changes[-1].entries[0]["before"] == "a\nb\n"  # type: ignore[union-attr]
    with pytest.raises(CommandRejected) as refused:
        await rpc_call(rpc, workspace, "workspace.write", path=".git/x", content="x")
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    with pytest.raises(CommandRejected) as refused:
        await rpc_call(
            rpc, workspace, "workspace.write", path="x", content="x", create_parents="yes"
        )
    assert refused.value.status == 400
    assert len(events) == 3  # refusals report nothing


def make_repo(root: Path) -> None:
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    (root / "kept.txt").write_text("v1\n")
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=root, check=True)


@needs_git
async def test_rpc_writes_are_reported_as_user_changes_in_git_mode(root: Path) -> None:
    await asyncio.to_thread(make_repo, root)
    events: list[tuple[str, protocol.AnyEvent]] = []
    rpc = WorkspaceRpc(lambda session_id, event: events.append((session_id, event)))
    workspace = SessionWorkspace(root, GitTracker(root))
    await rpc_call(rpc, workspace, "workspace.edit", path="kept.txt", old_text="v1", new_text="v2")
    [(_, event)] = events
    assert isinstance(event, protocol.WorkspaceChanges) and event.mode == "git"
    [entry] = event.entries
    assert (entry["path"], entry["status"], entry["attribution"]) == (
        "kept.txt",
        "modified",
        "user",
    )
    assert (entry["before"], entry["after"]) == ("v1\n", "v2\n")
