"""The built-in ``sys_os_*`` tools (agents.md, "Built-in tools"), without Django."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from omnigent_runner.tools import sys_os
from omnigent_runner.tools.shell import OUTPUT_CAP, scrubbed_env

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "root"
    workspace.mkdir()
    return workspace


async def run(root: Path, name: str, **arguments: Any) -> dict[str, Any]:
    return await sys_os.run_tool(name, arguments, root=root)


def blocked(path: str) -> dict[str, str]:
    return {"error": f"Access to '{path}' is blocked: path is outside the workspace root"}


def is_dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a reaper (the container's init may not reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


async def wait_dead(pid: int) -> bool:
    """Poll up to 5 s for ``pid`` to die (a SIGKILL is delivered asynchronously)."""
    for _ in range(100):
        if is_dead(pid):
            return True
        await asyncio.sleep(0.05)
    return is_dead(pid)


def read_pid(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


async def wait_for_pid(path: Path) -> int:
    """The pid a command wrote to ``path``, once it is there (up to 10 s)."""
    for _ in range(200):
        if (pid := read_pid(path)) is not None:
            return pid
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


# --- definitions and dispatch ------------------------------------------------------


def test_tool_definitions_are_chat_completions_functions() -> None:
    definitions = sys_os.tool_definitions()
    assert [d["function"]["name"] for d in definitions] == list(sys_os.TOOL_NAMES)
    required = {d["function"]["name"]: d["function"]["parameters"]["required"] for d in definitions}
    assert required == {
        "sys_os_read": ["path"],
        "sys_os_write": ["path", "content"],
        "sys_os_edit": ["path"],
        "sys_os_shell": ["command"],
    }
    for definition in definitions:
        assert definition["type"] == "function"
        assert definition["function"]["description"]
        assert definition["function"]["parameters"]["type"] == "object"
    props = definitions[2]["function"]["parameters"]["properties"]
    assert {"oldText", "newText", "edits"} <= set(props)
    # Each call returns a fresh structure.
    definitions[0]["function"]["name"] = "changed"
    assert sys_os.tool_definitions()[0]["function"]["name"] == "sys_os_read"


async def test_unknown_tool_and_bad_arguments_are_errors(root: Path) -> None:
    assert "unknown tool" in (await run(root, "sys_os_nope"))["error"]
    assert "'path'" in (await run(root, "sys_os_read"))["error"]
    assert "'content'" in (await run(root, "sys_os_write", path="a.txt"))["error"]
    assert "'command'" in (await run(root, "sys_os_shell"))["error"]
    assert "'offset'" in (await run(root, "sys_os_read", path="a", offset="abc"))["error"]
    assert "'limit'" in (await run(root, "sys_os_read", path="a", limit=0))["error"]
    assert "'timeout'" in (await run(root, "sys_os_shell", command="true", timeout=-1))["error"]
    assert "'path'" in (await run(root, "sys_os_write", path=5, content="x"))["error"]
    assert "NUL" in (await run(root, "sys_os_read", path="a\x00b"))["error"]
    result = await sys_os.run_tool("sys_os_read", ["not", "a", "dict"], root=root)  # type: ignore[arg-type]
    assert "error" in result


# --- sys_os_read -------------------------------------------------------------------


async def test_read_returns_the_documented_shape(root: Path) -> None:
    (root / "hello.txt").write_text("one\ntwo\nthree\n")
    assert await run(root, "sys_os_read", path="hello.txt") == {
        "path": "hello.txt",
        "content": "one\ntwo\nthree\n",
        "encoding": "utf-8",
        "offset": 1,
        "limit": 2000,
        "returned_lines": 3,
        "total_lines": 3,
    }


async def test_read_offset_limit_and_total_lines(root: Path) -> None:
    (root / "sub").mkdir()
    (root / "sub" / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)) + "tail")
    result = await run(root, "sys_os_read", path="sub/n.txt", offset=3, limit=2)
    assert result["path"] == "sub/n.txt"
    assert result["content"] == "line 3\nline 4\n"
    assert (result["offset"], result["limit"]) == (3, 2)
    assert (result["returned_lines"], result["total_lines"]) == (2, 11)

    last = await run(root, "sys_os_read", path="sub/n.txt", offset=10, limit=5)
    assert last["content"] == "line 10\ntail"
    assert last["returned_lines"] == 2

    past = await run(root, "sys_os_read", path="sub/n.txt", offset=50)
    assert (past["content"], past["returned_lines"], past["total_lines"]) == ("", 0, 11)
    assert "past the end" in past["note"]


async def test_read_empty_file(root: Path) -> None:
    (root / "empty").write_text("")
    result = await run(root, "sys_os_read", path="empty")
    assert (result["content"], result["returned_lines"], result["total_lines"]) == ("", 0, 0)


@pytest.mark.parametrize("data", [b"PNG\x00\x01\x02binary", b"caf\xe9 latin-1\n"])
async def test_read_binary_file_returns_size_note(root: Path, data: bytes) -> None:
    (root / "blob.bin").write_bytes(data)
    result = await run(root, "sys_os_read", path="blob.bin")
    assert result["encoding"] == "base64"
    assert result["content"] == ""
    assert result["path"] == "blob.bin"
    assert str(len(data)) in result["note"]
    assert "error" not in result


async def test_read_missing_file_and_directory_are_errors(root: Path) -> None:
    assert "not found" in (await run(root, "sys_os_read", path="nope.txt"))["error"]
    (root / "dir").mkdir()
    assert "directory" in (await run(root, "sys_os_read", path="dir"))["error"]


# --- sys_os_write ------------------------------------------------------------------


async def test_write_creates_parents_and_reports_created(root: Path) -> None:
    first = await run(root, "sys_os_write", path="a/b/c.txt", content="héllo\n")
    assert first == {"path": "a/b/c.txt", "bytes_written": 7, "created": True}
    assert (root / "a" / "b" / "c.txt").read_text() == "héllo\n"

    second = await run(root, "sys_os_write", path="a/b/c.txt", content="x")
    assert second == {"path": "a/b/c.txt", "bytes_written": 1, "created": False}
    assert (root / "a" / "b" / "c.txt").read_text() == "x"
    # No temporary file is left behind.
    assert sorted(p.name for p in (root / "a" / "b").iterdir()) == ["c.txt"]


async def test_write_keeps_the_mode_of_an_existing_file(root: Path) -> None:
    script = root / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o750)
    assert "error" not in await run(root, "sys_os_write", path="run.sh", content="echo new\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o750


async def test_write_onto_a_directory_is_an_error(root: Path) -> None:
    (root / "dir").mkdir()
    assert "directory" in (await run(root, "sys_os_write", path="dir", content="x"))["error"]


# --- sys_os_edit -------------------------------------------------------------------


async def test_edit_single_replacement(root: Path) -> None:
    (root / "f.py").write_text("x = 1\ny = 2\n")
    result = await run(root, "sys_os_edit", path="f.py", oldText="y = 2", newText="y = 3")
    assert result == {"path": "f.py", "replacements": 1, "bytes_written": 12}
    assert (root / "f.py").read_text() == "x = 1\ny = 3\n"


async def test_edit_multiple_edits_apply_in_order(root: Path) -> None:
    (root / "f.txt").write_text("alpha beta gamma")
    edits = [
        {"oldText": "alpha", "newText": "ALPHA"},
        {"oldText": "ALPHA beta", "newText": "first second"},
        {"oldText": "gamma", "newText": ""},
    ]
    result = await run(root, "sys_os_edit", path="f.txt", edits=edits)
    assert result == {"path": "f.txt", "replacements": 3, "bytes_written": 13}
    assert (root / "f.txt").read_text() == "first second "


async def test_edit_zero_matches_names_the_count(root: Path) -> None:
    (root / "f.txt").write_text("hello")
    result = await run(root, "sys_os_edit", path="f.txt", oldText="bye", newText="x")
    assert result == {"error": "oldText matched 0 times; it must match exactly once"}


async def test_edit_two_matches_names_the_count(root: Path) -> None:
    (root / "f.txt").write_text("a-a")
    result = await run(root, "sys_os_edit", path="f.txt", oldText="a", newText="b")
    assert result == {"error": "oldText matched 2 times; it must match exactly once"}
    assert (root / "f.txt").read_text() == "a-a"


async def test_edit_is_all_or_nothing(root: Path) -> None:
    (root / "f.txt").write_text("one two two two")
    edits = [{"oldText": "one", "newText": "1"}, {"oldText": "two", "newText": "2"}]
    result = await run(root, "sys_os_edit", path="f.txt", edits=edits)
    assert result["error"].startswith("oldText #2 matched 3 times; it must match exactly once")
    assert (root / "f.txt").read_text() == "one two two two"

    edits = [{"oldText": "one", "newText": "1"}, {"oldText": "zzz", "newText": "2"}]
    result = await run(root, "sys_os_edit", path="f.txt", edits=edits)
    assert result["error"].startswith("oldText #2 matched 0 times")
    assert (root / "f.txt").read_text() == "one two two two"


async def test_edit_argument_errors(root: Path) -> None:
    (root / "f.txt").write_text("abc")
    assert (
        "not found"
        in (await run(root, "sys_os_edit", path="g.txt", oldText="a", newText="b"))["error"]
    )
    assert "'oldText'" in (await run(root, "sys_os_edit", path="f.txt"))["error"]
    both = await run(root, "sys_os_edit", path="f.txt", oldText="a", newText="b", edits=[])
    assert "not both" in both["error"]
    assert "'edits'" in (await run(root, "sys_os_edit", path="f.txt", edits=[]))["error"]
    bad_item = await run(root, "sys_os_edit", path="f.txt", edits=[{"oldText": "a"}])
    assert "'newText'" in bad_item["error"]
    empty_old = await run(root, "sys_os_edit", path="f.txt", oldText="", newText="b")
    assert "'oldText'" in empty_old["error"]
    (root / "b.bin").write_bytes(b"\x00\x01")
    assert (
        "binary"
        in (await run(root, "sys_os_edit", path="b.bin", oldText="a", newText="b"))["error"]
    )


# --- sys_os_shell ------------------------------------------------------------------


async def test_shell_returns_stdout_stderr_and_exit_code(root: Path) -> None:
    result = await run(root, "sys_os_shell", command="echo out; echo err >&2; pwd")
    assert result == {
        "stdout": f"out\n{root}\n",
        "stderr": "err\n",
        "exit_code": 0,
        "timed_out": False,
        "cwd": str(root),
    }


async def test_shell_nonzero_exit_adds_error(root: Path) -> None:
    result = await run(root, "sys_os_shell", command="echo partial; exit 3")
    assert result["stdout"] == "partial\n"
    assert result["exit_code"] == 3
    assert result["timed_out"] is False
    assert result["error"] == "command exited with status 3"


async def test_shell_stdin_is_empty(root: Path) -> None:
    result = await run(root, "sys_os_shell", command="cat; echo done", timeout=10)
    assert result["stdout"] == "done\n"
    assert result["exit_code"] == 0


async def test_shell_timeout_kills_the_process_group(root: Path) -> None:
    started = time.monotonic()
    result = await run(
        root,
        "sys_os_shell",
        command="sleep 30 & echo $! > child.pid; echo started; wait",
        timeout=1,
    )
    assert time.monotonic() - started < 15
    assert result["timed_out"] is True
    assert "timed out" in result["error"]
    assert result["stdout"] == "started\n"
    child = int((root / "child.pid").read_text())
    assert await wait_dead(child)


async def test_cancelling_the_call_kills_the_process_group(root: Path) -> None:
    task = asyncio.create_task(
        run(root, "sys_os_shell", command="sleep 30 & echo $! > child.pid; wait", timeout=60)
    )
    child = await wait_for_pid(root / "child.pid")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_dead(child)


async def test_shell_returns_when_a_background_job_keeps_the_pipes_open(root: Path) -> None:
    started = time.monotonic()
    result = await run(
        root, "sys_os_shell", command="sleep 30 & echo $! > bg.pid; echo done", timeout=60
    )
    try:
        assert time.monotonic() - started < 15
        assert result["stdout"] == "done\n"
        assert result["exit_code"] == 0
    finally:
        try:
            os.kill(int((root / "bg.pid").read_text()), 9)
        except (ProcessLookupError, ValueError, OSError):
            pass


async def test_shell_output_is_capped_with_a_note(root: Path) -> None:
    result = await run(
        root,
        "sys_os_shell",
        command="head -c 250000 /dev/zero | tr '\\0' a; head -c 10 /dev/zero | tr '\\0' b >&2",
    )
    note = "\n[output truncated: 150000 more characters]"
    assert result["stdout"] == "a" * OUTPUT_CAP + note
    assert result["stderr"] == "b" * 10
    assert result["exit_code"] == 0


async def test_shell_environment_is_scrubbed(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret-1")
    monkeypatch.setenv("MY_TOKEN", "tok-very-secret-2")
    monkeypatch.setenv("aws_region", "secret-region-3")
    monkeypatch.setenv("DB_PASSWORD", "secret-password-4")
    monkeypatch.setenv("OMNIGENT_SERVER", "secret-server-5")
    monkeypatch.setenv("PLAIN_SETTING", "visible-value")
    result = await run(root, "sys_os_shell", command="env")
    for secret in ("sk-very-secret-1", "tok-very-secret-2", "secret-region-3", "secret-password-4"):
        assert secret not in result["stdout"]
    assert "secret-server-5" not in result["stdout"]
    assert "PLAIN_SETTING=visible-value" in result["stdout"]
    assert f"PATH={os.environ['PATH']}" in result["stdout"]


def test_scrubbed_env_rules() -> None:
    env = scrubbed_env(
        {
            "PATH": "/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "GITHUB_TOKEN": "x",
            "api_key": "x",
            "CLIENT_SECRET": "x",
            "ANTHROPIC_BASE_URL": "x",
            "Openai_Base_Url": "x",
        }
    )
    assert env == {"PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8"}


# --- confinement -------------------------------------------------------------------


async def test_parent_escape_is_blocked(root: Path) -> None:
    assert await run(root, "sys_os_read", path="../x") == blocked("../x")
    assert await run(root, "sys_os_write", path="../x", content="no") == blocked("../x")
    assert await run(root, "sys_os_edit", path="a/../../x", oldText="a", newText="b") == blocked(
        "a/../../x"
    )
    assert not (root.parent / "x").exists()


async def test_absolute_path_outside_is_blocked(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    assert await run(root, "sys_os_read", path=str(outside)) == blocked(str(outside))
    result = await run(root, "sys_os_write", path=str(outside), content="pwned")
    assert result == blocked(str(outside))
    assert outside.read_text() == "secret"


async def test_symlink_pointing_outside_is_blocked(root: Path, tmp_path: Path) -> None:
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    (outside_dir / "secret.txt").write_text("secret")
    (root / "link").symlink_to(outside_dir, target_is_directory=True)
    (root / "file-link").symlink_to(outside_dir / "secret.txt")

    assert await run(root, "sys_os_read", path="link/secret.txt") == blocked("link/secret.txt")
    assert await run(root, "sys_os_read", path="file-link") == blocked("file-link")
    assert await run(root, "sys_os_write", path="link/new.txt", content="x") == blocked(
        "link/new.txt"
    )
    assert await run(root, "sys_os_write", path="file-link", content="x") == blocked("file-link")
    edit = await run(root, "sys_os_edit", path="file-link", oldText="secret", newText="x")
    assert edit == blocked("file-link")
    assert sorted(p.name for p in outside_dir.iterdir()) == ["secret.txt"]
    assert (outside_dir / "secret.txt").read_text() == "secret"


async def test_absolute_path_inside_and_inner_symlink_are_allowed(root: Path) -> None:
    target = root / "sub" / "f.txt"
    result = await run(root, "sys_os_write", path=str(target), content="hi\n")
    assert result == {"path": "sub/f.txt", "bytes_written": 3, "created": True}
    (root / "alias").symlink_to(root / "sub")
    read = await run(root, "sys_os_read", path="alias/f.txt")
    assert (read["path"], read["content"]) == ("sub/f.txt", "hi\n")
    assert "is a directory" in (await run(root, "sys_os_read", path=str(root)))["error"]
