"""``make demo`` (``scripts/demo.py``) runs offline and what it prints last is true: the
temporary folder is gone, or, with ``--keep``, still there with what it names."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testing.processes import REPO, base_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def run_demo(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "scripts.demo", *args],
        cwd=REPO,
        env=base_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "workspace/notes/hello.txt: 'Hello from the demo agent!\\n'" in result.stdout
    return result.stdout


def demo_folder(output: str) -> Path:
    match = re.search(r"workspace (/\S*omnigent-demo-[^/\s]+)/workspace/", output)
    assert match, output
    return Path(match.group(1))


def test_the_demo_removes_its_folder_and_says_so() -> None:
    output = run_demo()
    assert not demo_folder(output).exists()
    assert output.rstrip().splitlines()[-1] == (
        "The temporary folder is removed; `make demo KEEP=1` keeps it."
    )


def test_the_demo_keeps_its_folder_when_asked() -> None:
    output = run_demo("--keep")
    folder = demo_folder(output)
    try:
        assert output.rstrip().splitlines()[-1] == (
            f"kept {folder}: workspace/, demo.sqlite3, daphne.log, runner.log"
        )
        for name in ("workspace/notes/hello.txt", "demo.sqlite3", "daphne.log", "runner.log"):
            assert (folder / name).exists(), name
    finally:
        shutil.rmtree(folder, ignore_errors=True)
