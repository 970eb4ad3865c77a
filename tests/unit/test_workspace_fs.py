"""The runner's side of the workspace API (files.md §2): confinement, listing, reads,
writes, edit matching, search bounds, and changes attributed to the user."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import time
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


# --- long names and the runner's own paths (files.md §2, Confinement) -----------------

RPC_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("workspace.write", {"content": "x", "create_parents": True}),
    ("workspace.write", {"content": "x"}),
    ("workspace.edit", {"old_text": "a", "new_text": "b"}),
    ("workspace.delete", {"recursive": True}),
    ("workspace.read", {"max_bytes": 100}),
    ("workspace.list", {}),
    ("workspace.read_chunk", {"offset": 0, "length": 10}),
    ("workspace.search", {"q": "x"}),
]


async def refusals(root: Path, path: str, *, tracked: bool) -> list[tuple[str, CommandRejected]]:
    """Every rpc method on ``path``; each must be refused (the method and the error)."""
    rpc = WorkspaceRpc(lambda session_id, event: None)
    workspace = SessionWorkspace(root, AgentEditTracker(root) if tracked else None)
    refused = []
    for method, params in RPC_CALLS:
        where = {"path": path} if method != "workspace.search" else {"path": path, **params}
        with pytest.raises(CommandRejected) as caught:
            await rpc_call(rpc, workspace, method, **{**params, **where})
        refused.append((method, caught.value))
    return refused


@pytest.mark.parametrize(
    ("path", "limit"),
    [
        ("n" * 300 + ".txt", "255 bytes per name"),
        ("sub/" + "é" * 128, "255 bytes per name"),  # 128 characters, 256 bytes
        ("/".join(["abcdefgh"] * 600), "4096 bytes"),
        ("a" * 5000, "4096 bytes"),
    ],
)
@pytest.mark.parametrize("tracked", [False, True])
async def test_names_and_paths_over_the_limits_are_400_naming_the_limit(
    root: Path, path: str, limit: str, tracked: bool
) -> None:
    """They reached the file system, whose ``[Errno 36] File name too long: '<the
    runner's absolute path>'`` went back to the client as a 503."""
    for method, refused in await refusals(root, path, tracked=tracked):
        assert (refused.status, refused.code) == (400, "invalid_input"), method
        assert limit in refused.message, (method, refused.message)
        assert str(root) not in refused.message and "/tmp" not in refused.message


def test_a_name_of_255_bytes_is_allowed(root: Path) -> None:
    name = "é" * 127 + "x"  # 255 bytes
    target, rel = workspace_fs.confine(root, f"sub/{name}", write=True)
    workspace_fs.write_file(target, rel, b"ok", create_parents=True)
    assert (root / "sub" / name).read_bytes() == b"ok"
    assert workspace_fs.path_length_problem("a/" * 2047 + "bc") is None  # 4096 bytes


@pytest.mark.parametrize("tracked", [False, True])
async def test_errors_from_the_file_system_name_the_workspace_path_only(
    root: Path, tracked: bool
) -> None:
    """Within the API's limits, the OS can still refuse: the root and the path together
    pass PATH_MAX, or a parent is a file. The answer names the path as the API gave it."""
    (root / "file.txt").write_text("x")
    deep = "/".join(["b" * 200] * 20) + "/" + "c" * 60  # 4,080 bytes: the root makes it too long
    for method, refused in await refusals(root, deep, tracked=tracked):
        assert refused.status == 400, (method, refused.message)
        assert "File name too long" in refused.message, (method, refused.message)
        assert str(root) not in refused.message, method
        assert refused.message.count("/") <= deep.count("/") + 1, method
    for method, refused in await refusals(root, "file.txt/inner", tracked=tracked):
        assert refused.status in (400, 404, 409), (method, refused.status)
        assert str(root) not in refused.message, (method, refused.message)
        assert "'file.txt/inner'" in refused.message, (method, refused.message)


def test_an_os_errors_answer_follows_its_errno() -> None:
    import errno

    cases = {
        errno.ENOENT: 404,
        errno.EACCES: 403,
        errno.ENAMETOOLONG: 400,
        errno.EISDIR: 409,
        errno.ENOSPC: 409,
    }
    for number, status in cases.items():
        error = OSError(number, os.strerror(number), "/home/someone/secret/ws/a.txt")
        answer = workspace_fs.os_failure(error, "a.txt", "write")
        assert answer.status == status, number
        assert answer.message == f"cannot write 'a.txt': {os.strerror(number)}"
    loop = RuntimeError("Symlink loop from '/home/someone/ws/x'")
    assert "/home" not in workspace_fs.os_failure(loop, "x", "read", status=400).message


# --- search patterns: RE2, linear time ---------------------------------------------------


@pytest.mark.timeout(30)
def test_a_catastrophic_pattern_is_answered_at_once(root: Path) -> None:
    """``(a+)+$`` on 28 ``a`` and a ``!`` backtracks 2^28 times in Python's ``re``:
    minutes with the GIL held, the whole runner stalled. RE2 answers in linear time."""
    (root / "evil.txt").write_text("a" * 28 + "!\n" + "a" * 5000 + "!\n")
    (root / "good.txt").write_text("aaaa\n")
    began = time.monotonic()
    result = workspace_fs.search(root, query="(a+)+$", regex=True)
    assert time.monotonic() - began < 2.0
    assert result == {
        "object": "list",
        "data": [{"path": "good.txt", "line": 1, "text": "aaaa"}],
        "truncated": False,
    }


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\1", "invalid escape sequence"),
        (r"(?=a)b", "invalid perl operator"),
        (r"(?<!a)b", "invalid perl operator"),
        (r"(?>a+)b", "invalid perl operator"),
        (r"a++", "bad repetition operator"),
        (r"(", "missing )"),
    ],
)
def test_patterns_re2_does_not_take_are_400_saying_why(
    root: Path, pattern: str, reason: str
) -> None:
    with pytest.raises(WorkspaceError) as refused:
        workspace_fs.search(root, query=pattern, regex=True)
    assert refused.value.status == 400
    assert reason in refused.value.message and "RE2" in refused.value.message
    assert "backreferences" in refused.value.message


def test_re2_patterns_find_what_they_did(root: Path) -> None:
    (root / "code.py").write_text("def main():\n    return 'Café'\n# TODO: later\n")

    def found(pattern: str) -> list[int]:
        hits = workspace_fs.search(root, query=pattern, regex=True)["data"]
        return [hit["line"] for hit in hits]

    assert found(r"^def \w+\(") == [1]
    assert found(r"(?i)café") == [2]
    assert found(r"TODO|FIXME") == [3]
    assert found(r"(?P<word>ret)urn") == [2]


def test_the_whole_file_first_pass_never_changes_the_answer(root: Path) -> None:
    """Each file is first searched whole (one RE2 call instead of one per line); the
    lines found must be those a search line by line finds, whatever the anchors, line
    ends and flags."""
    import re2

    texts = {
        "lf.txt": "def main():\n    return 1\nend\n\nx = 'a'\n",
        "crlf.txt": "def main():\r\n    return 1\r\nend\r\n",
        "no_newline.txt": "alpha beta",
        "cut.txt": "ok line\n\xe9t\xe9\n",
    }
    for name, text in texts.items():
        (root / name).write_bytes(text.encode("utf-8"))
    patterns = [
        r"^def",
        r"1$",
        r"^end$",
        r"\Aend",
        r"end\z",
        r"(?-m)^end",
        r"(?s)main.*return",
        r"\bbeta\b",
        r"^$",
        r"\s+return",
        r"[^a]1",
        r"(?i)ÉTÉ",
        r"\r",
        r"a\x27",
    ]
    for pattern in patterns:
        reference = re2.compile(pattern)
        expected = []
        for name in sorted(texts):
            for number, line in enumerate(texts[name].splitlines(), start=1):
                if reference.search(line.rstrip("\r\n")):
                    expected.append((name, number))
        found = workspace_fs.search(root, query=pattern, regex=True, limit=500)["data"]
        assert [(hit["path"], hit["line"]) for hit in found] == expected, pattern
