"""The worked example of docs/agents.md ("MCP servers") runs as written: its bundle's
``tools:`` through the agent executor, the in-process mock LLM calling the third-party
server's tool. Only the model's address (the mock) and the Python the declaration names
(this test's interpreter, where the server is installed) are put in."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit import agent_loop
from tests.unit.agent_loop import SID, agent, call, done_items, user

mock = agent_loop.mock
workspace = agent_loop.workspace
make_executor = agent_loop.make_executor

pytestmark = pytest.mark.timeout(120)

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def example(name: str) -> dict[str, Any]:
    """The YAML block after the doc's ``<!-- worked-example: <name> ... -->`` marker."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(
        rf"<!-- worked-example: {name}\b[^\n]*-->\n```yaml\n(.*?)\n```", text, re.DOTALL
    )
    assert found is not None, f"docs/agents.md has no worked example {name!r}"
    return yaml.safe_load(found.group(1))


def runnable(spec: dict[str, Any], base_url: str) -> str:
    """The example with the mock as its model and this interpreter as ``python``."""
    spec = {"name": "example", "prompt": "p", **spec}
    spec["executor"] = {
        "model": "mock-model",
        "auth": {"type": "api_key", "api_key": "sk-test", "base_url": base_url},
    }
    for server in spec["tools"].values():
        if server.get("command") == "python":
            server["command"] = sys.executable
    return yaml.safe_dump(spec)


async def run(executor: Any, sink: Any, response_id: str) -> dict[str, str]:
    await executor.start_turn(session_id=SID, response_id=response_id, input=[user("go")], tools=[])
    end = await sink.wait_end(response_id)
    assert end["status"] == "idle", end
    return {
        item["call_id"]: item["output"]
        for item in done_items(sink, response_id)
        if item["type"] == "function_call_output"
    }


async def test_the_time_example(mock, make_executor, workspace) -> None:
    spec = example("time")
    assert spec["tools"]["time"]["command"] == "python"
    mock.configure(
        [
            {"tool_calls": [call("time__get_current_time", {"timezone": "Asia/Tokyo"}, "c1")]},
            {"text": "It is night in Tokyo."},
        ]
    )
    executor, sink = make_executor(env={"PATH": os.environ.get("PATH", "")})
    await executor.open_session(
        session_id=SID, agent=agent(runnable(spec, mock.base_url)), history=[]
    )
    out = await run(executor, sink, "resp_1")
    answer = json.loads(out["c1"])
    assert answer["timezone"] == "Asia/Tokyo" and answer["datetime"]
    # What the doc says the model is offered: the allow-listed tool only.
    assert [tool["name"] for tool in mock.requests[0]["body"]["tools"]] == [
        "time__get_current_time"
    ]
    states = [e["servers"] for _, e in sink.events if e["type"] == "session.mcp_status"]
    assert states[0]["time"]["status"] == "starting"
    assert states[-1]["time"] == {
        "status": "ready",
        "transport": "stdio",
        "tools": ["time__get_current_time"],
    }
    await executor.close_session(session_id=SID)


async def test_the_git_example(mock, make_executor, workspace: Path) -> None:
    spec = {"os_env": {"type": "caller_process", "cwd": "."}, **example("git")}
    await asyncio.to_thread(subprocess.run, ["git", "init", "-q", str(workspace)], check=True)
    (workspace / "new.txt").write_text("hello\n")
    mock.configure(
        [
            {"tool_calls": [call("git__git_status", {"repo_path": str(workspace)}, "c1")]},
            {"text": "one untracked file"},
        ]
    )
    executor, sink = make_executor(env={"PATH": os.environ.get("PATH", "")})
    await executor.open_session(
        session_id=SID, agent=agent(runnable(spec, mock.base_url)), history=[]
    )
    out = await run(executor, sink, "resp_1")
    assert "new.txt" in out["c1"]
    names = [tool["name"] for tool in mock.requests[0]["body"]["tools"]]
    assert [name for name in names if name.startswith("git__")] == [
        "git__git_status",
        "git__git_diff_unstaged",
    ]
    await executor.close_session(session_id=SID)
