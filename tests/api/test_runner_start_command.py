"""``POST /v1/runners`` tells the caller how to start the runner: the wheel's
``omnigent-runner`` with the server URL and the token in the environment, the
workspace folder that must exist, and the LLM variables to fill in."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from .conftest import ALICE

pytestmark = pytest.mark.django_db


def test_created_runner_comes_with_its_start_command(client_for) -> None:
    response = client_for(ALICE).post("/v1/runners", {"name": "build box"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    lines = body["start_command"].splitlines()
    assert lines == [
        "export RUNNER_SERVER_URL=http://testserver",
        f"export OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN={shlex.quote(body['binding_token'])}",
        "# The folder the agents work in: it must exist (the runner will not start otherwise).",
        "export OMNIGENT_RUNNER_WORKSPACE=/path/to/workspace",
        "# The LLM, unless every bundle has its own executor.auth: uncomment and fill in.",
        "# export OPENAI_API_KEY=sk-...",
        "# export OPENAI_BASE_URL=https://api.openai.com/v1  # the default; any OpenAI-compatible URL",
        "omnigent-runner",
    ]
    # The token is shown this once: the runner list and detail never carry it.
    listed = client_for(ALICE).get("/v1/runners").content.decode()
    assert body["binding_token"] not in listed


@pytest.mark.timeout(30)
def test_the_start_command_filled_in_sets_what_the_runner_reads(client_for, tmp_path: Path) -> None:
    """As a person follows it: the workspace path replaced, the LLM lines uncommented;
    the shell sees every variable (``env`` stands in for the runner)."""
    body = client_for(ALICE).post("/v1/runners", {}, format="json").json()
    workspace = tmp_path / "checkout"
    workspace.mkdir()
    script = (
        body["start_command"]
        .replace("/path/to/workspace", str(workspace))
        .replace("# export OPENAI", "export OPENAI")
        .replace("sk-...", "sk-test")
        .replace("\nomnigent-runner", "\nenv")
    )
    result = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=20, env={}
    )
    assert result.returncode == 0, result.stderr
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert seen["RUNNER_SERVER_URL"] == "http://testserver"
    assert seen["OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN"] == body["binding_token"]
    assert seen["OMNIGENT_RUNNER_WORKSPACE"] == str(workspace)
    assert seen["OPENAI_API_KEY"] == "sk-test"
    assert seen["OPENAI_BASE_URL"] == "https://api.openai.com/v1"
