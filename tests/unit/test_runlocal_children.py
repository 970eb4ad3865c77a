"""``runlocal``'s children: a child that exits on its own is an error, a stop is not,
and once a stop is asked for their output is not shown."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runners.management.commands.runlocal import Command, start_child

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
