"""``runlocal``'s children: a child that exits on its own is an error, a stop is not,
and once a stop is asked for their output is not shown."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runners.management.commands.runlocal import DEFAULT_MOCK_PORT, Command, start_child

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


def test_a_child_that_exits_on_its_own_is_reported_with_its_code() -> None:
    stop = threading.Event()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    child.wait(timeout=30)
    assert Command._wait_for_exit([("server", child)], stop) == ("server", 3)


def test_a_stop_request_is_not_an_error() -> None:
    stop = threading.Event()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stop.set()
        assert Command._wait_for_exit([("runner", child)], stop) is None
    finally:
        child.kill()
        child.wait()


def test_output_is_relayed_until_the_stop(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script = (
        "import os, time\n"
        "print('before', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.01)\n"
        "print('after', flush=True)\n"
    )
    quiet = threading.Event()
    child = start_child([sys.executable, "-c", script], env={}, quiet=quiet)
    seen = ""
    deadline = time.monotonic() + 30
    while "before" not in seen and time.monotonic() < deadline:
        seen += capfd.readouterr().out
        time.sleep(0.05)
    assert "before" in seen, "the child's line before the stop was not relayed"
    quiet.set()
    gate.write_text("")
    child.wait(timeout=30)
    # The relay reads the last line right after the exit; give it time to (not) show it.
    time.sleep(0.5)
    assert "after" not in capfd.readouterr().out


def test_the_mock_llm_port_is_fixed_unless_given() -> None:
    """A runner pointed at ``make run LLM=mock``'s mock keeps working after a restart."""
    parser = Command().create_parser("manage.py", "runlocal")
    assert parser.parse_args([]).mock_port == DEFAULT_MOCK_PORT == 8765
    assert parser.parse_args(["--mock-port", "0"]).mock_port == 0


def test_a_taken_mock_port_stops_runlocal_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "manage.py", "runlocal", "--port", "1", "--llm", "mock"]
            + ["--mock-port", str(port), "--workspace", str(tmp_path / "workspace")],
            cwd=REPO,
            env={**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"the mock LLM's port {port} on 127.0.0.1 is taken" in result.stderr
    assert "--mock-port" in result.stderr and "MOCK_PORT=" in result.stderr
    assert "server:" not in result.stdout  # nothing was started
    assert not (tmp_path / "workspace").exists()
