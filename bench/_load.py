"""Helpers of ``bench/throughput.py``: helper processes, a byte-counting SSE reader,
per-process CPU readings and the py-spy summary.

The mock LLM and the tunnel meter run as processes of their own, so the benchmark's
clients (1,000 polls a second at 20 sessions) never slow the LLM or the tunnel down
through this process's GIL, and each one's CPU is read apart from the server's and the
runner's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench._common import REPO, cpu_seconds, within
from testing.processes import base_env


class Helper:
    """A child process that prints one ``KEY=value`` line when it is ready."""

    def __init__(self, name: str, argv: list[str], ready_key: str, tmp: Path) -> None:
        self.name = name
        self.stderr = open(tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            argv,
            cwd=REPO,
            env=base_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        self.value = self._read_ready(ready_key)

    def _read_ready(self, key: str, deadline_s: float = 30.0) -> str:
        assert self.popen.stdout is not None
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            line = self.popen.stdout.readline().decode().strip()
            if line.startswith(f"{key}="):
                return line.split("=", 1)[1]
            if not line and self.popen.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"{self.name} did not print {key}= (see {self.stderr.name})")

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        for pipe in (self.popen.stdin, self.popen.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self.stderr.close()


class MockLLM(Helper):
    """``python -m testing.mockllm`` as a process; scripts are pushed over HTTP."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(
            "mockllm", [sys.executable, "-m", "testing.mockllm", "--port", "0"], "MOCKLLM_URL", tmp
        )
        self.base_url = self.value
        self.root = self.base_url.removesuffix("/v1")

    async def configure(self, client: httpx.AsyncClient, entries: list[Any], match: str) -> None:
        response = await client.post(
            f"{self.root}/mock/configure", json={"responses": entries, "match": match}
        )
        response.raise_for_status()


class TunnelMeter(Helper):
    """``python -m bench.tunnel_meter``: counts the tunnel's frames and bytes."""

    def __init__(self, target_port: int, tmp: Path, name: str = "tunnel-meter") -> None:
        super().__init__(
            name,
            [sys.executable, "-m", "bench.tunnel_meter", "--target-port", str(target_port)],
            "PORT",
            tmp,
        )
        self.url = f"http://127.0.0.1:{self.value}"

    def report(self) -> dict[str, Any]:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(b"report\n")
        self.popen.stdin.flush()
        return dict(json.loads(self.popen.stdout.readline()))


def merge_meter_reports(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report summing several meters' (one meter per runner when there are several)."""
    merged: dict[str, Any] = {
        "bytes": {"up": 0, "down": 0},
        "messages": {"up": {}, "down": {}},
        "batched": {"up": {}, "down": {}},
        "connections": 0,
    }
    for report in reports:
        merged["connections"] += report.get("connections", 0)
        for direction in ("up", "down"):
            merged["bytes"][direction] += report["bytes"][direction]
            for name in ("messages", "batched"):
                table = merged[name][direction]
                for kind, count in report.get(name, {}).get(direction, {}).items():
                    table[kind] = table.get(kind, 0) + count
    return merged


def meter_delta(before: dict[str, Any], after: dict[str, Any], turns: int) -> dict[str, Any]:
    """Bytes and messages per turn on the tunnel between two meter reports."""
    out: dict[str, Any] = {}
    for direction in ("up", "down"):
        out[f"bytes_{direction}_per_turn"] = round(
            (after["bytes"][direction] - before["bytes"][direction]) / turns, 1
        )
        kinds = after["messages"][direction]
        old = before["messages"][direction]
        delta = {k: kinds[k] - old.get(k, 0) for k in kinds if kinds[k] - old.get(k, 0)}
        out[f"messages_{direction}_per_turn"] = round(sum(delta.values()) / turns, 2)
        out[f"by_type_{direction}_per_turn"] = {
            k: round(v / turns, 2) for k, v in sorted(delta.items())
        }
        # What the ``events``/``event.acks`` messages carried, by the same kinds.
        kinds = after.get("batched", {}).get(direction, {})
        old = before.get("batched", {}).get(direction, {})
        batched = {k: kinds[k] - old.get(k, 0) for k in kinds if kinds[k] - old.get(k, 0)}
        out[f"batched_{direction}_per_turn"] = {
            k: round(v / turns, 2) for k, v in sorted(batched.items())
        }
    return out


class CpuClock:
    """CPU seconds of named processes (this one included) between ``start`` and ``stop``.

    A name may stand for several processes (a role: every server process, every
    runner): its figure is their sum, and :meth:`per_process_ms` gives each one apart
    as ``<name><index>``.
    """

    def __init__(self, pids: Mapping[str, int | Sequence[int]]) -> None:
        self.groups: dict[str, list[int]] = {
            name: [pid] if isinstance(pid, int) else list(pid) for name, pid in pids.items()
        }
        self.groups["bench_client"] = [os.getpid()]
        self.begin: dict[int, float] = {}

    def start(self) -> None:
        self.begin = {pid: cpu_seconds(pid) for pids in self.groups.values() for pid in pids}

    def _used(self) -> dict[int, float]:
        return {pid: cpu_seconds(pid) - start for pid, start in self.begin.items()}

    def per_turn_ms(self, turns: int) -> dict[str, float]:
        used = self._used()
        return {
            name: round(sum(used[pid] for pid in pids) * 1000 / turns, 2)
            for name, pids in self.groups.items()
        }

    def per_process_ms(self, turns: int) -> dict[str, float]:
        """Each process of a role of several, as ``server0``, ``server1``, …"""
        used = self._used()
        return {
            f"{name}{index}": round(used[pid] * 1000 / turns, 2)
            for name, pids in self.groups.items()
            if len(pids) > 1
            for index, pid in enumerate(pids)
        }


class CountingStream:
    """Follows ``/v1/sessions/{id}/stream``; counts bytes and events, and tells the
    caller each event's type and JSON text (``on_event(type, data, t_recv)``)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        session_id: str,
        on_event: Callable[[str, str, float], None],
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.on_event = on_event
        self.bytes = 0
        self.events = 0
        self.connected = asyncio.Event()
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async with self.client.stream(
                "GET",
                f"/v1/sessions/{self.session_id}/stream",
                headers={"Accept": "text/event-stream"},
                timeout=httpx.Timeout(30.0, read=None),
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise RuntimeError(f"stream → HTTP {response.status_code}")
                buffer = b""
                event_type = "message"
                async for chunk in response.aiter_raw():
                    self.bytes += len(chunk)
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for raw in lines:
                        line = raw.decode()
                        if line.startswith("event:"):
                            event_type = line[6:].strip()
                        elif line.startswith("data:"):
                            data = line[5:].lstrip()
                            if data == "[DONE]":
                                return
                            if event_type == "session.heartbeat":
                                self.connected.set()
                            else:
                                self.events += 1
                            self.on_event(event_type, data, time.perf_counter())
                        elif line == "":
                            event_type = "message"
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark
            self.error = exc
        finally:
            self.connected.set()

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task


async def open_streams(streams: list[CountingStream]) -> None:
    await within(asyncio.gather(*(s.connected.wait() for s in streams)), 30, "the streams to open")
    for s in streams:
        if s.error is not None:
            raise RuntimeError(f"stream of {s.session_id} failed: {s.error!r}")


# --------------------------------------------------------------------------- py-spy


class Profiler:
    """``py-spy record`` on one process (raw collapsed stacks, idle threads left out)."""

    def __init__(self, pid: int, output: Path, rate: int, *, gil_only: bool = False) -> None:
        """``gil_only``: sample only the thread holding the GIL (py-spy ``--gil``), so the
        profile shows where CPU goes rather than where threads wait."""
        exe = Path(sys.executable).with_name("py-spy")
        self.output = output
        self.log = open(output.with_suffix(".log"), "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [
                str(exe),
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--nonblocking",
                "--threads",
                *(["--gil"] if gil_only else []),
                "--output",
                str(output),
            ],
            stdout=self.log,
            stderr=self.log,
        )

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self.log.close()


def _frame_name(frame: str) -> str:
    """``handle (django/core/handlers/base.py:140)`` → ``handle (django/core/handlers/base.py)``."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", str(REPO) + "/", "/lib/python3."):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3.":
                path = path.split("/", 1)[1]  # "11/asyncio/events.py" → "asyncio/events.py"
            break
    return f"{name} ({path})" if path else name


def summarise_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive shares of the samples per function, and per thread."""
    if not path.exists():
        return {"error": f"no profile written ({path.with_suffix('.log')})"}
    total = 0
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    threads: dict[str, int] = {}
    packages: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = "?"
        if frames[0].startswith("thread ("):
            thread = frames[0].partition(": ")[2].split("-", 1)[0].rstrip("_0123456789")
            frames = frames[1:]
        total += count
        threads[thread] = threads.get(thread, 0) + count
        names = [_frame_name(f) for f in frames]
        if names:
            own[names[-1]] = own.get(names[-1], 0) + count
            leaf_path = names[-1].rpartition("(")[2].rstrip(")")
            package = leaf_path.split("/", 1)[0] if "/" in leaf_path else leaf_path
            packages[package] = packages.get(package, 0) + count
        for name in set(names):
            inclusive[name] = inclusive.get(name, 0) + count

    def share(table: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [(name, round(100 * n / total, 1)) for name, n in ranked]

    return {
        "samples": total,
        "self_pct": share(own),
        "inclusive_pct": share(inclusive),
        "leaf_package_pct": share(packages),
        "threads_pct": share(threads),
    }
