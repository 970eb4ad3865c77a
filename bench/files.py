"""Benchmark: session file uploads, and a 1 GB upload attempt cut off at the cap.

One daphne process (SQLite, in-memory layer) with ``OMNIGENT_MAX_UPLOAD_BYTES`` at
its default (20 MiB) unless ``--cap-mib`` says otherwise.

1. Throughput: ``--uploads`` uploads of ``--size-mib`` MiB each (distinct bytes, so
   every one is hashed, written, fsynced and renamed), one after another through
   httpx; MiB/s = bytes uploaded / wall time; the server's CPU per upload.
2. Oversize: a ``--oversize-mib`` (1024) body, streamed over a raw socket in 1 MiB
   writes, announced with ``Content-Length`` and then again chunked (no length). The
   server answers 413 and drops the rest. Reported: the answer, bytes the client got
   to send before the server closed, the time to the 413, and the server's RSS
   (baseline after warm-up, peak sampled every 16 MiB sent and at the end).

Run: ``.venv/bin/python -m bench.files [--uploads 20] [--size-mib 16]
[--oversize-mib 1024]``. The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from typing import Any

from bench._common import (
    MIB,
    USER,
    agent_bundle,
    cpu_seconds,
    env_summary,
    final_json,
    log_dir,
    mib,
    rss_bytes,
    run_main,
    sigterm_as_interrupt,
    sqlite_env,
    start_daphne,
)
from testing.processes import Server, migrate


def create_session(server: Server) -> str:
    with server.client(USER) as client:
        response = client.post(
            "/v1/sessions",
            files={"bundle": ("agent.tar.gz", agent_bundle(os_env=False), "application/gzip")},
            data={"metadata": "{}"},
        )
        response.raise_for_status()
        return str(response.json()["session_id"])


def measure_uploads(server: Server, session_id: str, *, uploads: int, size: int) -> dict[str, Any]:
    pid = server.process.popen.pid
    payloads = [os.urandom(8).hex().encode() + b"x" * (size - 16) for _ in range(uploads)]
    path = f"/v1/sessions/{session_id}/resources/files"
    with server.client(USER) as client:
        client.post(path, files={"file": ("warm.txt", b"warm", "text/plain")}).raise_for_status()
        cpu_before = cpu_seconds(pid)
        started = time.perf_counter()
        for index, payload in enumerate(payloads):
            response = client.post(
                path, files={"file": (f"f{index}.txt", payload, "application/octet-stream")}
            )
            response.raise_for_status()
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(pid) - cpu_before
    total = uploads * size
    return {
        "uploads": uploads,
        "size_mib": mib(size),
        "seconds": round(elapsed, 3),
        "throughput_mib_s": round(total / MIB / elapsed, 1),
        "server_cpu_ms_per_upload": round(cpu / uploads * 1000, 1),
    }


def oversize_attempt(
    server: Server, session_id: str, *, total: int, chunked: bool
) -> dict[str, Any]:
    host, port = server.url.removeprefix("http://").split(":")
    pid = server.process.popen.pid
    baseline = rss_bytes(pid)
    peak = baseline
    boundary = "bench-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="huge.txt"\r\n\r\n'
    ).encode()
    lines = [
        f"POST /v1/sessions/{session_id}/resources/files HTTP/1.1",
        f"Host: {host}:{port}",
        f"X-Forwarded-Email: {USER}",
        f"Content-Type: multipart/form-data; boundary={boundary}",
        "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}",
    ]
    block = b"a" * MIB
    sent = 0
    answer = b""
    answered_at: float | None = None
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.setblocking(True)
    started = time.perf_counter()
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        first = True
        while sent < total:
            piece = (head + block)[:MIB] if first else block[: min(MIB, total - sent)]
            first = False
            frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
            if answered_at is None:
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    answer += sock.recv(65536)
                    answered_at = time.perf_counter()
                sock.setblocking(True)
            if sent % (16 * MIB) < MIB:
                peak = max(peak, rss_bytes(pid))
        if not answer:
            sock.settimeout(10)
            with contextlib.suppress(OSError):
                answer = sock.recv(65536)
                answered_at = time.perf_counter()
    finally:
        peak = max(peak, rss_bytes(pid))
        sock.close()
    return {
        "framing": "chunked" if chunked else "content-length",
        "offered_mib": mib(total),
        "status_line": answer.split(b"\r\n", 1)[0].decode(errors="replace"),
        "client_sent_mib_before_close": mib(sent),
        "seconds_to_413": None if answered_at is None else round(answered_at - started, 3),
        "server_rss_baseline_mib": mib(baseline),
        "server_rss_peak_mib": mib(peak),
        "server_rss_growth_mib": mib(peak - baseline),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uploads", type=int, default=20)
    parser.add_argument("--size-mib", type=float, default=16.0)
    parser.add_argument("--cap-mib", type=float, default=20.0)
    parser.add_argument("--oversize-mib", type=int, default=1024)
    parser.add_argument("--django-debug", action="store_true")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    sigterm_as_interrupt()
    result: dict[str, Any] = {"env": env_summary()}
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        env = sqlite_env(tmp, debug=args.django_debug, name="files")
        env["OMNIGENT_MAX_UPLOAD_BYTES"] = str(int(args.cap_mib * MIB))
        migrate(env, tmp)
        server = start_daphne(stack, env=env, tmp=tmp, name="daphne-files")
        session_id = create_session(server)
        print("uploading…", file=sys.stderr)
        result["uploads"] = measure_uploads(
            server, session_id, uploads=args.uploads, size=int(args.size_mib * MIB)
        )
        print(f"  {result['uploads']}", file=sys.stderr)
        for chunked in (False, True):
            outcome = oversize_attempt(
                server, session_id, total=args.oversize_mib * MIB, chunked=chunked
            )
            print(f"  {outcome}", file=sys.stderr)
            result["oversize_" + outcome["framing"].replace("-", "_")] = outcome
        result["cap_mib"] = args.cap_mib
    final_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
