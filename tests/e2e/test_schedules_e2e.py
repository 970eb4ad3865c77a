"""Scheduled tasks end to end (automation.md, Schedules): real daphne, the real runner
program, the mock LLM. A task due in a few seconds (its ``DTSTART``, so no clock is
faked and nothing waits for 02:00) fires into a new session whose message the model
answers, within 2 s of its time; ``run now`` does the same. With two server processes on
PostgreSQL and Redis, every occurrence due at the same second has exactly one run."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TASKS = "/v1/scheduled-tasks"


def upload_agent(server: Server, bundle: bytes) -> str:
    with server.client() as client:
        response = client.post(
            "/v1/agents", files={"bundle": ("agent.tar.gz", bundle, "application/gzip")}
        )
        response.raise_for_status()
        return str(response.json()["id"])


def due_in(seconds: float) -> tuple[str, datetime]:
    """A rule whose first occurrence is ``seconds`` from now (whole seconds, UTC)."""
    at = (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)
    return f"DTSTART:{at:%Y%m%dT%H%M%SZ}\nRRULE:FREQ=MINUTELY;INTERVAL=10", at


def create_task(server: Server, agent_id: str, rrule: str, **extra: Any) -> dict[str, Any]:
    fields = {
        "name": "e2e",
        "agent_id": agent_id,
        "prompt": "Write the nightly note",
        "rrule": rrule,
        "timezone": "UTC",
        **extra,
    }
    with server.client() as client:
        response = client.post(TASKS, json=fields)
        assert response.status_code == 201, response.text
        return dict(response.json())


def runs(server: Server, task_id: str) -> list[dict[str, Any]]:
    with server.client() as client:
        return list(client.get(f"{TASKS}/{task_id}/runs").json()["runs"])


def settled_run(server: Server, task_id: str, deadline_s: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        found = runs(server, task_id)
        return found[0] if found and found[0]["status"] != "running" else None

    return dict(wait_until(done, deadline_s=deadline_s, what=f"a finished run of {task_id}"))


def answer(server: Server, session_id: str) -> str:
    with server.client() as client:
        items = client.get(f"/v1/sessions/{session_id}/items").json()["data"]
    texts = [
        part.get("text")
        for item in items
        if item["type"] == "message" and item.get("role") == "assistant"
        for part in item.get("content", [])
    ]
    return " ".join(text for text in texts if text)


def test_a_due_task_and_run_now_start_sessions_the_model_answers(
    server: Server,
    runner: Runner,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
) -> None:
    mock_llm.configure([{"text": "Nightly note written."}, {"text": "Run now done."}])
    agent_id = upload_agent(server, make_bundle("nightly"))
    rule, at = due_in(4)
    task = create_task(server, agent_id, rule, max_cost_usd=0.25)
    assert datetime.fromisoformat(task["next_run_at"]) == at

    run = settled_run(server, task["id"])
    assert run["status"] == "completed", run
    assert run["budget_usd"] == 0.25 and run["trigger"] == "schedule"
    lateness = datetime.fromisoformat(run["started_at"]) - datetime.fromisoformat(
        run["scheduled_for"]
    )
    assert timedelta(0) <= lateness < timedelta(seconds=2), lateness
    assert answer(server, run["session_id"]) == "Nightly note written."
    with server.client() as client:
        session = client.get(f"/v1/sessions/{run['session_id']}").json()
    assert session["runner_id"] == runner.runner_id
    assert session["title"].startswith("e2e · ")

    with server.client() as client:
        started = client.post(f"{TASKS}/{task['id']}/run")
    assert started.status_code == 202, started.text
    assert started.json()["status"] == "running"
    manual = settled_run(server, task["id"])
    assert manual["id"] == started.json()["id"] and manual["status"] == "completed"
    assert answer(server, manual["session_id"]) == "Run now done."


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.timeout(240)
def test_two_processes_fire_each_occurrence_once(
    two_servers: tuple[Server, Server], make_bundle: Callable[..., bytes]
) -> None:
    """Twelve tasks due at the same second, two processes looking: one run each (no
    runner is online, so each run is skipped with that reason, after its claim)."""
    first, second = two_servers
    agent_id = upload_agent(first, make_bundle("twins"))
    rule, at = due_in(15)  # room to create them all first on a loaded machine
    tasks = [create_task((first, second)[i % 2], agent_id, rule) for i in range(12)]
    assert all(datetime.fromisoformat(task["next_run_at"]) == at for task in tasks)

    def all_ran() -> bool:
        return all(runs(first, task["id"]) for task in tasks)

    wait_until(all_ran, deadline_s=60, what="every task's run")
    for task in tasks:
        found = runs(second, task["id"])
        assert len(found) == 1, found
        assert found[0]["status"] == "skipped"
        assert found[0]["error"] == "no runner of the owner is online"
