"""The runner's MCP servers (mcp.md) through the agent executor: real MCP servers
(testing/mcp_server.py, written with the SDK's MCPServer, and the third-party
mcp-server-time), the in-process mock LLM scripted to call ``<server>__<tool>``.
No network: stdio servers, and a Streamable HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omnigent_runner import protocol
from omnigent_runner.bundles import build_bundle, parse_bundle
from omnigent_runner.mcp_servers import cut_output
from testing.mcp_server import PNG_1X1
from tests.unit import agent_loop
from tests.unit.agent_loop import (
    SID,
    RecordingSink,
    agent,
    agent_yaml,
    call,
    done_items,
    user,
)

# The agent loop's fixtures: the in-process mock LLM, a workspace, executors.
mock = agent_loop.mock
workspace = agent_loop.workspace
make_executor = agent_loop.make_executor

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
SERVER = str(REPO / "testing" / "mcp_server.py")
TINY = str(REPO / "testing" / "mcp_tiny_server.py")  # starts in milliseconds
ENV = {"PATH": os.environ.get("PATH", ""), "OPENAI_API_KEY": "sk-runner-secret"}


def server_yaml(name: str, *args: str, extra: str = "") -> str:
    quoted = ", ".join(json.dumps(arg) for arg in (SERVER, *args))
    return (
        f"  {name}:\n    type: mcp\n    command: {sys.executable}\n    args: [{quoted}]\n"
        f"    env: {{PYTHONPATH: {json.dumps(str(REPO))}}}\n{extra}"
    )


def mcp_agent(base_url: str, tools: str, guardrails: str = "") -> str:
    return agent_yaml(base_url, os_env=".") + "tools:\n" + tools + guardrails


def our_children() -> list[str]:
    """Command lines of live processes whose parent is this test process (servers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and "mcp" in cmdline:
            found.append(cmdline)
    return found


def outputs(sink: RecordingSink, response_id: str) -> dict[str, str]:
    return {
        item["call_id"]: item["output"]
        for item in done_items(sink, response_id)
        if item["type"] == "function_call_output"
    }


async def status_of(sink: RecordingSink, name: str, *statuses: str) -> dict[str, Any]:
    event = await sink.wait_for(
        lambda e: (
            e["type"] == "session.mcp_status"
            and e["servers"].get(name, {}).get("status") in statuses
        ),
        timeout=60,
    )
    return event["servers"][name]


async def run_turn(executor, sink, response_id: str, text: str = "go") -> dict[str, Any]:
    await executor.start_turn(session_id=SID, response_id=response_id, input=[user(text)], tools=[])
    return await sink.wait_for(
        lambda e: (
            e["type"] == "session.status"
            and e.get("response_id") == response_id
            and e["status"] in ("idle", "failed")
        ),
        timeout=90,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_tools_of_a_test_server_and_a_third_party_server(mock, make_executor, workspace):
    tools = server_yaml("t") + (
        f"  time:\n    type: mcp\n    command: {sys.executable}\n"
        '    args: ["-m", "mcp_server_time", "--local-timezone", "UTC"]\n'
        "    tools: [get_current_time]\n"
    )
    mock.configure(
        [
            {
                "tool_calls": [
                    call("t__echo", {"text": "hello mcp"}, "c1"),
                    call("t__image", {}, "c2"),
                    call("t__fail", {"message": "boom"}, "c3"),
                    call("time__get_current_time", {"timezone": "UTC"}, "c4"),
                    call("t__where", {"names": ["OPENAI_API_KEY", "PYTHONPATH"]}, "c5"),
                ]
            },
            {"text": "done"},
        ]
    )
    executor, sink = make_executor(env=ENV)
    await executor.open_session(
        session_id=SID, agent=agent(mcp_agent(mock.base_url, tools)), history=[]
    )
    end = await run_turn(executor, sink, "resp_1")
    assert end["status"] == "idle"

    first = mock.requests[0]["body"]
    names = [tool["name"] for tool in first["tools"]]
    assert names[:4] == ["sys_os_read", "sys_os_write", "sys_os_edit", "sys_os_shell"]
    assert names[4:] == [
        "t__echo", "t__image", "t__fail", "t__slow", "t__crash", "t__confirm", "t__where",
        "time__get_current_time",
    ]  # fmt: skip
    echo = first["tools"][4]
    assert echo["description"] == "Return the text unchanged."
    assert echo["parameters"]["properties"]["text"]["type"] == "string"

    out = outputs(sink, "resp_1")
    assert out["c1"] == "hello mcp"
    assert out["c2"] == "a pixel\n[image: image/png, 70 bytes]"
    image_item = next(
        i for i in done_items(sink, "resp_1") if i.get("call_id") == "c2" and "output" in i
    )
    png_uri = "data:image/png;base64," + base64.b64encode(PNG_1X1).decode()
    assert image_item["images"] == [{"type": "input_image", "image_url": png_uri}]
    assert out["c3"].startswith("Error: ") and "boom" in out["c3"]
    assert json.loads(out["c4"])["timezone"] == "UTC"
    # The workspace is the working directory; nothing of the runner's environment
    # reaches the server but the safe variables and its declared env.
    assert f"cwd={workspace.resolve()}" in out["c5"]
    assert "'OPENAI_API_KEY': None" in out["c5"] and str(REPO) in out["c5"]
    second = mock.requests[1]["body"]
    sent = {
        i["call_id"]: i["output"]
        for i in second["input"]
        if i.get("type") == "function_call_output"
    }
    # The image reaches the model as an image: the output as content parts.
    assert sent.pop("c2") == [
        {"type": "input_text", "text": out.pop("c2")},
        {"type": "input_image", "image_url": png_uri, "detail": "auto"},
    ]
    assert sent == out

    ready = [e for _, e in sink.events if e["type"] == "session.mcp_status"][-1]["servers"]
    assert ready["t"]["status"] == "ready" and ready["time"]["tools"] == ["time__get_current_time"]
    assert ready["t"]["transport"] == "stdio"
    assert len(our_children()) == 2

    await executor.close_session(session_id=SID)
    assert our_children() == []
    final = [e for _, e in sink.events if e["type"] == "session.mcp_status"][-1]["servers"]
    assert {name: state["status"] for name, state in final.items()} == {
        "t": "stopped",
        "time": "stopped",
    }


async def test_failures_leave_the_turn_going(mock, make_executor, workspace):
    """A command that does not exist, a server that hangs at start, a crash mid-call
    and a call past its timeout: each is reported, and the turn goes on."""
    tiny = f"    type: mcp\n    command: {sys.executable}\n"
    tools = (
        "  nope: {type: mcp, command: no-such-mcp-command-xyz}\n"
        f"  hang:\n{tiny}    args: [{json.dumps(TINY)}, --hang]\n"
        f"  t:\n{tiny}    args: [{json.dumps(TINY)}]\n    timeout: 3\n"
    )
    mock.configure(
        [
            {"tool_calls": [call("t__slow", {"seconds": 30}, "c1")]},
            {"tool_calls": [call("t__crash", {}, "c2")]},
            {"tool_calls": [call("t__echo", {"text": "after"}, "c3")]},
            {"text": "first turn over"},
        ]
    )
    executor, sink = make_executor(env={**ENV, "OMNIGENT_RUNNER_MCP_START_TIMEOUT_S": "6"})
    await executor.open_session(
        session_id=SID, agent=agent(mcp_agent(mock.base_url, tools)), history=[]
    )
    nope = await status_of(sink, "nope", "failed")
    assert "not found" in nope["error"]
    hang = await status_of(sink, "hang", "failed")
    assert "did not start within 6 s" in hang["error"]

    end = await run_turn(executor, sink, "resp_1")
    assert end["status"] == "idle"
    out = outputs(sink, "resp_1")
    assert json.loads(out["c1"]) == {"error": "MCP call timed out after 3 s"}
    assert json.loads(out["c2"])["error"].startswith("MCP server t exited")
    assert "not running" in json.loads(out["c3"])["error"]
    # The crashed server's tools are gone from the next model call.
    names = [[t["name"] for t in r["body"]["tools"]] for r in mock.requests]
    assert "t__echo" in names[1] and "t__echo" not in names[2]

    # The next turn restarts it (once); the model has its tools again.
    mock.configure([{"tool_calls": [call("t__echo", {"text": "back"}, "c4")]}, {"text": "ok"}])
    end = await run_turn(executor, sink, "resp_2")
    assert end["status"] == "idle"
    assert outputs(sink, "resp_2")["c4"] == "back"
    await executor.close_session(session_id=SID)


async def test_policies_and_a_servers_question_go_through_the_gate(mock, make_executor):
    tools = server_yaml("t")
    guardrails = (
        "guardrails:\n  ask_on_mcp_tools: true\n  policies:\n"
        "    - {name: no-fail, tools: ['*__fail'], action: deny, reason: never}\n"
    )
    mock.configure(
        [
            {"tool_calls": [call("t__fail", {}, "c1")]},
            {"tool_calls": [call("t__confirm", {"question": "Ship it?"}, "c2")]},
            {"text": "done"},
        ]
    )
    executor, sink = make_executor(env=ENV)
    yaml_text = mcp_agent(mock.base_url, tools)
    yaml_text = yaml_text.replace("tools:\n", guardrails + "tools:\n", 1)
    await executor.open_session(session_id=SID, agent=agent(yaml_text), history=[])
    # The bundle's rules as the server sends them, the deny rule first.
    spec = parse_bundle(build_bundle({"agent.yaml": yaml_text})).spec
    rules = list(spec.guardrails.rules)
    await executor.update_policies(session_id=SID, rules=[rules[1], rules[0]])
    await executor.start_turn(session_id=SID, response_id="resp_1", input=[user("go")], tools=[])

    denied = await sink.wait_for(lambda e: e["type"] == "policy.denied")
    assert (denied["tool"], denied["policy_name"]) == ("t__fail", "no-fail")
    asked = await sink.wait_for(lambda e: e["type"] == "approval.requested")
    assert (asked["tool"], asked["policy_name"]) == ("t__confirm", "ask_on_mcp_tools")
    await executor.approval_verdict(
        session_id=SID,
        verdict=protocol.Verdict(
            elicitation_id="elicit_1", response_id="resp_1", call_id="c2", action="accept"
        ),
    )
    question = await sink.wait_for(
        lambda e: e["type"] == "approval.requested" and e.get("elicitation") is not None
    )
    assert question["call_id"] == "c2#q1" and question["policy_name"] == ""
    assert question["elicitation"]["message"] == "Ship it?"
    assert question["elicitation"]["requestedSchema"]["required"] == ["confirm"]
    await executor.approval_verdict(
        session_id=SID,
        verdict=protocol.Verdict(
            elicitation_id="elicit_2",
            response_id="resp_1",
            call_id="c2#q1",
            action="accept",
            content={"confirm": True, "note": "go"},
        ),
    )
    end = await sink.wait_end("resp_1")
    assert end["status"] == "idle"
    out = outputs(sink, "resp_1")
    assert json.loads(out["c1"]) == {"error": "denied by policy no-fail: never"}
    assert out["c2"] == "accepted: confirm=True note=go"
    await executor.close_session(session_id=SID)


async def test_images_reach_a_chat_completions_model_in_a_user_message(
    mock, make_executor, workspace
):
    """Chat ``tool`` messages hold text only: the images follow the tool messages in one
    ``user`` message; a BMP and an image past the 256 KiB budget stay placeholders."""
    mock.configure(
        [
            {
                "tool_calls": [
                    call("t__image", {"bmp": True, "big_kib": 300}, "c1"),
                    call("t__echo", {"text": "next"}, "c2"),
                ]
            },
            {"text": "seen"},
        ]
    )
    executor, sink = make_executor(env=ENV)
    yaml_text = agent_yaml(mock.base_url, api="chat_completions", os_env=".")
    await executor.open_session(
        session_id=SID, agent=agent(yaml_text + "tools:\n" + server_yaml("t")), history=[]
    )
    end = await run_turn(executor, sink, "resp_1")
    assert end["status"] == "idle"
    out = outputs(sink, "resp_1")
    assert out["c1"].split("\n") == [
        "a pixel",
        "[image: image/png, 70 bytes]",
        "[image: image/bmp, 66 bytes; not shown to the model: only PNG, JPEG, GIF and WebP "
        "images are]",
        "[image: image/png, 307200 bytes; not shown to the model: the images of one tool "
        "output are limited to 256 KiB]",
    ]
    png_uri = "data:image/png;base64," + base64.b64encode(PNG_1X1).decode()
    messages = mock.requests[1]["body"]["messages"]
    roles = [m["role"] for m in messages]
    # Each call is its own assistant message (the runner reports a call's output before
    # the next call): the images follow their output's tool message.
    assert roles[1:] == ["user", "assistant", "tool", "user", "assistant", "tool"]
    assert [messages[3]["content"], messages[6]["content"]] == [out["c1"], "next"]
    assert messages[4]["content"] == [
        {"type": "text", "text": "[images of the output of call c1]"},
        {"type": "image_url", "image_url": {"url": png_uri}},
    ]
    await executor.close_session(session_id=SID)


def test_image_blocks_rendered_for_the_model() -> None:
    """Which image blocks pass: the four types, whose bytes match, within one shared
    256 KiB budget; others are a placeholder with the reason."""
    import mcp_types as t

    from omnigent_runner.mcp_servers import render_result

    def image(data: bytes, mime: str) -> Any:
        return t.ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime)

    jpeg = b"\xff\xd8\xff" + bytes(200 * 1024)
    gif = b"GIF89a" + bytes(10)
    webp = b"RIFF\0\0\0\0WEBP" + bytes(4)
    result = t.CallToolResult(
        content=[
            image(jpeg, "image/jpeg"),
            image(bytes(100 * 1024), "image/png"),  # not a PNG
            image(PNG_1X1 + bytes(60 * 1024), "image/png"),  # past what is left
            image(gif, "image/gif"),
            image(webp, "image/webp"),
            image(b"RIFF\0\0\0\0WAVE", "image/webp"),
        ],
        is_error=False,
    )
    output = render_result(result)
    lines = output.text.split("\n")
    assert lines[0] == f"[image: image/jpeg, {len(jpeg)} bytes]"
    assert lines[1].endswith("not shown to the model: the data is not a image/png image]")
    assert lines[2].endswith("limited to 256 KiB]")
    assert lines[3:5] == ["[image: image/gif, 16 bytes]", "[image: image/webp, 16 bytes]"]
    assert "not a image/webp image" in lines[5]
    assert [image["image_url"].split(";")[0] for image in output.images] == [
        "data:image/jpeg",
        "data:image/gif",
        "data:image/webp",
    ]
    assert base64.b64decode(output.images[1]["image_url"].split(",")[1]) == gif


def test_output_is_cut_past_256_kib() -> None:
    text = "é" * (200 * 1024)
    cut = cut_output(text)
    assert len(cut.split("\n[output cut")[0].encode()) <= 256 * 1024
    assert cut.endswith(f"of {len(text.encode())}]")
    assert cut_output("short") == "short"


def serve(transport: str) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, SERVER, f"--{transport}", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("MCP_URL "), line
        yield line.split()[1]
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def http_server() -> Iterator[str]:
    yield from serve("http")


@pytest.fixture
def sse_server() -> Iterator[str]:
    yield from serve("sse")


async def test_legacy_sse_server(mock, make_executor, sse_server) -> None:
    """A url whose path ends ``/sse`` is the legacy SSE transport: tools, a call and an
    image through it."""
    assert sse_server.endswith("/sse")
    mock.configure(
        [
            {
                "tool_calls": [
                    call("old__echo", {"text": "over sse"}, "c1"),
                    call("old__image", {}, "c2"),
                ]
            },
            {"text": "ok"},
        ]
    )
    executor, sink = make_executor(env=ENV)
    tools = f"  old:\n    type: mcp\n    url: {sse_server}\n"
    await executor.open_session(
        session_id=SID, agent=agent(mcp_agent(mock.base_url, tools)), history=[]
    )
    state = await status_of(sink, "old", "ready", "failed")
    assert state["status"] == "ready" and state["transport"] == "sse", state
    end = await run_turn(executor, sink, "resp_1")
    assert end["status"] == "idle"
    out = outputs(sink, "resp_1")
    assert out["c1"] == "over sse"
    assert out["c2"] == "a pixel\n[image: image/png, 70 bytes]"
    await asyncio.wait_for(executor.close_session(session_id=SID), 30)


async def test_streamable_http_server_with_an_expanded_header(mock, make_executor, http_server):
    tools = (
        f"  web:\n    type: mcp\n    url: {http_server}\n"
        '    headers: {X-Token: "${MCP_TOKEN}"}\n'
        f"  other:\n    type: mcp\n    url: {http_server}\n"
        '    headers: {X-Token: "${OPENAI_API_KEY}"}\n'
    )
    mock.configure(
        [{"tool_calls": [call("web__echo", {"text": "over http"}, "c1")]}, {"text": "ok"}]
    )
    env = {**ENV, "MCP_TOKEN": "t0k", "OMNIGENT_RUNNER_MCP_ENV": "MCP_TOKEN"}
    executor, sink = make_executor(env=env)
    await executor.open_session(
        session_id=SID, agent=agent(mcp_agent(mock.base_url, tools)), history=[]
    )
    other = await status_of(sink, "other", "failed")
    assert "${OPENAI_API_KEY} is not allowed" in other["error"]
    assert "sk-runner-secret" not in json.dumps(sink.events)
    end = await run_turn(executor, sink, "resp_1")
    assert end["status"] == "idle"
    assert outputs(sink, "resp_1")["c1"] == "over http"
    state = await status_of(sink, "web", "ready")
    assert state["transport"] == "http"
    await asyncio.wait_for(executor.close_session(session_id=SID), 30)


# --- McpHub on its own ----------------------------------------------------------------------


def hub_for(specs: list[Any], tmp_path: Path, **settings: Any) -> tuple[Any, list[Any]]:
    from omnigent_runner.mcp_servers import McpHub, McpSettings

    reports: list[Any] = []
    hub = McpHub(
        specs,
        cwd=tmp_path,
        settings=McpSettings(**settings),
        env=ENV,
        report=reports.append,
        starts=asyncio.Semaphore(4),
    )
    return hub, reports


async def test_operator_settings_refuse_stdio_and_private_addresses(tmp_path: Path) -> None:
    from omnigent_runner.mcp_spec import McpServerSpec

    hub, reports = hub_for(
        [
            McpServerSpec(name="local", transport="stdio", command=sys.executable),
            McpServerSpec(name="web", transport="http", url="http://127.0.0.1:9/mcp"),
        ],
        tmp_path,
        allow_stdio=False,
        allow_private_urls=False,
    )
    hub.open()
    await asyncio.wait_for(hub.ready(), 60)
    states = hub.states()
    assert states["local"]["status"] == "failed"
    assert "OMNIGENT_RUNNER_MCP_STDIO=0" in states["local"]["error"]
    assert states["web"]["status"] == "failed"
    assert "private" in states["web"]["error"]
    assert reports[-1] == states
    await hub.close()


async def test_a_servers_question_under_the_older_protocol(tmp_path: Path, monkeypatch) -> None:
    """``elicitation/create`` mid-call (the initialize handshake's protocols) reaches the
    same handler as the current protocol's ``input_required`` result."""
    import mcp

    from omnigent_runner.mcp_spec import McpServerSpec

    class LegacyClient(mcp.Client):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, mode="legacy", **kwargs)

    monkeypatch.setattr(mcp, "Client", LegacyClient)
    spec = McpServerSpec(name="t", transport="stdio", command=sys.executable, args=(SERVER,))
    hub, _ = hub_for([spec], tmp_path)
    hub.open()
    await asyncio.wait_for(hub.ready(), 60)
    found = hub.find("t__confirm")
    assert found is not None and found[1] is not None, hub.states()
    server, tool = found
    assert server._client.protocol_version == "2025-11-25"
    asked: list[tuple[str, dict[str, Any]]] = []

    async def elicit(message: str, schema: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
        asked.append((message, schema))
        return "decline", None

    output = await server.call(tool, {"question": "Old style?"}, elicit=elicit)
    assert output.text == "declined"
    assert asked[0][0] == "Old style?" and asked[0][1]["required"] == ["confirm"]
    await hub.close()


async def test_failure_messages_never_carry_header_values_or_url_secrets(tmp_path: Path) -> None:
    from omnigent_runner.mcp_spec import McpServerSpec

    spec = McpServerSpec(
        name="web",
        transport="http",
        url="http://user:pa55word@127.0.0.1:9/mcp?key=qu3ry-secret",
        headers={"Authorization": "Bearer ${MCP_TOKEN}"},
    )
    hub, reports = hub_for([spec], tmp_path, allowed_env=frozenset({"MCP_TOKEN"}))
    hub.servers[0].env = {**ENV, "MCP_TOKEN": "t0k3n-value"}
    hub.open()
    await asyncio.wait_for(hub.ready(), 60)
    state = hub.states()["web"]
    assert state["status"] == "failed", state
    text = json.dumps(reports)
    for secret in ("pa55word", "qu3ry-secret", "t0k3n-value"):
        assert secret not in text
    await hub.close()
