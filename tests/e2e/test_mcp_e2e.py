"""MCP servers end to end (mcp.md): real daphne, the real runner program, the mock LLM
scripted to call ``<server>__<tool>``, and real MCP servers with no network: the
project's test server (testing/mcp_server.py, the SDK's MCPServer) and the third-party
``mcp-server-time``. The model's calls reach both, a server's question is answered
through the approval endpoint, the state is on the stream, in the snapshot and in
``GET …/agent``, and a runner killed with SIGKILL leaves no MCP server running. The
policy gate denies, asks and allows MCP calls, an image reaches the model as one, a
timeout and a crash leave the turn going, and a deleted session leaves no server."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Runner,
    Server,
    StreamReader,
    bind,
    create_session,
    send_message,
    wait_turn,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "testing" / "mcp_server.py"
TOOLS = (
    "os_env:\n  type: caller_process\n  cwd: .\n"
    "tools:\n"
    f"  t:\n    type: mcp\n    command: {sys.executable}\n"
    # --linger: it outlives its stdin, so only the parent-death signal can stop it.
    f'    args: [{json.dumps(str(SERVER))}, "--linger"]\n'
    f"  time:\n    type: mcp\n    command: {sys.executable}\n"
    '    args: ["-m", "mcp_server_time", "--local-timezone", "UTC"]\n'
)


def servers_in(workspace: Path) -> list[int]:
    """Live processes whose working directory is ``workspace`` (the MCP servers')."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(entry / "cwd").resolve() != workspace.resolve():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_model_calls_mcp_tools_and_a_killed_runner_leaves_no_server(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    mock_llm.configure(
        [
            {
                "tool_calls": [
                    {"call_id": "c1", "name": "t__echo", "arguments": {"text": "via mcp"}},
                    {"call_id": "c2", "name": "t__confirm", "arguments": {"question": "Go?"}},
                    {
                        "call_id": "c3",
                        "name": "time__get_current_time",
                        "arguments": {"timezone": "UTC"},
                    },
                ]
            },
            {"text": "all done"},
        ]
    )
    session_id = create_session(server, make_bundle(extra=TOOLS))
    bind(server, session_id, runner.runner_id)
    stream = StreamReader(server, session_id, until=lambda e: e.type == "response.completed")
    stream.wait_connected()
    response = send_message(server, session_id, "use the tools")
    assert response.status_code == 202, response.text
    response_id = response.json()["response_id"]

    ready = stream.wait_for(
        lambda e: (
            e.type == "session.mcp_status"
            and all(s["status"] == "ready" for s in e.data["servers"].values())
        ),
        deadline_s=90,
    ).data
    assert ready["servers"]["time"]["tools"] == ["time__get_current_time", "time__convert_time"]

    question = stream.wait_for(
        lambda e: e.type == "response.elicitation_request", deadline_s=90
    ).data
    assert question["params"]["policy_name"] is None
    assert question["params"]["message"] == "Go?"
    assert question["params"]["requestedSchema"]["required"] == ["confirm"]
    with server.client() as client:
        answered = client.post(
            f"/v1/sessions/{session_id}/elicitations/{question['elicitation_id']}/resolve",
            json={"action": "accept", "content": {"confirm": True, "note": "fine"}},
            headers={"Origin": "omnigent://internal"},
        )
    assert answered.status_code == 202, answered.text

    turn = wait_turn(server, session_id, response_id, deadline_s=90)
    assert turn["status"] == "completed", turn
    outputs = {
        item["call_id"]: item["output"]
        for item in turn["output"]
        if item["type"] == "function_call_output"
    }
    assert outputs["c1"] == "via mcp"
    assert outputs["c2"] == "accepted: confirm=True note=fine"
    assert json.loads(outputs["c3"])["timezone"] == "UTC"
    # What the model was sent for its second call.
    sent = mock_llm.requests[-1]["body"]
    names = [tool["name"] for tool in sent["tools"]]
    assert "t__echo" in names and "time__get_current_time" in names

    with server.client() as client:
        snapshot = client.get(f"/v1/sessions/{session_id}").json()
        agent = client.get(f"/v1/sessions/{session_id}/agent").json()
    assert snapshot["mcp_servers"]["t"]["status"] == "ready"
    assert [(s["name"], s["status"], s["transport"]) for s in agent["mcp_servers"]] == [
        ("t", "ready", "stdio"),
        ("time", "ready", "stdio"),
    ]
    assert "t__echo" in agent["mcp_servers"][0]["tools"]

    assert len(servers_in(runner.workspace)) == 2
    assert runner.process is not None
    runner.process.stop(sig=signal.SIGKILL)
    wait_until(
        lambda: not servers_in(runner.workspace),
        deadline_s=30,
        what="the MCP servers to exit after the runner was killed",
    )


TINY = REPO / "testing" / "mcp_tiny_server.py"
GATED_TOOLS = (
    "os_env:\n  type: caller_process\n  cwd: .\n"
    "tools:\n"
    f"  t:\n    type: mcp\n    command: {sys.executable}\n    args: [{json.dumps(str(SERVER))}]\n"
    f"  tiny:\n    type: mcp\n    command: {sys.executable}\n    args: [{json.dumps(str(TINY))}]\n"
    "    timeout: 3\n"
)
RULES = [
    {"name": "no-fail", "tools": ["*__fail"], "action": "deny", "reason": "never"},
    {"name": "ask-echo", "tools": ["tiny__echo"], "action": "ask"},
]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_policies_an_image_a_timeout_and_a_crash_then_the_session_closes(
    server: Server, runner: Runner, mock_llm: MockLLMServer, make_bundle: Callable[..., bytes]
) -> None:
    """The gate denies, asks and allows MCP calls; an image reaches the model as an
    image; a call past its timeout and a server that crashes mid-call leave the turn
    going; deleting the session stops its servers."""
    mock_llm.configure(
        [
            {
                "tool_calls": [
                    {"call_id": "c1", "name": "t__image", "arguments": {}},
                    {"call_id": "c2", "name": "t__fail", "arguments": {}},
                    {"call_id": "c3", "name": "tiny__echo", "arguments": {"text": "asked"}},
                    {"call_id": "c4", "name": "tiny__slow", "arguments": {"seconds": 30}},
                    {"call_id": "c5", "name": "tiny__crash", "arguments": {}},
                ]
            },
            {"text": "the turn went on"},
        ]
    )
    session_id = create_session(server, make_bundle(extra=GATED_TOOLS))
    with server.client() as client:
        response = client.put(f"/v1/sessions/{session_id}/policies", json={"rules": RULES})
        assert response.status_code == 200, response.text
    bind(server, session_id, runner.runner_id)
    stream = StreamReader(server, session_id, until=lambda e: e.type == "response.completed")
    stream.wait_connected()
    response = send_message(server, session_id, "use the tools")
    assert response.status_code == 202, response.text
    response_id = response.json()["response_id"]

    question = stream.wait_for(
        lambda e: e.type == "response.elicitation_request", deadline_s=120
    ).data
    assert question["params"]["policy_name"] == "ask-echo"
    with server.client() as client:
        answered = client.post(
            f"/v1/sessions/{session_id}/elicitations/{question['elicitation_id']}/resolve",
            json={"action": "accept"},
            headers={"Origin": "omnigent://internal"},
        )
    assert answered.status_code == 202, answered.text

    turn = wait_turn(server, session_id, response_id, deadline_s=120)
    assert turn["status"] == "completed", turn
    items = {
        item["call_id"]: item for item in turn["output"] if item["type"] == "function_call_output"
    }
    assert items["c1"]["output"] == "a pixel\n[image: image/png, 70 bytes]"
    assert items["c1"]["images"][0]["image_url"].startswith("data:image/png;base64,")
    assert json.loads(items["c2"]["output"]) == {"error": "denied by policy no-fail: never"}
    assert items["c3"]["output"] == "asked"
    assert json.loads(items["c4"]["output"]) == {"error": "MCP call timed out after 3 s"}
    assert json.loads(items["c5"]["output"])["error"].startswith("MCP server tiny exited")
    # What the model was sent after the calls: the image as an image.
    sent = {
        item["call_id"]: item["output"]
        for item in mock_llm.requests[-1]["body"]["input"]
        if item.get("type") == "function_call_output"
    }
    assert sent["c1"][0] == {"type": "input_text", "text": items["c1"]["output"]}
    assert sent["c1"][1]["type"] == "input_image"
    assert sent["c1"][1]["image_url"] == items["c1"]["images"][0]["image_url"]
    assert sent["c3"] == "asked"

    wait_until(
        lambda: len(servers_in(runner.workspace)) == 1,  # t; tiny crashed
        deadline_s=30,
        what="the crashed server to be gone",
    )
    with server.client() as client:
        deleted = client.delete(f"/v1/sessions/{session_id}")
        assert deleted.status_code == 200, deleted.text
    wait_until(
        lambda: not servers_in(runner.workspace),
        deadline_s=60,
        what="the MCP servers to stop after the session was deleted",
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_runner_that_stops_stops_its_servers(
    server: Server, runner: Runner, make_bundle: Callable[..., bytes]
) -> None:
    """SIGTERM: the runner's own shutdown stops every session's servers, a shared one too."""
    tools = (
        "os_env:\n  type: caller_process\n  cwd: .\n"
        "tools:\n"
        f"  a:\n    type: mcp\n    command: {sys.executable}\n    args: [{json.dumps(str(TINY))}]\n"
        f"  b:\n    type: mcp\n    command: {sys.executable}\n    args: [{json.dumps(str(TINY))}]\n"
        "    shared: true\n"
    )
    bundle = make_bundle(extra=tools)
    sessions = [create_session(server, bundle) for _ in range(2)]
    streams = []
    for session_id in sessions:
        stream = StreamReader(server, session_id)
        stream.wait_connected()
        streams.append(stream)
        bind(server, session_id, runner.runner_id)
    for stream in streams:
        stream.wait_for(
            lambda e: (
                e.type == "session.mcp_status"
                and [s["status"] for s in e.data["servers"].values()] == ["ready", "ready"]
            ),
            deadline_s=90,
        )
    # Two sessions: an own server each and one shared by both.
    assert len(servers_in(runner.workspace)) == 3
    assert runner.process is not None
    assert runner.process.stop(sig=signal.SIGTERM) == 0
    assert servers_in(runner.workspace) == []
