"""The runner as a distribution: build the wheel, install it into an empty virtualenv
(no checkout, no Django), start its ``omnigent-runner`` script against a real server and
run a turn with a tool call in its workspace."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import (
    Server,
    bind,
    create_session,
    register_runner,
    send_message,
    start_runner,
    wait_turn,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
# What the wheel is built from (pyproject.toml): copied, so the build leaves no
# build/ or egg-info folders in the checkout.
SOURCES = ["pyproject.toml", "requirements-runner.txt", "docs/runner-package.md"]
INSTALL_TIMEOUT_S = 400


def build_wheel(into: Path) -> Path:
    source = into / "source"
    for name in SOURCES:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "omnigent_runner",
        source / "omnigent_runner",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(into), "."],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    [wheel] = into.glob("omnigent_runner-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed_runner(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``omnigent-runner`` script of a fresh virtualenv that has only the wheel."""
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root)
    name_version = "-".join(wheel.name.split("-")[:2])
    with zipfile.ZipFile(wheel) as archive:
        top_level = {path.split("/")[0] for path in archive.namelist()}
    assert top_level == {"omnigent_runner", f"{name_version}.dist-info"}, top_level
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    probe = subprocess.run([str(python), "-c", "import django"], capture_output=True, timeout=60)
    assert probe.returncode != 0, "the runner's virtualenv must not have Django"
    script = env_dir / "bin" / "omnigent-runner"
    assert script.exists()
    return script


def test_installed_runner_runs_a_turn(
    installed_runner: Path,
    server: Server,
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    help_text = subprocess.run(
        [str(installed_runner), "--help"], capture_output=True, text=True, timeout=60
    )
    assert help_text.returncode == 0 and "--server-url" in help_text.stdout
    assert help_text.stdout.startswith("usage: omnigent-runner "), help_text.stdout[:200]

    workspace = tmp_path / "wheel-workspace"
    workspace.mkdir()
    runner_id, token = register_runner(server)
    runner = start_runner(
        server=server,
        token=token,
        runner_id=runner_id,
        workspace=workspace,
        log_dir=tmp_path,
        extra_env={"OPENAI_BASE_URL": mock_llm.base_url, "OPENAI_API_KEY": "test-key"},
        name="wheel-runner",
        command=[str(installed_runner)],
    )
    try:
        arguments = json.dumps({"path": "hello.txt", "content": "hi\n"})
        mock_llm.configure(
            [
                {"tool_calls": [{"call_id": "c1", "name": "sys_os_write", "arguments": arguments}]},
                {"text": "Wrote hello.txt."},
            ]
        )
        session_id = create_session(
            server, make_bundle(extra="os_env:\n  type: caller_process\n  cwd: .\n")
        )
        bind(server, session_id, runner_id)
        response = send_message(server, session_id, "write hello.txt")
        assert response.status_code == 202, response.text
        turn = wait_turn(server, session_id, response.json()["response_id"])
        assert turn["status"] == "completed", turn
        assert (workspace / "hello.txt").read_text() == "hi\n"
    finally:
        assert runner.process is not None
        runner.process.stop()
