"""Turns through a tunnel that keeps breaking (docs/testing.md, "Forced tunnel drops"):
shared by ``tests/e2e/test_tunnel_drops.py`` (≥ 50 drops) and ``bench/tunnel_drops.py``
(200 drops).

The runner dials the server through :class:`testing.chaos_proxy.ChaosProxy`; the HTTP
client and the stream readers talk to the server directly. Turn after turn, the mock
LLM is scripted with text known in advance (every other turn a ``sys_os_write`` call
first), and drops of a kind drawn from a seeded ``random.Random`` are armed at random
byte offsets of the tunnel while the turn runs. At the end :func:`verify` compares the
stored items and the stream replayed from the start against the script: nothing lost,
nothing twice, every turn completed.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from testing.chaos_proxy import DROP_KINDS, ChaosProxy
from testing.mockllm import MockLLMServer
from testing.processes import (
    Server,
    StreamReader,
    send_message,
    wait_runner_online,
    wait_turn,
    wait_until,
)

SEED = 15
# What the server and the runner are told, so that a black hole is noticed in 1.5 s
# (3 x the heartbeat) and a runner away that long is not failed (the grace).
SERVER_SETTINGS = {
    "OMNIGENT_HEARTBEAT_S": "0.5",
    "OMNIGENT_RECONNECT_GRACE_S": "60",
    "OMNIGENT_EVENT_RETENTION": "100000",
}
OS_ENV = "os_env:\n  type: caller_process\n  cwd: .\n"
# Where a cut lands: this many bytes (either direction) after it is armed. A turn moves
# a few kilobytes through the tunnel, so most cuts land inside one, some between.
MAX_AFTER_BYTES = 6000
TURN_DEADLINE_S = 60.0


@dataclass
class ScriptedTurn:
    prompt: str
    text: str
    call_id: str | None
    response_id: str = ""


@dataclass
class DropReport:
    drops: int = 0
    drops_by_kind: dict[str, int] = field(default_factory=dict)
    unnoticed_black_holes: int = 0
    turns: int = 0
    completed: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    reconnects: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "drops": self.drops,
            "drops_by_kind": self.drops_by_kind,
            "unnoticed_black_holes": self.unnoticed_black_holes,
            "turns": self.turns,
            "completed": self.completed,
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "problems": self.problems[:20],
            "tunnel_connections": self.reconnects,
            "seconds": round(self.seconds, 1),
        }


def script_turn(index: int, rng: random.Random) -> tuple[ScriptedTurn, list[dict[str, Any]]]:
    """The turn's mock script and what it must leave behind."""
    words = " ".join(f"w{index}.{n}" for n in range(rng.randint(8, 40)))
    turn = ScriptedTurn(
        prompt=f"turn {index}",
        text=f"Turn {index} says {words}.",
        call_id=f"call_{index}" if index % 2 else None,
    )
    script: list[dict[str, Any]] = []
    if turn.call_id is not None:
        arguments = {"path": f"turn-{index}.txt", "content": words}
        script.append(
            {
                "tool_calls": [
                    {"call_id": turn.call_id, "name": "sys_os_write", "arguments": arguments}
                ]
            }
        )
    script.append({"text": turn.text, "stream": True, "delay_s": rng.uniform(0, 0.3)})
    return turn, script


def run_turns(
    *,
    server: Server,
    proxy: ChaosProxy,
    mock_llm: MockLLMServer,
    session_id: str,
    runner_id: str,
    drops: int,
    seed: int = SEED,
    log: Any = None,
) -> tuple[list[ScriptedTurn], DropReport]:
    """Run turns until ``drops`` drops have been carried out; return the turns."""
    rng = random.Random(seed)
    report = DropReport()
    turns: list[ScriptedTurn] = []
    started = time.monotonic()
    index = 0
    while len(proxy.drops) < drops:
        turn, script = script_turn(index, rng)
        mock_llm.configure(script)
        # A turn is posted only while the tunnel is up and quiet: the relay of its
        # ``turn_start`` is not what is under test (a dead tunnel answers 503).
        _settle(server, proxy, runner_id)
        accepted = send_message(server, session_id, turn.prompt)
        if accepted.status_code != 202:
            raise AssertionError(f"turn {index}: {accepted.status_code} {accepted.text}")
        turn.response_id = str(accepted.json()["response_id"])
        turns.append(turn)
        # One or two drops during the turn: the second is armed once the first is done.
        for _ in range(rng.choice((1, 2))):
            kind = rng.choice(DROP_KINDS)
            proxy.arm(kind, after_bytes=rng.randint(0, MAX_AFTER_BYTES), idle_s=1.0)
            wait_until(lambda: not proxy.armed, deadline_s=30, what=f"the {kind} drop")
        body = wait_turn(server, session_id, turn.response_id, deadline_s=TURN_DEADLINE_S)
        if body.get("status") != "completed":
            report.problems.append(f"turn {index} ended {body.get('status')}: {body}")
        if log is not None:
            log(f"turn {index}: {len(proxy.drops)} drops so far {proxy.drops_by_kind()}")
        index += 1
    _settle(server, proxy, runner_id)
    report.seconds = time.monotonic() - started
    report.turns = len(turns)
    report.drops = len(proxy.drops)
    report.drops_by_kind = proxy.drops_by_kind()
    report.unnoticed_black_holes = len(proxy.unnoticed)
    report.reconnects = proxy.connections
    return turns, report


def _settle(server: Server, proxy: ChaosProxy, runner_id: str) -> None:
    """Wait until no drop is pending, no black hole is open and the runner is online."""
    wait_until(
        lambda: not proxy.armed and not proxy.black_hole_open,
        deadline_s=30,
        what="the pending drop to end",
    )
    wait_runner_online(server, runner_id, user="alice@example.com", deadline_s=30)


def resends(runner_log: str) -> list[int]:
    """How many events the runner resent on each reconnect (from its log lines)."""
    return [int(n) for n in re.findall(r"resending (\d+) events", runner_log)]


def _message_text(item: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for part in item.get("content") or [])


def stored_items(server: Server, session_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after: str | None = None
    with server.client() as client:
        while True:
            params: dict[str, Any] = {"limit": 100, "order": "asc"}
            if after:
                params["after"] = after
            page = client.get(f"/v1/sessions/{session_id}/items", params=params).json()
            items.extend(page["data"])
            if not page["has_more"]:
                return items
            after = page["last_id"]


def expected_items(turns: list[ScriptedTurn]) -> list[tuple[str, str, str]]:
    """(type, role or call id, text) of every item the turns must leave, in order."""
    expected: list[tuple[str, str, str]] = []
    for turn in turns:
        expected.append(("message", "user", turn.prompt))
        if turn.call_id is not None:
            expected.append(("function_call", turn.call_id, "sys_os_write"))
            expected.append(("function_call_output", turn.call_id, ""))
        expected.append(("message", "assistant", turn.text))
    return expected


def item_key(item: dict[str, Any]) -> tuple[str, str, str]:
    kind = str(item["type"])
    if kind == "message":
        return kind, str(item.get("role")), _message_text(item)
    if kind == "function_call":
        return kind, str(item.get("call_id")), str(item.get("name"))
    if kind == "function_call_output":
        return kind, str(item.get("call_id")), ""
    return kind, str(item.get("id")), ""


def verify(
    server: Server, session_id: str, turns: list[ScriptedTurn], report: DropReport
) -> DropReport:
    """Compare the stored items and the replayed stream with what the mock scripted."""
    with server.client() as client:
        for turn in turns:
            body = client.get(f"/v1/sessions/{session_id}/responses/{turn.response_id}").json()
            if body.get("status") == "completed":
                report.completed += 1
    expected = expected_items(turns)
    items = stored_items(server, session_id)
    actual = [item_key(item) for item in items]
    count_differences("item", expected, actual, report)
    ids = [str(item["id"]) for item in items]
    report.duplicated += [f"item id {i} stored twice" for i, n in Counter(ids).items() if n > 1]

    # The stream from the start: every event once, gap-free, and per turn the deltas
    # add up to the scripted text and one ``response.completed``.
    last = turns[-1].response_id
    replay = StreamReader(
        server,
        session_id,
        last_event_id=0,
        until=lambda event: (
            event.type == "response.completed" and event.data["response"]["id"] == last
        ),
    )
    events = replay.wait(deadline_s=60)
    numbered = [event for event in events if event.id is not None]
    seqs = [event.id for event in numbered]
    if seqs != list(range(1, len(seqs) + 1)):
        report.problems.append(f"the replay is not gap-free from 1: {seqs[:5]}...{seqs[-5:]}")
    deltas: dict[str, str] = {}
    completed: Counter[str] = Counter()
    done_items: list[tuple[str, str, str]] = []
    done_ids: Counter[str] = Counter()
    for event in numbered:
        data = event.data
        if event.type == "response.output_text.delta":
            key = str(data.get("response_id"))
            deltas[key] = deltas.get(key, "") + str(data["delta"])
        elif event.type == "response.completed":
            completed[str(data["response"]["id"])] += 1
        elif event.type == "response.output_item.done":
            item = data["item"]
            done_ids[str(item["id"])] += 1
            done_items.append(item_key(item))
    for turn in turns:
        count = completed[turn.response_id]
        if count != 1:
            (report.lost if count == 0 else report.duplicated).append(
                f"response.completed x{count} for {turn.response_id}"
            )
        streamed = deltas.get(turn.response_id)
        if streamed is not None and streamed != turn.text:
            report.problems.append(f"deltas of {turn.response_id}: {streamed!r} != {turn.text!r}")
    report.duplicated += [f"output_item.done {i} x{n}" for i, n in done_ids.items() if n > 1]
    # Every stored item but the user's messages is announced once on the stream.
    produced = [key for key in expected if key[:2] != ("message", "user")]
    count_differences("streamed item", produced, done_items, report)
    return report


def count_differences(
    what: str,
    expected: list[tuple[str, str, str]],
    actual: list[tuple[str, str, str]],
    report: DropReport,
) -> None:
    want, got = Counter(expected), Counter(actual)
    for key, n in want.items():
        if got[key] < n:
            report.lost.append(f"{what} {key} x{n - got[key]}")
    for key, n in got.items():
        if n > want[key]:
            report.duplicated.append(f"{what} {key} x{n - want[key]}")
    if not report.lost and not report.duplicated and expected != actual:
        report.problems.append(f"{what}s out of order")
