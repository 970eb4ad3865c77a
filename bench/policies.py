"""Benchmark: what the policy gate adds to a tool call (approvals.md).

1. ``decide()`` alone, µs per call: no rules; one ``allow`` rule that matches; one rule
   whose ``when`` regex scans a 64 KiB argument; 200 rules that do not match (each with a
   ``when``) before the match: the worst list the API accepts.
2. A tool call end to end on the runner: the real :class:`AgentExecutor` (agent loop,
   gate, built-in ``sys_os_read``) against the in-process mock LLM; one turn is a call
   and a final text, timed from ``turn.start`` to the session going ``idle``. The rule
   sets are interleaved turn by turn so machine drift hits them alike.

Run: ``.venv/bin/python -m bench.policies [--turns 200] [--repeat 5]``. The last line
printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import tempfile
import time
import timeit
from functools import partial
from pathlib import Path
from typing import Any

from bench._stats import fmt, summary_ms
from omnigent_runner import protocol
from omnigent_runner.agent import AgentExecutor
from omnigent_runner.bundles import build_bundle
from omnigent_runner.policies import decide, parse_rules
from testing.mockllm import MockLLMServer

ALLOW = {"name": "allow-read", "tools": ["sys_os_read"], "action": "allow"}
MISSES = [
    {"name": f"miss-{i}", "tools": ["sys_os_*"], "when": {"path": f"^nope{i}/"}, "action": "deny"}
    for i in range(199)
]
RULE_SETS: dict[str, list[dict[str, Any]]] = {
    "no_rules": [],
    "allow_rule": [ALLOW],
    "200_rules": [*MISSES, ALLOW],
}


def bench_decide(repeat: int) -> dict[str, float]:
    """Best-of-``repeat`` µs per decide() call for each case."""
    big = {"path": "a.txt", "content": "x" * (64 * 1024)}
    cases = {
        "no_rules": ([], {"path": "a.txt"}),
        "allow_rule": (parse_rules([ALLOW]), {"path": "a.txt"}),
        "when_on_64k": (
            parse_rules(
                [
                    {
                        "name": "r",
                        "tools": ["sys_os_read"],
                        "when": {"content": "y"},
                        "action": "deny",
                    }
                ]
            ),
            big,
        ),
        "200_rules": (parse_rules([*MISSES, ALLOW]), {"path": "a.txt"}),
    }
    result = {}
    for name, (rules, arguments) in cases.items():
        number = 200 if name == "when_on_64k" else 20_000
        timer = timeit.Timer(partial(decide, rules, tool="sys_os_read", arguments=arguments))
        best = min(timer.repeat(repeat=repeat, number=number)) / number
        result[name] = round(best * 1e6, 3)
    return result


class _Sink:
    def __init__(self) -> None:
        self.idle: dict[str, asyncio.Event] = {}

    def emit(self, session_id: str, event: protocol.AnyEvent) -> None:
        if isinstance(event, protocol.SessionStatus) and event.status in ("idle", "failed"):
            if event.status == "failed":
                raise RuntimeError(f"turn failed: {event.error}")
            self.idle.setdefault(event.response_id or "", asyncio.Event()).set()

    async def wait(self, response_id: str) -> None:
        await asyncio.wait_for(self.idle.setdefault(response_id, asyncio.Event()).wait(), 30)


async def bench_turns(turns: int) -> dict[str, dict[str, float | int]]:
    samples: dict[str, list[float]] = {name: [] for name in RULE_SETS}
    with MockLLMServer() as mock, tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        (workspace / "a.txt").write_text("hello\n")
        yaml_text = (
            "name: bench\nprompt: p\nexecutor:\n  model: mock-model\n  auth:\n"
            f"    type: api_key\n    api_key: sk-x\n    base_url: {mock.base_url}\n"
            "os_env:\n  cwd: .\n"
        )
        bundle = base64.b64encode(build_bundle({"agent.yaml": yaml_text})).decode()
        executor = AgentExecutor(workspace=workspace, env={}, llm_max_retries=0)
        sink = _Sink()
        executor.bind(sink)
        ref = protocol.AgentRef(id="a", version=1, bundle_b64=bundle)
        for name, raw in RULE_SETS.items():
            await executor.open_session(session_id=name, agent=ref, history=[])
            await executor.update_policies(session_id=name, rules=parse_rules(raw))
        call = {"name": "sys_os_read", "arguments": {"path": "a.txt"}}
        try:
            for index in range(turns + 5):  # the first 5 rounds warm up
                for name in RULE_SETS:
                    token = f"T{index}-{name}"
                    mock.configure([{"tool_calls": [call]}, {"text": "ok"}], match=token)
                    message = {"type": "message", "role": "user", "content": token}
                    started = time.perf_counter()
                    await executor.start_turn(
                        session_id=name, response_id=token, input=[message], tools=[]
                    )
                    await sink.wait(token)
                    if index >= 5:
                        samples[name].append(time.perf_counter() - started)
                    # The session history grows with every turn; keep it short.
                    await executor.open_session(session_id=name, agent=ref, history=[])
        finally:
            await executor.shutdown()
    return {name: summary_ms(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    gate = bench_decide(args.repeat)
    print("decide() per call (best of repeats):")
    for name, micros in gate.items():
        print(f"  {name:12s} {micros:9.3f} µs")
    turns = asyncio.run(bench_turns(args.turns))
    print("turn with one sys_os_read call (turn.start -> idle):")
    for name, stats in turns.items():
        print(f"  {name:12s} {fmt(stats)}")
    base = turns["no_rules"]["p50_ms"]
    added = {name: round(float(s["p50_ms"]) - float(base), 3) for name, s in turns.items()}
    print(f"added p50 vs no rules (ms): {added}")
    print(json.dumps({"decide_us": gate, "turn": turns, "added_p50_ms": added}))


if __name__ == "__main__":
    main()
