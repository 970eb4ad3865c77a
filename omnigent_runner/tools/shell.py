"""``sys_os_shell``: run ``bash -c`` in the tool root.

**Not confined.** With ``sandbox.type: none`` (the only sandbox this project
implements) the command runs as the runner's user and can read or change anything
that user can; only the starting directory is the tool root. What this module does
guarantee:

* The environment is scrubbed of credentials (see :func:`scrubbed_env`) so the agent
  cannot simply ``env`` its way to the runner's API keys.
* The command runs in its own session and process group, so a timeout or a cancelled
  turn kills everything it started (``os.killpg``), not only ``bash``.
* Output is read incrementally and each stream keeps at most ``OUTPUT_CAP``
  characters, so a command printing gigabytes cannot exhaust the runner's memory.
* stdin is ``/dev/null``: an interactive command fails fast instead of hanging.

Background jobs that outlive the command and keep its stdout/stderr open are given a
short grace period, after which the pipes are closed and the result is returned
(those jobs keep running, but lose their output).
"""

from __future__ import annotations

import asyncio
import codecs
import os
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .arguments import ToolError, optional_seconds, require_str

OUTPUT_CAP = 100_000
DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 24 * 3600.0
_READ_CHUNK = 64 * 1024
#: How long to wait for the pipes to close once the command itself has exited.
_PIPE_GRACE = 2.0
_POLL_INTERVAL = 0.1

_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
_SECRET_PREFIXES = ("OPENAI_", "OMNIGENT_", "ANTHROPIC_", "AWS_")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable looks like a credential (case-insensitive)."""
    upper = name.upper()
    return any(m in upper for m in _SECRET_MARKERS) or upper.startswith(_SECRET_PREFIXES)


def scrubbed_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment without credentials; PATH, HOME, LANG etc. stay."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if not is_secret_name(k)}


class _CappedText:
    """Decodes a byte stream, keeping the first ``cap`` characters and counting the rest."""

    def __init__(self, cap: int = OUTPUT_CAP) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._cap = cap
        self._parts: list[str] = []
        self._kept = 0
        self.dropped = 0

    def feed(self, data: bytes, *, final: bool = False) -> None:
        text = self._decoder.decode(data, final=final)
        room = self._cap - self._kept  # never negative
        if room > 0:
            self._parts.append(text[:room])
            self._kept += min(room, len(text))
        self.dropped += max(0, len(text) - room)

    def text(self) -> str:
        body = "".join(self._parts)
        if self.dropped:
            body += f"\n[output truncated: {self.dropped} more characters]"
        return body


async def _drain(reader: asyncio.StreamReader | None, sink: _CappedText) -> None:
    if reader is None:
        return
    while chunk := await reader.read(_READ_CHUNK):
        sink.feed(chunk)
    sink.feed(b"", final=True)


def _kill_group(pid: int) -> None:
    """SIGKILL the command's process group (its pgid is bash's pid: a new session)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _wait_exit(
    proc: asyncio.subprocess.Process, waiter: asyncio.Task[int], within: float | None
) -> bool:
    """Wait until the command exits; False if ``within`` seconds pass first.

    ``Process.wait()`` (``waiter``) only returns once the pipes are closed too on
    Python 3.11, so a background job holding stdout would block it; ``returncode`` is
    set as soon as the process is reaped, so it is polled alongside.
    """
    loop = asyncio.get_running_loop()
    deadline = None if within is None else loop.time() + within
    while proc.returncode is None and not waiter.done():
        step = _POLL_INTERVAL if deadline is None else min(_POLL_INTERVAL, deadline - loop.time())
        if step <= 0:
            return False
        await asyncio.wait({waiter}, timeout=step)
    return True


def _exit_error(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"command was terminated by signal {name}"
    return f"command exited with status {code}"


async def run_shell(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Run ``args["command"]`` and return stdout, stderr, exit code and timeout flag."""
    command = require_str(args, "command", allow_empty=False)
    timeout = optional_seconds(args, "timeout", DEFAULT_TIMEOUT, maximum=MAX_TIMEOUT)
    try:
        proc = await asyncio.create_subprocess_exec(
            shutil.which("bash") or "/bin/bash",
            "-c",
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=root,
            env=scrubbed_env(),
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolError(f"cannot start bash in '{root}': {exc}") from exc

    out, err = _CappedText(), _CappedText()
    readers = [
        asyncio.create_task(_drain(proc.stdout, out)),
        asyncio.create_task(_drain(proc.stderr, err)),
    ]
    waiter = asyncio.create_task(proc.wait())
    timed_out = False
    try:
        if not await _wait_exit(proc, waiter, timeout):
            timed_out = True
            _kill_group(proc.pid)
            await _wait_exit(proc, waiter, None)
        await asyncio.wait(readers, timeout=_PIPE_GRACE)
    except BaseException:
        # Cancelled turn (or anything unexpected): nothing the command started survives.
        _kill_group(proc.pid)
        raise
    finally:
        for task in (*readers, waiter):
            task.cancel()
        # Pipes still held by background jobs would keep the transport open; asyncio has
        # no public way to close a Process's pipes, so close its transport directly.
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()

    code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    result: dict[str, Any] = {
        "stdout": out.text(),
        "stderr": err.text(),
        "exit_code": code,
        "timed_out": timed_out,
        "cwd": str(root),
    }
    if timed_out:
        result["error"] = (
            f"command timed out after {timeout:g} seconds; its process group was killed"
        )
    elif code != 0:
        result["error"] = _exit_error(code)
    return result
