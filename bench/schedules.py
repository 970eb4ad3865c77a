"""Benchmark: scheduled tasks fire each occurrence once on two server processes.

Two daphne processes on one PostgreSQL database and one Redis (a fresh database and key
prefix), a runner program (its LLM the mock) connected to the first. N tasks (default
100) are created through both processes, alternately, with a rule whose first
occurrence is the same second a little ahead (``DTSTART``, so nothing is faked). Both
processes' firing loops race for them. Then, per task: how many runs it got (must be
1), how many sessions it started (1), which process claimed it, how late each fire
started after its time, and whether the model's answer arrived (every turn completed).

Run: ``.venv/bin/python -m bench.schedules [--tasks 100] [--no-runner]``. The last line
printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg

from bench._common import (
    USER,
    agent_bundle,
    bench_runner_env,
    env_summary,
    final_json,
    fmt,
    log_dir,
    run_main,
    scale_out_env,
    sigterm_as_interrupt,
    start_daphne,
    summary_ms,
    wait_runner_online,
)
from testing.mockllm import MockLLMServer
from testing.processes import register_runner, spawn, wait_until

TASKS = "/v1/scheduled-tasks"


def upload_agent(client: httpx.Client) -> str:
    response = client.post(
        "/v1/agents",
        files={"bundle": ("agent.tar.gz", agent_bundle(os_env=False), "application/gzip")},
    )
    response.raise_for_status()
    return str(response.json()["id"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100, help="tasks due at the same second")
    parser.add_argument("--no-runner", action="store_true", help="no runner: runs are skipped")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds to wait for runs")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp folder")
    args = parser.parse_args()
    sigterm_as_interrupt()
    result: dict[str, Any] = {"bench": "schedules", **env_summary(), "tasks": args.tasks}
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        mock = MockLLMServer()
        mock.start()
        stack.callback(mock.stop)
        mock.configure([{"text": "Scheduled answer."}] * args.tasks)
        env = scale_out_env(stack, tmp, debug=False)
        servers = (
            start_daphne(stack, env=env, tmp=tmp, name="daphne-a"),
            start_daphne(stack, env=env, tmp=tmp, name="daphne-b"),
        )
        if not args.no_runner:
            runner_id, token = register_runner(servers[0], user=USER, name="bench-runner")
            workspace = tmp / "workspace"
            workspace.mkdir()
            runner_env = bench_runner_env(
                server_url=servers[0].url, token=token, workspace=workspace, llm_url=mock.base_url
            )
            runner = spawn(
                "runner", [sys.executable, "-m", "omnigent_runner"], env=runner_env, log_dir=tmp
            )
            stack.callback(runner.stop)
            wait_runner_online(servers[0], runner_id, process=runner)
        clients = [stack.enter_context(server.client(USER)) for server in servers]
        agent_id = upload_agent(clients[0])

        # Create disabled first (creating takes a while on a loaded machine), then enable
        # all of them with the same DTSTART a moment ahead.
        ids = []
        for index in range(args.tasks):
            response = clients[index % 2].post(
                TASKS,
                json={
                    "name": f"bench-{index}",
                    "agent_id": agent_id,
                    "prompt": "Say something scheduled",
                    "rrule": "FREQ=DAILY",
                    "timezone": "UTC",
                    "enabled": False,
                },
            )
            response.raise_for_status()
            ids.append(response.json()["id"])
        started = time.monotonic()
        lead = max(15.0, 0.4 * args.tasks)  # enabling them all takes a while on a busy machine
        due = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
        rule = f"DTSTART:{due:%Y%m%dT%H%M%SZ}\nRRULE:FREQ=MINUTELY;INTERVAL=30"
        for index, task_id in enumerate(ids):
            response = clients[index % 2].patch(
                f"{TASKS}/{task_id}", json={"rrule": rule, "enabled": True}
            )
            response.raise_for_status()
            assert datetime.fromisoformat(response.json()["next_run_at"]) == due, response.text
        result["enable_all_s"] = round(time.monotonic() - started, 2)
        print(f"== {args.tasks} tasks due at {due.isoformat()}, two processes", flush=True)

        def runs_of(task_id: str) -> list[dict[str, Any]]:
            return list(clients[1].get(f"{TASKS}/{task_id}/runs").json()["runs"])

        def all_settled() -> bool:
            return all(
                (found := runs_of(task_id)) and found[0]["status"] != "running" for task_id in ids
            )

        wait_until(all_settled, deadline_s=args.deadline, what="every task's run to finish")
        time.sleep(2)  # a late duplicate, if there were one, would show now
        runs = {task_id: runs_of(task_id) for task_id in ids}
        counts = Counter(len(found) for found in runs.values())
        statuses = Counter(found[0]["status"] for found in runs.values() if found)
        # From the occurrence to the fire's start (its message stored), or, for a skipped
        # run (``--no-runner``), to the moment its skip was recorded.
        lateness = [
            (
                datetime.fromisoformat(found[0]["started_at"] or found[0]["finished_at"])
                - datetime.fromisoformat(found[0]["scheduled_for"])
            ).total_seconds()
            for found in runs.values()
            if found and (found[0]["started_at"] or found[0]["finished_at"])
        ]
        with psycopg.connect(env["DATABASE_URL"]) as conn:
            claimed = Counter(
                row[0]
                for row in conn.execute("SELECT claimed_by FROM schedules_scheduledrun").fetchall()
            )
            sessions = conn.execute(
                "SELECT count(*) FROM agent_sessions_session WHERE title LIKE 'bench-%%'"
            ).fetchone()
        result.update(
            {
                "runs_per_task": {str(k): v for k, v in sorted(counts.items())},
                "run_statuses": dict(statuses),
                "claims_per_process": sorted(claimed.values(), reverse=True),
                "sessions_started": sessions[0] if sessions else 0,
                "fire_lateness": summary_ms(lateness),
                "exactly_once": counts == Counter({1: args.tasks}),
            }
        )
        print(f"   runs per task: {result['runs_per_task']} (want {{'1': {args.tasks}}})")
        print(
            f"   statuses: {result['run_statuses']}; sessions started: {result['sessions_started']}"
        )
        print(f"   claims per process: {result['claims_per_process']}")
        print(f"   fire started after its time: {fmt(result['fire_lateness'])}", flush=True)
    final_json(result)
    return 0 if result["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
