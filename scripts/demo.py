"""``make demo``: the whole system offline, in one command.

Starts the mock LLM, a server (daphne, a throw-away SQLite database, local
single-user mode) and a runner on a fresh workspace; uploads a small bundle;
sends a message that makes the agent write a file; follows the session stream
until the turn ends; prints the transcript and the changes listing; stops
everything. Nothing needs a network or an API key.

Everything lives in a temporary folder (the workspace, the database, the logs), removed
at the end; ``--keep`` (``make demo KEEP=1``) keeps it and says where it is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omnigent_runner.bundles import build_bundle  # noqa: E402
from omnigent_runner.identity import derive_runner_id, new_binding_token  # noqa: E402
from testing.mockllm import MockLLMServer  # noqa: E402
from testing.processes import migrate, spawn, start_server, wait_runner_online  # noqa: E402

DEADLINE_S = 60.0

AGENT_YAML = """\
name: demo-writer
description: Writes files in its workspace.
prompt: You write files with the sys_os_* tools.
executor:
  model: mock-model
os_env:
  type: caller_process
  cwd: .
"""

SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {
                "call_id": "call_demo_1",
                "name": "sys_os_write",
                "arguments": json.dumps(
                    {"path": "notes/hello.txt", "content": "Hello from the demo agent!\n"}
                ),
            }
        ]
    },
    {"text": "I wrote notes/hello.txt for you.", "stream": True},
]


def follow_turn(client: httpx.Client, session_id: str) -> None:
    """Print the stream until the session is idle (or failed) again."""
    # after=0 replays the session's log from its first event, then follows it live.
    with client.stream(
        "GET", f"/v1/sessions/{session_id}/stream", params={"after": 0}, timeout=DEADLINE_S
    ) as stream:
        event_type = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event_type = line.removeprefix("event: ")
            elif line.startswith("data: ") and event_type != "session.heartbeat":
                data = json.loads(line.removeprefix("data: "))
                if event_type == "response.output_text.delta":
                    print(f"  {event_type}: {data['delta']!r}")
                else:
                    print(f"  {event_type}")
                if event_type == "session.status" and data["status"] in ("idle", "failed"):
                    return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary folder (workspace, database, logs) and print where it is",
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.keep:
            tmp_path = Path(tempfile.mkdtemp(prefix="omnigent-demo-"))
        else:
            tmp_path = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="omnigent-demo-"))
            )
        code = run(stack, tmp_path)
    # Said once everything has stopped (and, without --keep, the folder is gone).
    if args.keep:
        print(f"\nkept {tmp_path}: workspace/, demo.sqlite3, daphne.log, runner.log")
    else:
        print("\nThe temporary folder is removed; `make demo KEEP=1` keeps it.")
    return code


def run(stack: contextlib.ExitStack, tmp_path: Path) -> int:
    """Everything the demo starts is registered on ``stack``, stopped in reverse order."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    mock = MockLLMServer()
    mock.start()
    stack.callback(mock.stop)
    mock.configure(SCRIPT)
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "OMNIGENT_DATA_DIR": str(tmp_path / "data"),
        "OMNIGENT_LOCAL_SINGLE_USER": "1",
        "OMNIGENT_LOG_LEVEL": "WARNING",
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or new_binding_token(),
        "PYTHONPATH": str(REPO),
    }
    env.pop("REDIS_URL", None)
    token = new_binding_token()
    runner_id = derive_runner_id(token)
    try:
        migrate(env, tmp_path)
        server = start_server(env=env, log_dir=tmp_path, stack=stack)
        runner = spawn(
            "runner",
            [sys.executable, "-m", "omnigent_runner"],
            env={
                **env,
                "RUNNER_SERVER_URL": server.url,
                "OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN": token,
                "OMNIGENT_RUNNER_WORKSPACE": str(workspace),
                "OMNIGENT_RUNNER_PARENT_PID": str(os.getpid()),
                "OPENAI_BASE_URL": mock.base_url,
                "OPENAI_API_KEY": "demo",
            },
            log_dir=tmp_path,
        )
        stack.callback(runner.stop)
        # Local single-user mode: a request without an identity header acts as the local user.
        wait_runner_online(server, runner_id, process=runner, user=None)
    except (RuntimeError, TimeoutError) as exc:
        raise SystemExit(f"demo: {exc}") from None
    base_url = server.url
    client = stack.enter_context(server.client(None))
    print(f"server {base_url}, runner {runner_id}, workspace {workspace}/")

    created = client.post(
        "/v1/sessions",
        files={"bundle": ("agent.tar.gz", build_bundle({"agent.yaml": AGENT_YAML}))},
        data={"metadata": json.dumps({"title": "offline demo"})},
    ).json()
    session_id = created["session_id"]
    client.patch(f"/v1/sessions/{session_id}", json={"runner_id": runner_id}).raise_for_status()
    print(f"session {session_id} (agent {created['agent_name']}) bound to the runner")

    accepted = client.post(
        f"/v1/sessions/{session_id}/events",
        json={
            "type": "message",
            "data": {"role": "user", "content": "Write notes/hello.txt"},
        },
    )
    accepted.raise_for_status()
    print("stream:")
    follow_turn(client, session_id)

    print("\ntranscript:")
    for item in client.get(f"/v1/sessions/{session_id}/items").json()["data"]:
        if item["type"] == "message":
            text = " ".join(part.get("text", "") for part in item["content"])
            print(f"  {item['role']}: {text}")
        elif item["type"] == "function_call":
            print(f"  call {item['name']}({item['arguments']})")
        elif item["type"] == "function_call_output":
            print(f"  -> {item['output']}")
    print("\nchanges:")
    changes = client.get(f"/v1/sessions/{session_id}/resources/environments/default/changes")
    for entry in changes.json()["data"]:
        print(
            f"  {entry['status']:8} {entry['path']} ({entry['bytes']} bytes, +{entry['lines_added']})"
        )
    written = workspace / "notes" / "hello.txt"
    print(f"\nworkspace/notes/hello.txt: {written.read_text()!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
