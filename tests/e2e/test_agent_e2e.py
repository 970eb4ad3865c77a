"""The agent end to end: real daphne, the real runner program, the mock LLM, nothing stubbed.

Each scenario scripts the mock LLM to call tools, then checks the workspace on disk, the
stored change set (``/resources/environments/default/changes`` and ``/diff/{path}``),
the stored items and turns, and what the LLM was sent (agents.md, http-api.md).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    StreamReader,
    bind,
    create_session,
    free_port,
    is_final_idle,
    register_runner,
    send_message,
    start_runner,
    wait_runner_online,
    wait_turn,
    wait_until,
)
from tests.tools import WEATHER_TOOL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

OS_ENV = "os_env:\n  type: caller_process\n  cwd: .\n"
STRANGER = "mallory@example.com"
OUTSIDE = "is blocked: path is outside the workspace root"
ENTRY_KEYS = {
    "object",
    "path",
    "name",
    "status",
    "bytes",
    "modified_at",
    "lines_added",
    "lines_removed",
}


# --- helpers ----------------------------------------------------------------------------


def call(call_id: str, name: str, **arguments: Any) -> dict[str, str]:
    return {"call_id": call_id, "name": name, "arguments": json.dumps(arguments)}


def tools_then(text: str, *calls: dict[str, str]) -> list[dict[str, Any]]:
    """A script: one model answer with ``calls``, then a final text answer."""
    return [{"tool_calls": list(calls)}, {"text": text}]


def agent_session(server: Server, runner: Runner, make_bundle: Callable[..., bytes]) -> str:
    session_id = create_session(server, make_bundle(extra=OS_ENV))
    bind(server, session_id, runner.runner_id)
    return session_id


def run_turn(
    server: Server, session_id: str, text: str, *, tools: list | None = None
) -> dict[str, Any]:
    response = send_message(server, session_id, text, tools=tools)
    assert response.status_code == 202, response.text
    return wait_turn(server, session_id, response.json()["response_id"])


def get(server: Server, path: str, *, user: str = "alice@example.com") -> httpx.Response:
    with server.client(user) as client:
        return client.get(path)


def changes_path(session_id: str, env: str = "default") -> str:
    return f"/v1/sessions/{session_id}/resources/environments/{env}/changes"


def diff_path(session_id: str, path: str, env: str = "default") -> str:
    return f"/v1/sessions/{session_id}/resources/environments/{env}/diff/{path}"


def changes(server: Server, session_id: str) -> list[dict[str, Any]]:
    response = get(server, changes_path(session_id))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["has_more"] is False, body
    for entry in body["data"]:
        assert set(entry) == ENTRY_KEYS, entry
        assert entry["object"] == "session.environment.filesystem.entry"
    return list(body["data"])


def by_path(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["path"]: entry for entry in entries}


def diff(server: Server, session_id: str, path: str) -> dict[str, Any]:
    response = get(server, diff_path(session_id, path))
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"object", "path", "before", "after"}, body
    assert body["object"] == "session.environment.filesystem.file_diff"
    assert body["path"] == path
    return dict(body)


def session(server: Server, session_id: str) -> dict[str, Any]:
    response = get(server, f"/v1/sessions/{session_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def outputs(server: Server, session_id: str) -> dict[str, str]:
    """{call_id: output} of the stored function_call_output items (flat /items)."""
    response = get(server, f"/v1/sessions/{session_id}/items?limit=1000")
    assert response.status_code == 200, response.text
    return {
        item["call_id"]: item["output"]
        for item in response.json()["data"]
        if item["type"] == "function_call_output"
    }


def conversation(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of the messages of a Responses request body's ``input``."""
    pairs = []
    for item in body["input"]:
        if "role" not in item:
            continue
        content = item["content"]
        text = (
            content
            if isinstance(content, str)
            else "".join(part.get("text", "") for part in content)
        )
        pairs.append((item["role"], text))
    return pairs


def git(cwd: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=True
    )
    return result.stdout


@pytest.fixture
def runner_env(mock_llm: MockLLMServer) -> dict[str, str]:
    return {"OPENAI_BASE_URL": mock_llm.base_url, "OPENAI_API_KEY": "test-key"}


@pytest.fixture
def extra_runners(request: pytest.FixtureRequest) -> Iterator[list[Runner]]:
    """Runners a test starts itself; stopped (logs dumped on failure) at the end."""
    started: list[Runner] = []
    yield started
    report = getattr(request.node, "rep_call", None)
    for runner in started:
        if runner.process is None:
            continue
        if report is not None and report.failed:
            print(f"\n===== {runner.process.name} log =====\n{runner.process.log()[-6000:]}")
        runner.process.stop()


# --- 1. agent_edit: a new file ----------------------------------------------------------


def test_written_file_is_listed_created_and_endpoint_errors(
    server: Server,
    runner: Runner,
    plain_workspace: Path,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    content = "Hello from the agent\n"
    mock_llm.configure(
        tools_then("Wrote it.", call("c1", "sys_os_write", path="sub/hello.txt", content=content))
    )
    session_id = agent_session(server, runner, make_bundle)
    turn = run_turn(server, session_id, "write sub/hello.txt")
    assert turn["status"] == "completed", turn

    assert (plain_workspace / "sub" / "hello.txt").read_text() == content
    result = json.loads(outputs(server, session_id)["c1"])
    assert result == {"path": "sub/hello.txt", "bytes_written": len(content), "created": True}

    [entry] = changes(server, session_id)
    assert entry["path"] == "sub/hello.txt" and entry["name"] == "hello.txt"
    assert entry["status"] == "created"
    assert entry["bytes"] == len(content.encode())
    assert isinstance(entry["modified_at"], int) and entry["modified_at"] > 1_600_000_000
    assert (entry["lines_added"], entry["lines_removed"]) == (1, 0)
    assert diff(server, session_id, "sub/hello.txt") == {
        "object": "session.environment.filesystem.file_diff",
        "path": "sub/hello.txt",
        "before": None,
        "after": content,
    }

    def error(path: str, status: int, code: str, user: str = "alice@example.com") -> None:
        response = get(server, path, user=user)
        assert response.status_code == status, (path, response.text)
        assert response.json()["error"]["code"] == code, response.text

    error(changes_path(session_id, "other"), 404, "not_found")
    error(diff_path(session_id, "sub/hello.txt", "other"), 404, "not_found")
    error(diff_path(session_id, "%2E%2E/etc/passwd"), 400, "invalid_input")
    error(diff_path(session_id, "sub/%2E%2E/%2E%2E/x"), 400, "invalid_input")
    error(diff_path(session_id, "/etc/passwd"), 400, "invalid_input")
    error(diff_path(session_id, "%2Fetc%2Fpasswd"), 400, "invalid_input")
    error(diff_path(session_id, "sub/a%00b"), 400, "invalid_input")
    error(diff_path(session_id, "sub/other.txt"), 404, "not_found")
    error(diff_path(session_id, "hello.txt"), 404, "not_found")
    error(changes_path(session_id), 404, "not_found", user=STRANGER)
    error(diff_path(session_id, "sub/hello.txt"), 404, "not_found", user=STRANGER)


# --- 2. agent_edit: an existing file overwritten ----------------------------------------


def test_overwritten_existing_file_is_modified_with_before_and_after(
    server: Server,
    runner: Runner,
    plain_workspace: Path,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    (plain_workspace / "readme.txt").write_text("old line\nsame line\n")
    session_id = agent_session(server, runner, make_bundle)
    new = "new line\nsame line\n"
    mock_llm.configure(
        tools_then("Replaced.", call("c1", "sys_os_write", path="readme.txt", content=new))
    )
    turn = run_turn(server, session_id, "rewrite readme.txt")
    assert turn["status"] == "completed", turn

    assert (plain_workspace / "readme.txt").read_text() == new
    assert json.loads(outputs(server, session_id)["c1"])["created"] is False
    [entry] = changes(server, session_id)
    assert (entry["path"], entry["name"], entry["status"]) == (
        "readme.txt",
        "readme.txt",
        "modified",
    )
    assert entry["bytes"] == len(new)
    assert (entry["lines_added"], entry["lines_removed"]) == (1, 1)
    body = diff(server, session_id, "readme.txt")
    assert (body["before"], body["after"]) == ("old line\nsame line\n", new)


# --- 3. agent_edit: net status, failures and shell side effects -------------------------


def test_net_status_failed_tools_and_shell_side_effects(
    server: Server,
    runner: Runner,
    plain_workspace: Path,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    (plain_workspace / "keep.txt").write_text("keep me\n")
    (plain_workspace / "gone.txt").write_text("bye\n")
    (plain_workspace / "adir").mkdir()
    session_id = agent_session(server, runner, make_bundle)
    mock_llm.configure(
        [
            {"tool_calls": [call("w1", "sys_os_write", path="notes.txt", content="a\nb\n")]},
            {
                "tool_calls": [
                    call("e1", "sys_os_edit", path="notes.txt", oldText="b", newText="c"),
                    call("e2", "sys_os_edit", path="keep.txt", oldText="nope", newText="x"),
                    call("e3", "sys_os_edit", path="missing.txt", oldText="a", newText="b"),
                    call("w2", "sys_os_write", path="adir", content="not a dir"),
                    call("s1", "sys_os_shell", command="rm gone.txt"),
                ]
            },
            {"text": "Done."},
        ]
    )
    turn = run_turn(server, session_id, "make notes")
    assert turn["status"] == "completed", turn

    results = {call_id: json.loads(out) for call_id, out in outputs(server, session_id).items()}
    assert results["w1"]["created"] is True
    assert results["e1"]["replacements"] == 1
    assert "matched 0 times" in results["e2"]["error"]
    assert "not found" in results["e3"]["error"].lower()
    assert "directory" in results["w2"]["error"]
    assert results["s1"]["exit_code"] == 0 and "error" not in results["s1"]

    assert (plain_workspace / "notes.txt").read_text() == "a\nc\n"
    assert (plain_workspace / "keep.txt").read_text() == "keep me\n"
    assert not (plain_workspace / "gone.txt").exists()
    assert not (plain_workspace / "missing.txt").exists()
    assert (plain_workspace / "adir").is_dir()

    # Only the successful write + edit are tracked; the net status of created-then-
    # modified is created; shell side effects are not tracked in agent_edit mode.
    [entry] = changes(server, session_id)
    assert (entry["path"], entry["status"]) == ("notes.txt", "created")
    assert entry["bytes"] == 4 and (entry["lines_added"], entry["lines_removed"]) == (2, 0)
    body = diff(server, session_id, "notes.txt")
    assert (body["before"], body["after"]) == (None, "a\nc\n")
    for path in ("keep.txt", "gone.txt", "missing.txt", "adir"):
        assert get(server, diff_path(session_id, path)).status_code == 404, path


# --- 4. git workspace -------------------------------------------------------------------


def test_git_workspace_tracks_shell_and_edits_against_head(
    server: Server,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    runner_env: dict[str, str],
    extra_runners: list[Runner],
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "e2e@example.com")
    git(repo, "config", "user.name", "E2E")
    git(repo, "config", "commit.gpgsign", "false")
    head_text = "one\ntwo\nthree\n"
    (repo / "tracked.txt").write_text(head_text)
    (repo / "untouched.txt").write_text("still\n")
    git(repo, "add", "tracked.txt", "untouched.txt")
    git(repo, "commit", "-q", "-m", "initial")

    runner_id, token = register_runner(server, name="git-runner")
    runner = start_runner(
        server=server,
        token=token,
        runner_id=runner_id,
        workspace=repo,
        log_dir=tmp_path,
        extra_env=runner_env,
        name="git-runner",
    )
    extra_runners.append(runner)
    session_id = agent_session(server, runner, make_bundle)
    mock_llm.configure(
        tools_then(
            "Edited.",
            call("s1", "sys_os_shell", command="echo hi > new.txt"),
            call("e1", "sys_os_edit", path="tracked.txt", oldText="two\n", newText="2\n2b\n"),
        )
    )
    turn = run_turn(server, session_id, "edit the repo")
    assert turn["status"] == "completed", turn
    after_text = "one\n2\n2b\nthree\n"
    assert (repo / "new.txt").read_text() == "hi\n"
    assert (repo / "tracked.txt").read_text() == after_text

    entries = by_path(changes(server, session_id))
    assert set(entries) == {"new.txt", "tracked.txt"}
    created = entries["new.txt"]
    assert (created["name"], created["status"]) == ("new.txt", "created")
    assert created["bytes"] == 3
    assert (created["lines_added"], created["lines_removed"]) == (1, 0)
    modified = entries["tracked.txt"]
    assert modified["status"] == "modified" and modified["bytes"] == len(after_text)
    assert (modified["lines_added"], modified["lines_removed"]) == (2, 1)
    assert diff(server, session_id, "tracked.txt") == {
        "object": "session.environment.filesystem.file_diff",
        "path": "tracked.txt",
        "before": head_text,
        "after": after_text,
    }
    body = diff(server, session_id, "new.txt")
    assert (body["before"], body["after"]) == (None, "hi\n")
    assert get(server, diff_path(session_id, "untouched.txt")).status_code == 404


# --- 5. client-side tool round trip -----------------------------------------------------


def test_client_tool_round_trip_over_http(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    mock_llm.configure(
        tools_then("It is sunny in Oslo.", call("call_w1", "get_weather", city="Oslo"))
    )
    session_id = agent_session(server, runner, make_bundle)
    reader = StreamReader(server, session_id, until=is_final_idle)
    reader.wait_for(lambda event: event.type == "session.heartbeat")
    response = send_message(server, session_id, "weather in Oslo?", tools=[WEATHER_TOOL])
    assert response.status_code == 202, response.text
    response_id = response.json()["response_id"]

    parked = reader.wait_for(
        lambda event: (
            event.type == "response.output_item.done"
            and event.data["item"].get("type") == "function_call"
        )
    )
    item = parked.data["item"]
    assert parked.data["response_id"] == response_id
    assert item["status"] == "action_required"
    assert (item["call_id"], item["name"]) == ("call_w1", "get_weather")
    assert json.loads(item["arguments"]) == {"city": "Oslo"}
    waiting = reader.wait_for(
        lambda event: event.type == "session.status" and event.data["status"] == "waiting"
    )
    assert waiting.data["response_id"] == response_id
    wait_until(
        lambda: session(server, session_id)["status"] == "waiting",
        deadline_s=30,
        what="the session to read waiting",
    )
    assert session(server, session_id)["active_response_id"] == response_id

    # The LLM saw the client tool next to the built-in ones.
    first_request = mock_llm.requests[-1]["body"]
    tool_names = [tool["name"] for tool in first_request["tools"]]
    assert "get_weather" in tool_names and "sys_os_write" in tool_names

    with server.client() as client:
        relayed = client.post(
            f"/v1/sessions/{session_id}/events",
            json={
                "type": "function_call_output",
                "data": {"call_id": "call_w1", "output": "sunny"},
            },
        )
    assert relayed.status_code == 202, relayed.text
    assert relayed.json() == {"queued": True, "item_id": "call_w1"}

    turn = wait_turn(server, session_id, response_id)
    assert turn["status"] == "completed", turn
    reader.wait()
    assert reader.events[-1].data["status"] == "idle"
    assert "response.completed" in reader.types()

    requests = mock_llm.requests
    assert len(requests) == 2
    sent = [i for i in requests[-1]["body"]["input"] if i.get("type") == "function_call_output"]
    assert sent == [{"type": "function_call_output", "call_id": "call_w1", "output": "sunny"}]
    assert outputs(server, session_id) == {"call_w1": "sunny"}
    snapshot = session(server, session_id)
    assert snapshot["status"] == "idle" and snapshot["last_task_error"] is None
    calls = [i["data"] for i in snapshot["items"] if i["type"] == "function_call"]
    assert [c["call_id"] for c in calls] == ["call_w1"]


# --- 6. LLM failures --------------------------------------------------------------------


def wait_session_status(server: Server, session_id: str, status: str) -> dict[str, Any]:
    return dict(
        wait_until(
            lambda: (body := session(server, session_id))["status"] == status and body,
            deadline_s=30,
            what=f"session {session_id} to read {status}",
        )
    )


def test_llm_errors_fail_the_turn_and_the_next_message_works(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    # (a) HTTP 500 on every attempt: the SDK retries twice, then the turn fails.
    boom = {"error": {"status_code": 500, "message": "mock exploded"}}
    mock_llm.configure([boom, boom, boom])
    session_id = agent_session(server, runner, make_bundle)
    turn = run_turn(server, session_id, "this will fail")
    assert turn["status"] == "failed", turn
    assert turn["error"]["code"] == "llm_error"
    assert "500" in turn["error"]["message"], turn
    assert len(mock_llm.requests) == 3
    failed = wait_session_status(server, session_id, "failed")
    assert failed["last_task_error"]["code"] == "llm_error"
    assert "500" in failed["last_task_error"]["message"]

    mock_llm.configure([{"text": "Back on my feet."}])
    turn = run_turn(server, session_id, "try again")
    assert turn["status"] == "completed" and turn["error"] is None, turn
    recovered = wait_session_status(server, session_id, "idle")
    assert recovered["last_task_error"] is None
    texts = [
        part["text"]
        for item in turn["output"]
        if item["type"] == "message"
        for part in item["content"]
    ]
    assert texts == ["Back on my feet."]

    # (b) An unreachable LLM endpoint: connection_error.
    closed_port = free_port()
    auth = (
        "  auth:\n"
        "    type: api_key\n"
        "    api_key: x\n"
        f"    base_url: http://127.0.0.1:{closed_port}/v1\n"
    )
    unreachable = create_session(server, make_bundle(extra=auth + OS_ENV))
    bind(server, unreachable, runner.runner_id)
    before = len(mock_llm.requests)
    turn = run_turn(server, unreachable, "anyone there?")
    assert turn["status"] == "failed", turn
    assert turn["error"]["code"] == "connection_error", turn
    assert str(closed_port) in turn["error"]["message"]
    body = wait_session_status(server, unreachable, "failed")
    assert body["last_task_error"]["code"] == "connection_error"
    assert len(mock_llm.requests) == before


# --- 7. history across turns ------------------------------------------------------------


def test_second_turn_sees_the_first_turns_history(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    session_id = agent_session(server, runner, make_bundle)
    mock_llm.configure([{"text": "The first answer."}, {"text": "The second answer."}])
    assert run_turn(server, session_id, "first question")["status"] == "completed"
    assert run_turn(server, session_id, "second question")["status"] == "completed"

    first, second = (request["body"] for request in mock_llm.requests)
    assert conversation(first) == [("user", "first question")]
    assert conversation(second) == [
        ("user", "first question"),
        ("assistant", "The first answer."),
        ("user", "second question"),
    ]
    prompt = "You edit files with the sys_os_* tools."
    assert second["instructions"] == first["instructions"] == prompt
    assert second["model"] == "mock-model"


# --- 8. runner killed and restarted between turns ---------------------------------------


def test_conversation_and_changes_survive_a_runner_restart(
    server: Server,
    runner: Runner,
    plain_workspace: Path,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    runner_env: dict[str, str],
    extra_runners: list[Runner],
    tmp_path: Path,
) -> None:
    session_id = agent_session(server, runner, make_bundle)
    mock_llm.configure(
        tools_then("Turn one done.", call("c1", "sys_os_write", path="kept.txt", content="v1\n"))
    )
    assert run_turn(server, session_id, "turn one")["status"] == "completed"
    assert [(e["path"], e["status"]) for e in changes(server, session_id)] == [
        ("kept.txt", "created")
    ]

    assert runner.process is not None
    runner.process.kill()  # SIGKILL: no goodbye on the tunnel
    wait_runner_online(server, runner.runner_id, online=False)
    assert session(server, session_id)["runner_online"] is False
    assert [(e["path"], e["status"]) for e in changes(server, session_id)] == [
        ("kept.txt", "created")
    ]
    assert diff(server, session_id, "kept.txt")["after"] == "v1\n"

    restarted = start_runner(
        server=server,
        token=runner.token,
        runner_id=runner.runner_id,
        workspace=plain_workspace,
        log_dir=tmp_path,
        extra_env=runner_env,
        name="runner-restarted",
    )
    extra_runners.append(restarted)
    assert session(server, session_id)["runner_online"] is True

    mock_llm.configure(
        tools_then(
            "Turn two done.",
            call("c2", "sys_os_write", path="second.txt", content="v2\n"),
            call("c3", "sys_os_edit", path="kept.txt", oldText="v1", newText="v1b"),
        )
    )
    calls_before = len(mock_llm.requests)
    turn = run_turn(server, session_id, "turn two")
    assert turn["status"] == "completed", turn

    second_turn_first_request = mock_llm.requests[calls_before]["body"]
    assert conversation(second_turn_first_request) == [
        ("user", "turn one"),
        ("assistant", "Turn one done."),
        ("user", "turn two"),
    ]
    history_calls = [
        (item["type"], item["call_id"])
        for item in second_turn_first_request["input"]
        if item.get("type") in ("function_call", "function_call_output")
    ]
    assert history_calls == [("function_call", "c1"), ("function_call_output", "c1")]

    # kept.txt was created in this session before the restart: still created, and
    # its diff baseline is still "did not exist".
    entries = changes(server, session_id)
    assert [(e["path"], e["status"]) for e in entries] == [
        ("kept.txt", "created"),
        ("second.txt", "created"),
    ]
    assert (entries[0]["lines_added"], entries[0]["lines_removed"]) == (1, 0)
    assert diff(server, session_id, "kept.txt")["before"] is None
    assert diff(server, session_id, "kept.txt")["after"] == "v1b\n"
    assert (plain_workspace / "kept.txt").read_text() == "v1b\n"
    assert (plain_workspace / "second.txt").read_text() == "v2\n"


# --- 9. path escapes --------------------------------------------------------------------


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): (p.read_text() if p.is_file() else "<dir>")
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


def test_path_escapes_are_refused_and_touch_nothing_outside(
    server: Server,
    runner: Runner,
    plain_workspace: Path,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (plain_workspace / "link").symlink_to(outside, target_is_directory=True)
    (plain_workspace / "filelink.txt").symlink_to(outside / "secret.txt")
    before_outside = tree(outside)
    absolute_outside = str(outside / "abs.txt")
    absolute_inside = str(plain_workspace / "inside.txt")

    mock_llm.configure(
        tools_then(
            "Tried.",
            call("up", "sys_os_write", path="../escaped.txt", content="x"),
            call("deep", "sys_os_write", path="sub/../../escaped2.txt", content="x"),
            call("abs", "sys_os_write", path=absolute_outside, content="x"),
            call("link", "sys_os_write", path="link/via-link.txt", content="x"),
            call("flink", "sys_os_write", path="filelink.txt", content="pwned"),
            call("edit", "sys_os_edit", path="link/secret.txt", oldText="secret", newText="pwned"),
            call("read", "sys_os_read", path="../outside/secret.txt"),
            call("ok", "sys_os_write", path=absolute_inside, content="fine\n"),
        )
    )
    session_id = agent_session(server, runner, make_bundle)
    turn = run_turn(server, session_id, "try to escape")
    assert turn["status"] == "completed", turn

    results = {call_id: json.loads(out) for call_id, out in outputs(server, session_id).items()}
    refused = {
        "up": "../escaped.txt",
        "deep": "sub/../../escaped2.txt",
        "abs": absolute_outside,
        "link": "link/via-link.txt",
        "flink": "filelink.txt",
        "edit": "link/secret.txt",
        "read": "../outside/secret.txt",
    }
    for call_id, path in refused.items():
        assert results[call_id] == {"error": f"Access to '{path}' {OUTSIDE}"}, call_id
    assert results["ok"] == {"path": "inside.txt", "bytes_written": 5, "created": True}

    assert tree(outside) == before_outside
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "escaped2.txt").exists()
    assert (plain_workspace / "inside.txt").read_text() == "fine\n"
    assert not (plain_workspace / "sub").exists()
    assert [(e["path"], e["status"]) for e in changes(server, session_id)] == [
        ("inside.txt", "created")
    ]
