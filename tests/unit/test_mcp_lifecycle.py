"""The runner's MCP servers over time (mcp.md, "Lifecycle on the runner"): a server that
exits while idle, call deadlines kept by one timer per server, and servers shared by
sessions. Real stdio servers (the standard-library one starts in milliseconds)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from omnigent_runner.mcp_servers import CallClock, McpHub, McpSettings, SharedMcpServers
from omnigent_runner.mcp_spec import McpServerSpec
from tests.unit import agent_loop
from tests.unit.agent_loop import agent, agent_yaml, call, user

# The agent loop's fixtures: the in-process mock LLM, a workspace, executors.
mock = agent_loop.mock
workspace = agent_loop.workspace
make_executor = agent_loop.make_executor

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "testing" / "mcp_tiny_server.py")
ENV = {"PATH": os.environ.get("PATH", "")}


def tiny(name: str = "t", timeout: float = 120.0, *args: str) -> McpServerSpec:
    return McpServerSpec(
        name=name, transport="stdio", command=sys.executable, args=(TINY, *args), timeout=timeout
    )


class Reports:
    """A hub's ``report`` callback whose reports can be awaited."""

    def __init__(self) -> None:
        self.seen: list[dict[str, dict[str, Any]]] = []
        self._changed = asyncio.Event()

    def __call__(self, servers: dict[str, dict[str, Any]]) -> None:
        self.seen.append(servers)
        self._changed.set()

    async def wait(self, name: str, status: str, deadline_s: float = 60) -> dict[str, Any]:
        async with asyncio.timeout(deadline_s):
            while True:
                for servers in self.seen:
                    if servers.get(name, {}).get("status") == status:
                        return servers[name]
                self._changed.clear()
                await self._changed.wait()


def make_hub(specs: list[McpServerSpec], tmp_path: Path) -> tuple[McpHub, Reports]:
    reports = Reports()
    hub = McpHub(
        specs,
        cwd=tmp_path,
        settings=McpSettings(),
        env=ENV,
        report=reports,
        starts=asyncio.Semaphore(4),
    )
    return hub, reports


def server_processes() -> list[int]:
    """Live children of this process running the tiny server."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"mcp_tiny_server" in cmdline:
            found.append(int(entry.name))
    return found


async def ready_tool(hub: McpHub, name: str) -> tuple[Any, Any]:
    await asyncio.wait_for(hub.ready(), 60)
    found = hub.find(name)
    assert found is not None and found[1] is not None, hub.states()
    return found


# --- a server that exits while idle ----------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_a_server_that_exits_while_idle_is_reported_at_once(tmp_path: Path) -> None:
    hub, reports = make_hub([tiny()], tmp_path)
    hub.open()
    server, leave = await ready_tool(hub, "t__leave")
    connection = server._task
    assert connection is not None
    assert (await server.call(leave, {"seconds": 2.0})).text == "leaving"
    assert hub.states()["t"]["status"] == "ready"
    # No further call: the exit is seen on the server's output.
    failed = await reports.wait("t", "failed")
    assert failed["error"].startswith("exited: the server closed its output")
    assert "tiny server: leaving on request" in failed["error"]
    assert hub.tools() == []
    # The dead connection is left (its task ends once the SDK reaped the process) ...
    await asyncio.wait_for(asyncio.shield(connection), 30)
    assert server._task is None and server_processes() == []
    assert hub.states()["t"]["status"] == "failed"
    # ... and the next turn but the first restarts it, as for any failed server.
    await hub.begin_turn()
    await hub.begin_turn()
    server, echo = await ready_tool(hub, "t__echo")
    assert (await server.call(echo, {"text": "back"})).text == "back"
    await hub.close()
    assert server_processes() == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("steps", range(8))
async def test_a_hub_closed_while_its_servers_start_leaves_no_process(
    tmp_path: Path, steps: int
) -> None:
    hub, _ = make_hub([tiny(), tiny("u")], tmp_path)
    hub.open()
    for _ in range(steps):  # close at different points of the start
        await asyncio.sleep(0)
    await hub.close()
    starts = [server._starting for server in hub.servers if server._starting is not None]
    if starts:  # a start that went on after the close would launch its server now
        await asyncio.wait(starts, timeout=30)
    assert server_processes() == []
    assert all(state["status"] != "ready" for state in hub.states().values())


# --- call deadlines --------------------------------------------------------------------------


async def test_calls_in_a_row_arm_the_timer_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
        armed.append(when)
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting)
    clock = CallClock()
    for _ in range(1000):
        record = clock.begin(60, None)
        clock.end(record)
    monkeypatch.undo()
    assert len(armed) == 1
    assert len(clock) == 0
    clock.close()


async def test_the_timer_cancels_expired_calls_and_re_arms_for_the_next() -> None:
    clock = CallClock()

    async def one(timeout: float, wait: float, pause: float = 0.0) -> tuple[str, float]:
        started = time.monotonic()
        record = clock.begin(timeout, None)
        try:
            if pause:
                with clock.paused(record):
                    await asyncio.sleep(pause)
            await asyncio.sleep(wait)
        except asyncio.CancelledError:
            if clock.timed_out(record):
                return "timed out", time.monotonic() - started
            raise
        finally:
            clock.end(record)
        return "done", time.monotonic() - started

    async def later(delay: float, timeout: float, wait: float) -> tuple[str, float]:
        await asyncio.sleep(delay)
        return await one(timeout, wait)

    # Margins of a second or more: a loaded machine may stall the loop for a while.
    results = await asyncio.gather(
        one(1.0, 30),  # expires first
        later(0.5, 1.5, 30),  # begins later; its deadline is the re-armed timer's
        one(1.0, 0.01),  # ends early: the timer stays armed, fires, finds nothing of it
        one(1.0, 0.05, pause=1.5),  # a person answers for longer than its timeout
    )
    assert [r[0] for r in results] == ["timed out", "timed out", "done", "done"]
    assert 1.0 <= results[0][1] < 10
    assert 1.5 <= results[1][1] < 10
    clock.close()


async def test_an_outside_cancel_is_not_a_timeout() -> None:
    clock = CallClock()
    record: Any = None
    began = asyncio.Event()

    async def call() -> None:
        nonlocal record
        record = clock.begin(60, None)
        began.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            assert not clock.timed_out(record)
            raise
        finally:
            clock.end(record)

    task = asyncio.create_task(call())
    await began.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    clock.close()


async def test_concurrent_calls_on_one_server_time_out_each_on_its_own(tmp_path: Path) -> None:
    hub, _ = make_hub([tiny(timeout=3.0)], tmp_path)
    hub.open()
    server, slow = await ready_tool(hub, "t__slow")
    echo = hub.find("t__echo")[1]  # type: ignore[index]

    async def late_slow() -> Any:
        await asyncio.sleep(0.5)
        started = time.monotonic()
        output = await server.call(slow, {"seconds": 30})
        return output, time.monotonic() - started

    first, second, *echoes = await asyncio.gather(
        server.call(slow, {"seconds": 30}),
        late_slow(),
        *(server.call(echo, {"text": f"e{n}"}) for n in range(5)),
    )
    assert first.text == '{"error": "MCP call timed out after 3 s"}'
    assert second[0].text == first.text and second[1] >= 3.0
    assert [output.text for output in echoes] == [f"e{n}" for n in range(5)]
    assert hub.states()["t"]["status"] == "ready"
    await hub.close()


# --- servers shared by sessions ------------------------------------------------------------


def shared_yaml(base_url: str, comment: str = "") -> str:
    server = f"    type: mcp\n    command: {sys.executable}\n    args: [{TINY!r}]\n"
    return (
        agent_yaml(base_url, os_env=".")
        + comment
        + f"tools:\n  s:\n{server}    shared: true\n  own:\n{server}"
    )


def session_status(sink: Any, session_id: str, name: str, status: str) -> Any:
    def seen() -> bool:
        return any(
            sid == session_id
            and event["type"] == "session.mcp_status"
            and event["servers"].get(name, {}).get("status") == status
            for sid, event in sink.events
        )

    return seen


async def wait_seen(sink: Any, seen: Any, deadline_s: float = 60) -> None:
    await sink.wait_for(lambda event: seen(), timeout=deadline_s)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_a_shared_server_is_one_process_for_identical_declarations(
    mock, make_executor, workspace
) -> None:
    executor, sink = make_executor(env=ENV)
    yaml_text = shared_yaml(mock.base_url)
    for sid in ("sess_a", "sess_b"):
        await executor.open_session(session_id=sid, agent=agent(yaml_text), history=[])
    for sid in ("sess_a", "sess_b"):
        for name in ("s", "own"):
            await wait_seen(sink, session_status(sink, sid, name, "ready"))
    hubs = {sid: executor._sessions[sid].mcp for sid in ("sess_a", "sess_b")}
    assert hubs["sess_a"].servers[0] is hubs["sess_b"].servers[0]  # type: ignore[union-attr]
    assert hubs["sess_a"].servers[1] is not hubs["sess_b"].servers[1]  # type: ignore[union-attr]
    assert len(server_processes()) == 3  # one shared, one own per session

    # Another bundle (other bytes), an identical declaration: a process of its own.
    other = shared_yaml(mock.base_url, comment="# another bundle\n")
    await executor.open_session(
        session_id="sess_c", agent=agent(other, agent_id="agent_2"), history=[]
    )
    await wait_seen(sink, session_status(sink, "sess_c", "s", "ready"))
    assert len(server_processes()) == 5
    await executor.close_session(session_id="sess_c")
    assert len(server_processes()) == 3

    # A crash during a's call is seen by b, which uses the same process.
    mock.configure([{"tool_calls": [call("s__crash", {}, "c1")]}, {"text": "crashed"}])
    await executor.start_turn(
        session_id="sess_a", response_id="resp_1", input=[user("go")], tools=[]
    )
    await sink.wait_end("resp_1")
    await wait_seen(sink, session_status(sink, "sess_b", "s", "failed"))
    failed = [
        e["servers"]["s"]
        for sid, e in sink.events
        if sid == "sess_b" and e["type"] == "session.mcp_status"
    ][-1]
    assert failed["error"].startswith("exited")
    # a's next turn restarts it: b has it back too.
    marker = len(sink.events)
    mock.configure([{"text": "again"}])
    await executor.start_turn(
        session_id="sess_a", response_id="resp_2", input=[user("go")], tools=[]
    )
    await sink.wait_end("resp_2")
    assert any(
        sid == "sess_b"
        and e["type"] == "session.mcp_status"
        and e["servers"]["s"]["status"] == "ready"
        for sid, e in sink.events[marker:]
    )

    # a closes: the process stays for b (a's view: stopped), and b's calls go on.
    await executor.close_session(session_id="sess_a")
    last_a = [e for sid, e in sink.events if sid == "sess_a" and e["type"] == "session.mcp_status"][
        -1
    ]
    assert {name: state["status"] for name, state in last_a["servers"].items()} == {
        "s": "stopped",
        "own": "stopped",
    }
    assert len(server_processes()) == 2
    server, echo = hubs["sess_b"].find("s__echo")  # type: ignore[union-attr,misc]
    assert (await server.call(echo, {"text": "still here"})).text == "still here"
    # The last holder stops it.
    await executor.close_session(session_id="sess_b")
    assert server_processes() == []
    assert len(executor._mcp_shared) == 0


async def test_concurrent_questions_reach_their_own_calls(tmp_path: Path) -> None:
    """Two calls in flight on one server (as on a shared one), each asked a question
    (the current protocol's ``input_required``): each answer goes to its own call."""
    spec = McpServerSpec(
        name="t",
        transport="stdio",
        command=sys.executable,
        args=(str(REPO / "testing" / "mcp_server.py"),),
        env={"PYTHONPATH": str(REPO)},
    )
    hub, _ = make_hub([spec], tmp_path)
    hub.open()
    server, confirm = await ready_tool(hub, "t__confirm")
    asked: dict[str, str] = {}
    both_asked = asyncio.Event()

    def answering(who: str) -> Any:
        async def elicit(message: str, schema: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            asked[who] = message
            if len(asked) == 2:
                both_asked.set()
            await both_asked.wait()  # both questions are open at once
            return "accept", {"confirm": who == "a", "note": who}

        return elicit

    a, b = await asyncio.gather(
        server.call(confirm, {"question": "for a?"}, elicit=answering("a")),
        server.call(confirm, {"question": "for b?"}, elicit=answering("b")),
    )
    assert asked == {"a": "for a?", "b": "for b?"}
    assert a.text == "accepted: confirm=True note=a"
    assert b.text == "accepted: confirm=False note=b"
    await hub.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_a_hub_joining_a_running_shared_server_reports_it(tmp_path: Path) -> None:
    shared = SharedMcpServers()
    spec = McpServerSpec(
        name="s", transport="stdio", command=sys.executable, args=(TINY,), shared=True
    )

    def hub() -> tuple[McpHub, Reports]:
        reports = Reports()
        made = McpHub(
            [spec],
            cwd=tmp_path,
            settings=McpSettings(),
            env=ENV,
            report=reports,
            starts=asyncio.Semaphore(4),
            shared=shared,
            bundle="digest",
        )
        made.open()
        return made, reports

    first, _ = hub()
    await asyncio.wait_for(first.ready(), 60)
    second, reports = hub()  # the server is ready already: nothing changes on it
    assert (await reports.wait("s", "ready"))["tools"] == [
        "s__echo",
        "s__slow",
        "s__leave",
        "s__crash",
    ]
    assert len(server_processes()) == 1
    await first.close()
    assert len(server_processes()) == 1
    await second.close()
    assert server_processes() == [] and len(shared) == 0
