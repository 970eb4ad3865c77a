"""Benchmark: the workspace through the server (files.md §2), over a real tunnel.

One daphne process (SQLite, in-memory layer) and the real runner program on a
temporary workspace; every request goes HTTP → relay → tunnel → runner and back.

1. Read latency: ``GET …/filesystem/{path}`` of a 1 KiB text file, sequential
   requests on one connection (p50, p90, p99).
2. Search: ``GET …/search`` in a 5,000-file workspace (100 Python files in each of 50
   folders): a common word (stops at the 100-result limit) and a word found only in
   the last file (every file scanned).
3. Download: ``GET …/filesystem/{path}?download=1`` of a 20 MiB file, streamed in
   ``workspace.read_chunk`` calls; throughput in MiB/s, SHA-256 checked.

Run: ``.venv/bin/python -m bench.workspace [--reads 300] [--searches 10] [--downloads 5]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench._common import (
    MIB,
    USER,
    agent_bundle,
    bench_runner_env,
    env_summary,
    final_json,
    fmt,
    log_dir,
    run_main,
    sigterm_as_interrupt,
    single_server,
    summary_ms,
    wait_runner_online,
)
from testing.processes import (
    Server,
    bind,
    create_session,
    register_runner,
    spawn,
)

FILES = 5000
FOLDERS = 50


def fill_workspace(workspace: Path, *, download_mib: int) -> bytes:
    (workspace / "small.txt").write_text("0123456789abcdef" * 63 + "012345678901234\n")
    for i in range(FILES):
        folder = workspace / f"pkg{i % FOLDERS:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod{i}.py").write_text(
            f'"""Module {i}."""\n\nimport os\n\n\ndef handler_{i}(value):\n'
            f"    return os.path.join(str(value), 'needle')\n"
        )
    (workspace / f"pkg{FOLDERS - 1:02d}" / "zz_last.py").write_text("rare_marker = 1\n")
    data = os.urandom(download_mib * MIB)
    (workspace / "big.bin").write_bytes(data)
    return data


def measure(
    server: Server, session_id: str, data: bytes, args: argparse.Namespace
) -> dict[str, Any]:
    base = f"/v1/sessions/{session_id}/resources/environments/default"
    result: dict[str, Any] = {}
    with server.client(USER) as client:
        # 1. read latency
        timings = []
        for i in range(args.warmup + args.reads):
            began = time.perf_counter()
            response = client.get(f"{base}/filesystem/small.txt")
            elapsed = time.perf_counter() - began
            if response.status_code != 200 or response.json()["bytes"] != 1024:
                raise RuntimeError(f"read failed: {response.status_code} {response.text[:200]}")
            if i >= args.warmup:
                timings.append(elapsed)
        result["read_1kib"] = summary_ms(timings)
        print(f"   read of a 1 KiB file: {fmt(result['read_1kib'])}", flush=True)

        # 2. search
        for name, query, expect_truncated in (
            ("search_common_word", "needle", True),
            ("search_rare_word_all_files", "rare_marker", False),
        ):
            timings = []
            for _ in range(args.searches):
                began = time.perf_counter()
                response = client.get(f"{base}/search", params={"q": query})
                timings.append(time.perf_counter() - began)
                body = response.json()
                if response.status_code != 200 or body["truncated"] is not expect_truncated:
                    raise RuntimeError(f"search {query!r} failed: {response.text[:300]}")
            result[name] = {**summary_ms(timings), "hits": len(body["data"])}
            print(f"   {name} ({FILES} files): {fmt(summary_ms(timings))}", flush=True)

        # 3. download throughput
        rates, seconds = [], []
        expected = hashlib.sha256(data).hexdigest()
        for _ in range(args.downloads):
            digest = hashlib.sha256()
            began = time.perf_counter()
            with client.stream(
                "GET", f"{base}/filesystem/big.bin", params={"download": "1"}
            ) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"download failed: {response.status_code}")
                for chunk in response.iter_bytes():
                    digest.update(chunk)
            elapsed = time.perf_counter() - began
            if digest.hexdigest() != expected:
                raise RuntimeError("the download's SHA-256 differs from the file's")
            seconds.append(elapsed)
            rates.append(len(data) / MIB / elapsed)
        result["download"] = {
            "mib": len(data) // MIB,
            "seconds": summary_ms(seconds),
            "mib_per_s_median": round(sorted(rates)[len(rates) // 2], 1),
            "mib_per_s_best": round(max(rates), 1),
            "sha256_checked": True,
        }
        print(
            f"   download of {len(data) // MIB} MiB: median "
            f"{result['download']['mib_per_s_median']} MiB/s "
            f"(best {result['download']['mib_per_s_best']})",
            flush=True,
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=300, help="measured 1 KiB reads")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured reads first")
    parser.add_argument("--searches", type=int, default=10, help="searches of each kind")
    parser.add_argument("--downloads", type=int, default=5, help="measured downloads")
    parser.add_argument("--download-mib", type=int, default=20, help="size of the download")
    parser.add_argument("--django-debug", action="store_true", help="DJANGO_DEBUG=1 servers")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp folder")
    args = parser.parse_args()
    sigterm_as_interrupt()
    result: dict[str, Any] = {"bench": "workspace", **env_summary()}
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        workspace = tmp / "workspace"
        workspace.mkdir()
        print(f"== filling the workspace ({FILES} files, {args.download_mib} MiB file)", flush=True)
        data = fill_workspace(workspace, download_mib=args.download_mib)
        server = single_server(stack, tmp, debug=args.django_debug, name="daphne")
        runner_id, token = register_runner(server, user=USER, name="bench-runner")
        env = bench_runner_env(server_url=server.url, token=token, workspace=workspace)
        runner = spawn("runner", [sys.executable, "-m", "omnigent_runner"], env=env, log_dir=tmp)
        stack.callback(runner.stop)
        wait_runner_online(server, runner_id, process=runner)
        session_id = create_session(server, agent_bundle(os_env=True), user=USER)
        bind(server, session_id, runner_id, user=USER)
        print("== measuring", flush=True)
        result.update(measure(server, session_id, data, args))
    final_json(result)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
