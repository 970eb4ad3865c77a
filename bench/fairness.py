"""Benchmark: fair share of a runner (usage.md, Measured).

One daphne process (SQLite), the real runner program with ``OMNIGENT_RUNNER_MAX_TURNS=4``
and the mock LLM answering each turn after ``--turn-s`` seconds. Alice sends one message
to each of 50 sessions: 4 start, 46 wait. Then Bob sends one (to a session Alice shares
with him). Measured: Bob's place as his snapshot shows it, how many of Alice's turns the
runner started between Bob's message and his turn (the target is 0: his turn takes the
next freed slot), and how long Bob waited for his turn to reach the model, against the
turn length. Alice's 50 all finish afterwards (none is lost).

Run: ``.venv/bin/python -m bench.fairness [--alice 50] [--slots 4] [--turn-s 1.0]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from typing import Any

import httpx

from bench._common import (
    USER,
    agent_bundle,
    bench_runner_env,
    env_summary,
    final_json,
    log_dir,
    run_main,
    sigterm_as_interrupt,
    single_server,
    wait_runner_online,
)
from testing.mockllm import MockLLMServer, user_text_for
from testing.processes import register_runner, spawn, wait_until

BOB = "bob@example.com"


def new_session(client: httpx.Client, runner_id: str) -> str:
    response = client.post(
        "/v1/sessions",
        files={"bundle": ("agent.tar.gz", agent_bundle(os_env=False), "application/gzip")},
    )
    response.raise_for_status()
    session_id = str(response.json()["session_id"])
    client.patch(f"/v1/sessions/{session_id}", json={"runner_id": runner_id}).raise_for_status()
    return session_id


def send(client: httpx.Client, session_id: str, text: str) -> str:
    response = client.post(
        f"/v1/sessions/{session_id}/events",
        json={"type": "message", "data": {"role": "user", "content": text}},
    )
    response.raise_for_status()
    return str(response.json()["response_id"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alice", type=int, default=50, help="Alice's turns, one per session")
    parser.add_argument(
        "--slots", type=int, default=4, help="the runner's OMNIGENT_RUNNER_MAX_TURNS"
    )
    parser.add_argument("--turn-s", type=float, default=1.0, help="the model's time per turn")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp folder")
    args = parser.parse_args()
    sigterm_as_interrupt()
    result: dict[str, Any] = {
        "bench": "fairness",
        **env_summary(),
        "alice_turns": args.alice,
        "slots": args.slots,
        "turn_s": args.turn_s,
    }
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        mock = MockLLMServer()
        mock.start()
        stack.callback(mock.stop)
        mock.configure([{"text": "Done.", "delay_s": args.turn_s}] * (args.alice + 1))
        server = single_server(stack, tmp, debug=False, name="daphne")
        runner_id, token = register_runner(server, user=USER, name="bench-runner")
        workspace = tmp / "workspace"
        workspace.mkdir()
        runner = spawn(
            "runner",
            [sys.executable, "-m", "omnigent_runner"],
            env=bench_runner_env(
                server_url=server.url,
                token=token,
                workspace=workspace,
                llm_url=mock.base_url,
                max_turns=args.slots,
            ),
            log_dir=tmp,
        )
        stack.callback(runner.stop)
        wait_runner_online(server, runner_id, process=runner)
        alice = stack.enter_context(server.client(USER))
        bob = stack.enter_context(server.client(BOB))
        sessions = [new_session(alice, runner_id) for _ in range(args.alice)]
        shared = new_session(alice, runner_id)
        alice.put(
            f"/v1/sessions/{shared}/permissions", json={"user_id": BOB, "level": 2}
        ).raise_for_status()

        alice_turns = {
            send(alice, session_id, f"alice {n}"): session_id
            for n, session_id in enumerate(sessions)
        }
        wait_until(
            lambda: len(mock.requests) >= args.slots,
            deadline_s=60,
            what="the runner's slots to fill",
        )
        asked = [user_text_for(r["path"], r["body"]) for r in mock.requests]
        posted = time.monotonic()
        bob_turn = send(bob, shared, "bob 0")
        posted_index = len(asked)
        place = bob.get(f"/v1/sessions/{shared}").json()["queued_turns"]

        reached: dict[str, float] = {}
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                texts = [user_text_for(r["path"], r["body"]) for r in mock.requests]
                if "bob 0" in texts:
                    reached["bob"] = time.monotonic()
                    reached["index"] = texts.index("bob 0")
                    return
                time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        watcher.join(timeout=60 + 2 * args.turn_s)
        done.set()
        if "bob" not in reached:
            raise TimeoutError("Bob's turn never reached the model")
        texts = [user_text_for(r["path"], r["body"]) for r in mock.requests]
        ahead = [t for t in texts[posted_index : int(reached["index"])] if t.startswith("alice")]

        def all_done() -> bool:
            statuses = [
                alice.get(f"/v1/sessions/{session_id}/responses/{rid}").json()["status"]
                for rid, session_id in alice_turns.items()
            ]
            return all(status == "completed" for status in statuses)

        wait_until(all_done, deadline_s=60 + args.alice * args.turn_s, what="Alice's turns")
        status = bob.get(f"/v1/sessions/{shared}/responses/{bob_turn}").json()["status"]
        result.update(
            {
                "bob_place_shown": place,
                "alice_turns_started_ahead_of_bob": len(ahead),
                "bob_wait_to_model_s": round(reached["bob"] - posted, 3),
                "bob_turn_status": status,
                "alice_completed": args.alice,
                "model_requests": len(mock.requests),
            }
        )
        print(
            f"Bob's place shown: {place[0]['position'] if place else '-'}; Alice's turns "
            f"started between his message and his turn: {len(ahead)}; he waited "
            f"{result['bob_wait_to_model_s']} s for a turn of {args.turn_s} s",
            flush=True,
        )
    final_json(result)
    return 0 if not ahead else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
