"""Benchmark: the runner's MCP servers (issue 38, mcp.md), on stdio, in this process.

1. **Call overhead** of a stdio ``echo``: p50 of the bare exchange on the server's pipes
   (one JSON-RPC line written, one read: the server's own time plus the pipe), of the
   SDK's ``call_tool``, and of the runner's ``McpServer.call`` (what a turn runs). The
   added cost of an MCP call is the runner's p50 minus the bare exchange's; its share
   that is the runner's own code is the runner's minus the SDK's.
2. **Open to ready** (``McpHub.open`` until every server listed its tools) for 1 and 5
   stdio servers: the minimal server (``testing/mcp_tiny_server.py``) and the project's
   test server written with the SDK's MCPServer (``testing/mcp_server.py``), the first
   open (the runner imports the SDK then) apart from the later ones.
3. **Memory**: the runner's RSS growth per running stdio server (5 servers open against
   none), and each server process's own RSS.
4. **Leaks**: a session of 5 servers opened and closed ``--cycles`` times: server
   processes left after each close (must be 0) and the runner's open file descriptors
   before and after.

Linux only (reads ``/proc``). Run: ``.venv/bin/python -m bench.mcp [--calls 2000]
[--cycles 100] [--ready-runs 3]``. The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench._stats import fmt, summary_ms
from omnigent_runner.mcp_servers import McpHub, McpSettings
from omnigent_runner.mcp_spec import McpServerSpec

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "testing" / "mcp_tiny_server.py")
SDK_SERVER = str(REPO / "testing" / "mcp_server.py")
PAGE = os.sysconf("SC_PAGE_SIZE")


def specs(count: int, script: str) -> list[McpServerSpec]:
    return [
        McpServerSpec(name=f"s{i}", transport="stdio", command=sys.executable, args=(script,))
        for i in range(count)
    ]


def hub_of(count: int, script: str, cwd: Path) -> McpHub:
    return McpHub(
        specs(count, script),
        cwd=cwd,
        settings=McpSettings(),
        env=dict(os.environ),
        report=lambda servers: None,
        starts=asyncio.Semaphore(8),
    )


def children() -> list[int]:
    """Live (not zombie) processes whose parent is this one: the MCP servers."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def rss_kib(pid: int | str = "self") -> int:
    try:
        resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return resident * PAGE // 1024


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def bare_exchange(calls: int) -> list[float]:
    """The floor: the tiny server's own time plus its pipes, no MCP client at all."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        TINY,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    samples = []
    try:
        for index in range(calls):
            request = {
                "jsonrpc": "2.0",
                "id": index,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "hello"}},
            }
            started = time.perf_counter()
            process.stdin.write((json.dumps(request) + "\n").encode())
            await process.stdin.drain()
            await process.stdout.readline()
            samples.append(time.perf_counter() - started)
    finally:
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 10)
    return samples


async def call_overhead(calls: int, cwd: Path) -> dict[str, Any]:
    bare = await bare_exchange(calls)
    hub = hub_of(1, TINY, cwd)
    hub.open()
    await hub.ready()
    found = hub.find("s0__echo")
    assert found is not None and found[1] is not None, hub.states()
    server, tool = found
    sdk, runner = [], []
    try:
        for _ in range(50):  # warm both paths
            await server.call(tool, {"text": "hello"})
        for _ in range(calls):  # interleaved, so drift hits both alike
            started = time.perf_counter()
            await server._client.call_tool("echo", {"text": "hello"})
            sdk.append(time.perf_counter() - started)
            started = time.perf_counter()
            output = await server.call(tool, {"text": "hello"})
            runner.append(time.perf_counter() - started)
            assert output.text == "hello", output
    finally:
        await hub.close()
    stats = {"bare": summary_ms(bare), "sdk": summary_ms(sdk), "runner": summary_ms(runner)}
    p50 = {name: float(value["p50_ms"]) for name, value in stats.items()}
    return {
        **stats,
        "added_p50_ms": round(p50["runner"] - p50["bare"], 3),
        "runner_layer_p50_ms": round(p50["runner"] - p50["sdk"], 3),
    }


async def open_to_ready(count: int, script: str, cwd: Path) -> tuple[float, dict[str, Any]]:
    hub = hub_of(count, script, cwd)
    started = time.perf_counter()
    hub.open()
    await hub.ready()
    elapsed = time.perf_counter() - started
    states = hub.states()
    await hub.close()
    assert all(state["status"] == "ready" for state in states.values()), states
    return elapsed, states


async def readiness(runs: int, cwd: Path) -> dict[str, Any]:
    first, _ = await open_to_ready(1, TINY, cwd)  # imports the SDK in the runner
    result: dict[str, Any] = {"first_open_s": round(first, 3)}
    for label, script in (("tiny", TINY), ("sdk_server", SDK_SERVER)):
        for count in (1, 5):
            samples = [(await open_to_ready(count, script, cwd))[0] for _ in range(runs)]
            result[f"{label}_{count}"] = summary_ms(samples)
    return result


async def memory(cwd: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for label, script in (("tiny", TINY), ("sdk_server", SDK_SERVER)):
        before = rss_kib()
        hub = hub_of(5, script, cwd)
        hub.open()
        await hub.ready()
        after = rss_kib()
        servers = [rss_kib(pid) for pid in children()]
        await hub.close()
        result[label] = {
            "runner_kib_per_server": round((after - before) / 5, 1),
            "server_process_kib": round(sum(servers) / max(len(servers), 1), 1),
            "servers_seen": len(servers),
        }
    return result


async def cycles(count: int, cwd: Path) -> dict[str, Any]:
    hub = hub_of(5, TINY, cwd)  # one warm cycle: lazy imports and first allocations
    hub.open()
    await hub.ready()
    await hub.close()
    fds_before, rss_before = open_fds(), rss_kib()
    leftover_max, durations = 0, []
    for _ in range(count):
        started = time.perf_counter()
        hub = hub_of(5, TINY, cwd)
        hub.open()
        await hub.ready()
        assert all(s["status"] == "ready" for s in hub.states().values()), hub.states()
        await hub.close()
        durations.append(time.perf_counter() - started)
        leftover_max = max(leftover_max, len(children()))
    return {
        "cycles": count,
        "leftover_processes_max": leftover_max,
        "fds_before": fds_before,
        "fds_after": open_fds(),
        "rss_kib_before": rss_before,
        "rss_kib_after": rss_kib(),
        "cycle": summary_ms(durations),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cwd = Path.cwd()
    results: dict[str, Any] = {}
    results["ready"] = await readiness(args.ready_runs, cwd)
    print("open -> ready (McpHub.open until every server listed its tools):")
    print(f"  first open (imports the SDK): {results['ready']['first_open_s']} s")
    for key in ("tiny_1", "tiny_5", "sdk_server_1", "sdk_server_5"):
        print(f"  {key:14s} {fmt(results['ready'][key])}")
    results["call"] = await call_overhead(args.calls, cwd)
    print("stdio echo call:")
    for key in ("bare", "sdk", "runner"):
        print(f"  {key:14s} {fmt(results['call'][key])}")
    print(
        f"  added p50 over the server's own exchange: {results['call']['added_p50_ms']} ms "
        f"(the runner's own layer: {results['call']['runner_layer_p50_ms']} ms)"
    )
    results["memory"] = await memory(cwd)
    print(f"memory: {results['memory']}")
    results["cycles"] = await cycles(args.cycles, cwd)
    print(f"open/close cycles of 5 servers: {results['cycles']}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--ready-runs", type=int, default=3)
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("bench.mcp reads /proc: Linux only")
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
