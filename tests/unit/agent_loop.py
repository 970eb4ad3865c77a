"""The agent loop's test fixtures and builders, shared by the runner's unit tests.

Tests drive :class:`AgentExecutor` the way the tunnel does (open, policies, budgets,
turn, results, verdicts, interrupts) against the in-process mock LLM; what it reports
goes to a :class:`RecordingSink` a test awaits. A test module takes the fixtures by
name (``mock = agent_loop.mock``) so pytest finds them there.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from omnigent_runner import protocol
from omnigent_runner.agent import AgentExecutor
from omnigent_runner.bundles import build_bundle
from testing.mockllm import MockLLMServer

Event = dict[str, Any]
SID = "sess_1"


class RecordingSink:
    """Stores emitted events and lets a test await the one it expects."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Event]] = []
        self._changed = asyncio.Event()

    def emit(self, session_id: str, event: protocol.AnyEvent) -> None:
        # The tunnel sends events as protocol frames: each must be one and encode.
        # Tests read the event's wire form, which is what the server receives.
        assert protocol.frame_type(event) in protocol.EVENT_TYPES, event
        self.events.append((session_id, json.loads(protocol.encode_bytes(event))))
        self._changed.set()

    def of(self, type_: str, response_id: str | None = None) -> list[Event]:
        return [
            e
            for _, e in self.events
            if e["type"] == type_ and (response_id is None or e.get("response_id") == response_id)
        ]

    def types(self, response_id: str) -> list[str]:
        return [e["type"] for _, e in self.events if e.get("response_id") == response_id]

    async def wait_for(self, predicate: Callable[[Event], bool], *, timeout: float = 20.0) -> Event:
        async def scan() -> Event:
            while True:
                for _, event in self.events:
                    if predicate(event):
                        return event
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(scan(), timeout)

    async def wait_status(self, response_id: str, *statuses: str) -> Event:
        return await self.wait_for(
            lambda e: (
                e["type"] == "session.status"
                and e["response_id"] == response_id
                and e["status"] in statuses
            )
        )

    async def wait_end(self, response_id: str) -> Event:
        """The final session.status of a turn (idle or failed)."""
        return await self.wait_status(response_id, "idle", "failed")


Executor = tuple[AgentExecutor, RecordingSink]


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def mock() -> Iterator[MockLLMServer]:
    server = MockLLMServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
async def make_executor(
    workspace: Path,
) -> AsyncIterator[Callable[..., Executor]]:
    created: list[AgentExecutor] = []

    def factory(**kwargs: Any) -> Executor:
        kwargs.setdefault("workspace", workspace)
        kwargs.setdefault("env", {})
        kwargs.setdefault("llm_max_retries", 0)
        executor = AgentExecutor(**kwargs)
        sink = RecordingSink()
        executor.bind(sink)
        created.append(executor)
        return executor, sink

    yield factory
    for executor in created:
        await executor.shutdown()


# --- builders ---------------------------------------------------------------------------


def agent_yaml(
    base_url: str | None,
    *,
    api: str = "responses",
    os_env: str | None = None,
    max_iterations: int = 10,
    timeout: float = 30,
    model: str | None = "mock-model",
) -> str:
    lines = ["name: tester", "prompt: You are a test agent.", "executor:"]
    if model:
        lines.append(f"  model: {model}")
    lines += [f"  api: {api}", f"  max_iterations: {max_iterations}", f"  timeout: {timeout}"]
    if base_url is not None:
        lines += [
            "  auth:",
            "    type: api_key",
            "    api_key: sk-test",
            f"    base_url: {base_url}",
        ]
    if os_env is not None:
        lines += ["os_env:", "  type: caller_process", f"  cwd: {os_env}"]
    return "\n".join(lines) + "\n"


def agent(yaml_text: str, *, agent_id: str = "agent_1", version: int = 1) -> protocol.AgentRef:
    bundle = build_bundle({"agent.yaml": yaml_text})
    return protocol.AgentRef(
        id=agent_id, version=version, bundle_b64=base64.b64encode(bundle).decode()
    )


def user(text: str, item_id: str | None = None) -> Event:
    return {
        "id": item_id or "item_" + uuid.uuid4().hex,
        "type": "message",
        "status": "completed",
        "response_id": "resp_x",
        "created_at": 0,
        "created_by": "user",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }


def call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> Event:
    return {"call_id": call_id, "name": name, "arguments": json.dumps(arguments)}


def done_items(sink: RecordingSink, response_id: str) -> list[Event]:
    return [e["item"] for e in sink.of("response.output_item.done", response_id)]


async def start(
    executor: AgentExecutor,
    yaml_text: str,
    policies: list[protocol.PolicyRule] | None = None,
    *,
    budgets: protocol.Budgets | None = None,
    session_id: str = SID,
    response_id: str = "resp_1",
    tools: list[dict[str, Any]] | None = None,
) -> None:
    """Open the session, hand it ``policies`` and ``budgets`` when given, start a turn."""
    await executor.open_session(session_id=session_id, agent=agent(yaml_text), history=[])
    if policies is not None:
        await executor.update_policies(session_id=session_id, rules=policies)
    if budgets is not None:
        await executor.update_budgets(session_id=session_id, budgets=budgets)
    await executor.start_turn(
        session_id=session_id, response_id=response_id, input=[user("go")], tools=tools or []
    )


def verdict(
    action: Literal["accept", "decline", "cancel"],
    call_id: str = "call_echo",
    *,
    elicitation_id: str = "elicit_1",
    **extra: Any,
) -> protocol.Verdict:
    return protocol.Verdict(
        elicitation_id=elicitation_id,
        response_id="resp_1",
        call_id=call_id,
        action=action,
        **extra,
    )


async def asked(sink: RecordingSink, call_id: str = "call_echo") -> Event:
    """The ``approval.requested`` of ``call_id``, once the runner asks."""
    return await sink.wait_for(
        lambda e: e["type"] == "approval.requested" and e["call_id"] == call_id
    )
