"""``--help`` names the program as it was started: ``omnigent-runner`` (the wheel's
console script, ``pyproject.toml``) or ``python -m omnigent_runner``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omnigent_runner.__main__ import main

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv0", "usage"),
    [
        ("/srv/venv/bin/omnigent-runner", "usage: omnigent-runner "),
        ("C:\\venv\\Scripts\\omnigent-runner.exe", "usage: omnigent-runner "),
        (str(REPO / "omnigent_runner" / "__main__.py"), "usage: python -m omnigent_runner "),
    ],
)
def test_the_usage_line_names_how_the_runner_was_started(
    argv0: str, usage: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script is ``main`` itself, started with its own path as argv[0]."""
    monkeypatch.setattr(sys, "argv", [argv0, "--help"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(usage)


@pytest.mark.timeout(60)
def test_python_dash_m_prints_its_own_usage() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "omnigent_runner", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m omnigent_runner "), result.stdout[:200]
