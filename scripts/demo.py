"""``make demo``: the whole system offline, in one command.

Starts the mock LLM, a server (daphne, a throw-away SQLite database, local
single-user mode) and a runner on a fresh workspace; uploads a small bundle;
sends a message that makes the agent write a file; follows the session stream
until the turn ends; prints the transcript and the changes listing; stops
everything. Nothing needs a network or an API key.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runners.identity import derive_runner_id, new_binding_token  # noqa: E402
from sessions.bundles import build_bundle  # noqa: E402
from testing.mockllm import MockLLMServer  # noqa: E402

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Any, what: str) -> Any:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        try:
            value = check()
            if value:
                return value
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"demo: timed out waiting for {what}")


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


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="omnigent-demo-") as tmp:
        tmp_path = Path(tmp)
        workspace = tmp_path / "workspace"
        workspace.mkdir()
        mock = MockLLMServer()
        mock.start()
        mock.configure(SCRIPT)
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
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
        log = open(tmp_path / "processes.log", "wb")  # noqa: SIM115 - closed below
        children: list[subprocess.Popen[bytes]] = []
        try:
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
                cwd=REPO,
                env=env,
                check=True,
                timeout=120,
            )
            children.append(
                subprocess.Popen(
                    [sys.executable, "-m", "omnigent_site.serve", "--port", str(port)],
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=log,
                )
            )
            client = httpx.Client(base_url=base_url, timeout=30.0)
            wait_for(lambda: client.get("/health").status_code == 200, "the server")
            token = new_binding_token()
            runner_id = derive_runner_id(token)
            children.append(
                subprocess.Popen(
                    [sys.executable, "-m", "runners.client"],
                    cwd=REPO,
                    env={
                        **env,
                        "RUNNER_SERVER_URL": base_url,
                        "OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN": token,
                        "OMNIGENT_RUNNER_WORKSPACE": str(workspace),
                        "OMNIGENT_RUNNER_PARENT_PID": str(os.getpid()),
                        "OPENAI_BASE_URL": mock.base_url,
                        "OPENAI_API_KEY": "demo",
                    },
                    stdout=log,
                    stderr=log,
                )
            )
            wait_for(
                lambda: client.get(f"/v1/runners/{runner_id}/status").json()["online"],
                "the runner to connect",
            )
            print(f"server {base_url}, runner {runner_id}, workspace {workspace}")

            created = client.post(
                "/v1/sessions",
                files={"bundle": ("agent.tar.gz", build_bundle({"agent.yaml": AGENT_YAML}))},
                data={"metadata": json.dumps({"title": "offline demo"})},
            ).json()
            session_id = created["session_id"]
            client.patch(
                f"/v1/sessions/{session_id}", json={"runner_id": runner_id}
            ).raise_for_status()
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
            changes = client.get(
                f"/v1/sessions/{session_id}/resources/environments/default/changes"
            )
            for entry in changes.json()["data"]:
                print(
                    f"  {entry['status']:8} {entry['path']} ({entry['bytes']} bytes, +{entry['lines_added']})"
                )
            written = workspace / "notes" / "hello.txt"
            print(f"\n{written}: {written.read_text()!r}")
            return 0
        finally:
            for child in reversed(children):
                child.terminate()
            for child in children:
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()
            log.close()
            mock.stop()


if __name__ == "__main__":
    sys.exit(main())
