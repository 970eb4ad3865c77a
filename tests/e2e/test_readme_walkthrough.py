"""The README's first hour, run as written: ``make run LLM=mock`` in a terminal, the
"first session with curl" block in another, then Ctrl-C.

The only changes to the README's text: the ports (free ones instead of 8000 and the
mock's 8765), the folders (``/tmp/…`` becomes the test's own folder, and the workspace is ``workspace/``
of a scratch git checkout that ignores it, as ``./workspace`` is in a clone of this
project) and, between steps 5 and 6, a wait for the turn to finish (a person waits a
second; the README says so).
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testing.processes import free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
START_DEADLINE_S = 90.0
STOP_DEADLINE_S = 30.0


def readme_block(after_heading: str) -> str:
    """The first ``sh`` code block after a heading of the README."""
    section = README[README.index(after_heading) :]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, f"no sh block after {after_heading!r}"
    return match.group(1)


def sample_pattern(sample: str) -> re.Pattern[str]:
    """A README sample (``# {...}`` under a command) as a pattern for the whole output
    line: exact text, with ``…`` standing for any run of characters (ids, fields)."""
    return re.compile(".*?".join(re.escape(part) for part in sample.split("…")))


class Terminal:
    """A command in a pseudo-terminal: what a person sees, and Ctrl-C as they press it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: becomes the command
            os.chdir(REPO)
            os.execvpe(argv[0], argv, env)
        self.output = b""

    def read_until(self, text: str, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while text.encode() not in self.output:
            if time.monotonic() > end or not self._read(end - time.monotonic()):
                raise AssertionError(f"{text!r} not seen; output:\n{self.text[-4000:]}")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, min(timeout, 1.0)))
        if ready:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # the command exited and closed the terminal
                return False
            if not data:
                return False
            self.output += data
        return True

    def ctrl_c_and_wait(self, deadline_s: float) -> int:
        os.write(self.fd, b"\x03")
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.2):
                    pass
                return os.waitstatus_to_exitcode(status)
            self._read(0.2)
        raise AssertionError(f"no exit after Ctrl-C; output:\n{self.text[-4000:]}")

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        os.close(self.fd)

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", "replace")


@pytest.fixture
def make_run(tmp_path: Path) -> Iterator[tuple[Terminal, str, Path]]:
    port = free_port()
    # As in a clone of this project: ./workspace inside a git checkout that ignores it.
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    (checkout / ".gitignore").write_text("workspace/\n")
    workspace = checkout / "workspace"
    [command] = [
        line for line in readme_block("## Two commands").splitlines() if "make run" in line
    ]
    assert command.split("#")[0].strip() == "make run"
    # A person's shell: not the environment of the `make test` this may run under
    # (a nested make would print "make[1]: Entering/Leaving directory").
    outer_make = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")
    env = {
        **{key: value for key, value in os.environ.items() if key not in outer_make},
        # The test's own database and files, not the checkout's var/.
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "OMNIGENT_DATA_DIR": str(tmp_path / "data"),
        "TERM": "dumb",
    }
    mock_port = free_port()
    argv = ["make", "run", "LLM=mock", f"PORT={port}", f"MOCK_PORT={mock_port}"]
    argv += [f"WORKSPACE={workspace}"]
    terminal = Terminal(argv, env)
    try:
        terminal.read_until("Press Ctrl-C to stop.", START_DEADLINE_S)
        assert f"LLM: the bundled mock at http://127.0.0.1:{mock_port}/v1 " in terminal.text
        yield terminal, f"http://127.0.0.1:{port}", workspace
    finally:
        terminal.kill()


def test_readme_walkthrough_lists_the_change_and_ctrl_c_stops_cleanly(
    make_run: tuple[Terminal, str, Path], tmp_path: Path
) -> None:
    terminal, base_url, workspace = make_run

    def runner_online() -> bool:
        body = httpx.get(f"{base_url}/v1/runners", timeout=5).json()
        return any(runner["online"] for runner in body["data"])

    wait_until(runner_online, deadline_s=START_DEADLINE_S, what="the local runner online")

    block = readme_block("## A first session with curl")
    block = block.replace("http://127.0.0.1:8000", base_url).replace("/tmp/", f"{tmp_path}/")
    first, second = block.split("# 6.")
    wait_for_turn = (
        f'curl -sN --max-time 60 "{base_url}/v1/sessions/$SESSION/stream?after=0" '
        "| grep -m1 -q response.completed || true\n"
    )
    script = "set -eu\n" + first + wait_for_turn + "# 6." + second
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr

    # Each answer is one line of JSON (a final newline), one per curl that prints.
    lines = result.stdout.splitlines()
    assert len(lines) == len(re.findall(r"^curl -s ", block, re.M)), result.stdout
    bodies = [json.loads(line) for line in lines]
    # The README's samples are the real answers, character for character but for "…".
    samples = [line[2:] for line in block.splitlines() if line.startswith("# {")]
    assert len(samples) >= 4, samples
    for sample in samples:
        pattern = sample_pattern(sample)
        assert any(pattern.fullmatch(line) for line in lines), (sample, lines)
    changes, diff = bodies[-2], bodies[-1]
    assert [entry["path"] for entry in changes["data"]] == ["hello.txt"], changes
    assert changes["data"][0]["status"] == "created"
    assert diff["after"] == "Hello from the agent.\n", diff
    assert (workspace / "hello.txt").read_text() == "Hello from the agent.\n"
    # make run printed what the mock answered.
    terminal.read_until("mock LLM: asked 'Write hello.txt': answered tool call sys_os_write", 30)

    # Start-up without noise: no key warning, no HTTP/2 notice, no report of the
    # runtime's internals, no health checks, no line per HTTP request (runlocal's
    # checks, the runner's LLM calls), each rejection once.
    assert "DJANGO_SECRET_KEY" not in terminal.text
    assert "HTTP/2" not in terminal.text
    assert "server runtime:" not in terminal.text and "frozen" not in terminal.text
    assert "/health" not in terminal.text
    assert "HTTP Request:" not in terminal.text
    assert f"Open {base_url}/ in a browser (the API is at {base_url}/v1/)." in terminal.text
    assert "Omnigent on http" not in terminal.text  # the server's own line: said once above
    httpx.get(f"{base_url}/v1/sessions/conv_missing", timeout=5)
    terminal.read_until('"GET /v1/sessions/conv_missing" 404', 10)
    assert terminal.text.count("Not Found: /v1/sessions/conv_missing") == 1

    code = terminal.ctrl_c_and_wait(STOP_DEADLINE_S)
    assert code == 0, terminal.text[-3000:]
    # A clean stop prints one line: after the ^C the terminal echoes, only "Stopped.".
    tail = terminal.text[terminal.text.rindex("^C") + 2 :]
    assert [line.strip() for line in tail.splitlines() if line.strip()] == ["Stopped."], tail
