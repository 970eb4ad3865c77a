"""Logs of a whole run (operations.md, "Metrics and logs"): the server and the runner
write one JSON object per line with ``OMNIGENT_LOG_FORMAT=json``; a request id sent
with a message comes back in the response and appears on the runner's lines for that
turn; and no secret the run used (the runner's binding token, API keys from the
runner's environment and from a bundle, a user's API token, the metrics token, the
secret key) appears in any log line, at DEBUG.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    REPO,
    Runner,
    Server,
    bind,
    create_session,
    register_runner,
    start_runner,
    wait_turn,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

KEYS = {"timestamp", "level", "logger", "message"}


def json_lines(text: str, where: str) -> list[dict[str, Any]]:
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            pytest.fail(f"{where} line {number} is not JSON: {line[:300]}")
        assert isinstance(entry, dict) and KEYS <= set(entry), (where, line[:300])
        entries.append(entry)
    return entries


def message(server: Server, session_id: str, text: str, **headers: str) -> httpx.Response:
    with server.client() as client:
        return client.post(
            f"/v1/sessions/{session_id}/events",
            json={"type": "message", "data": {"role": "user", "content": text}},
            headers=headers,
        )


def test_json_logs_carry_the_request_id_and_no_secret(
    launch_server: Callable[..., Server],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    secret_key = "django-" + secrets.token_hex(24)
    metrics_token = "metrics-" + secrets.token_hex(16)
    env_api_key = "sk-env-" + secrets.token_hex(16)
    bundle_api_key = "sk-bundle-" + secrets.token_hex(16)
    server = launch_server(
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secret_key,
        OMNIGENT_LOG_FORMAT="json",
        OMNIGENT_LOG_LEVEL="DEBUG",
        OMNIGENT_METRICS="1",
        OMNIGENT_METRICS_TOKEN=metrics_token,
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
    )
    runner_id, binding_token = register_runner(server)
    runner: Runner = start_runner(
        server=server,
        token=binding_token,
        runner_id=runner_id,
        workspace=tmp_path,
        log_dir=tmp_path,
        extra_env={
            "OPENAI_BASE_URL": mock_llm.base_url,
            "OPENAI_API_KEY": env_api_key,
            "OMNIGENT_LOG_FORMAT": "json",
            "OMNIGENT_RUNNER_LOG_LEVEL": "DEBUG",
        },
    )
    assert runner.process is not None

    # A user API token (DRF), made the way an operator makes one.
    made = subprocess.run(
        [sys.executable, "manage.py", "drf_create_token", "alice@example.com"],
        cwd=REPO,
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    user_token = made.stdout.split()[2]
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        me = anonymous.get("/v1/me", headers={"Authorization": f"Token {user_token}"})
        assert me.status_code == 200, me.text
        refused = anonymous.get("/v1/me", headers={"Authorization": f"Token {user_token}x"})
        assert refused.status_code == 401
        assert anonymous.get("/metrics").status_code == 401
        scrape = anonymous.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert scrape.status_code == 200
        assert "omnigent_connected_runners 1.0" in scrape.text

    keyed_bundle = make_bundle(
        extra=(
            f"  auth: {{type: api_key, api_key: {bundle_api_key}, "
            f"base_url: '{mock_llm.base_url}'}}\n"
        )
    )
    turns: dict[str, tuple[str, str]] = {}
    for label, bundle in (("keyed", keyed_bundle), ("plain", make_bundle())):
        session_id = create_session(server, bundle)
        bind(server, session_id, runner_id)
        request_id = f"req-{label}-{secrets.token_hex(4)}"
        response = message(server, session_id, f"hello {label}", **{"X-Request-ID": request_id})
        assert response.status_code == 202, response.text
        assert response.headers["X-Request-ID"] == request_id
        turn = wait_turn(server, session_id, response.json()["response_id"], deadline_s=60)
        assert turn["status"] == "completed", turn
        turns[label] = (session_id, request_id)
    # Both turns called the model (the mock keeps no Authorization header: each call
    # sent one of the two keys, the bundle's for the keyed session).
    assert len(mock_llm.requests) >= 2

    runner.process.stop()
    server.process.stop()
    runner_log = json_lines(runner.process.log(), "runner")
    server_log = json_lines(server.process.log(), "server")

    for session_id, request_id in turns.values():
        tagged = [entry for entry in runner_log if entry.get("request_id") == request_id]
        assert tagged, f"no runner line carries {request_id}"
        assert {entry.get("session_id") for entry in tagged} == {session_id}
        assert {entry.get("runner_id") for entry in tagged} == {runner_id}
    assert any(entry["logger"] == "daphne.access" for entry in server_log)

    used = {
        "binding token": binding_token,
        "runner API key": env_api_key,
        "bundle API key": bundle_api_key,
        "user token": user_token,
        "metrics token": metrics_token,
        "secret key": secret_key,
    }
    for path in sorted(tmp_path.glob("*.log")):
        text = path.read_text(errors="replace")
        for what, value in used.items():
            assert value not in text, f"the {what} appears in {path.name}"
