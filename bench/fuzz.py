"""API fuzzing, the long run: schemathesis against ``/v1/schema`` on a live daphne in
local single-user mode and in header mode, with many more cases per operation than the
CI test (``tests/fuzz/test_schemathesis.py``; the shared code is ``testing/fuzzing.py``).

Each mode first sends every operation text that is not UTF-8
(``fuzzing.not_utf8_sweep``, a few seconds). Prints schemathesis's summary per mode, then
one JSON object: per mode the requests, the seconds, the status codes, how many
operations below a seeded session answered 2xx, and the not-UTF-8 requests and
failures. Exits 1 when a mode found a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import final_json, log_dir, run_main, sigterm_as_interrupt
from testing import fuzzing
from testing.mockllm import MockLLMServer
from testing.processes import base_env, migrate, start_server

MODES: dict[str, tuple[dict[str, str], str | None]] = {
    "local": ({"OMNIGENT_LOCAL_SINGLE_USER": "1"}, None),
    "header": ({}, fuzzing.FUZZ_USER),
}


def run_mode(
    mode: str, tmp: Path, *, max_examples: int, workers: int, max_time_s: int | None
) -> dict[str, Any]:
    settings, user = MODES[mode]
    env = base_env(
        DATABASE_URL=f"sqlite:///{tmp / 'db.sqlite3'}",
        OMNIGENT_DATA_DIR=str(tmp / "data"),
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY="bench-" + "x" * 50,
        **fuzzing.SERVER_SETTINGS,
        **settings,
    )
    migrate(env, tmp)
    with contextlib.ExitStack() as stack:
        server = start_server(env=env, log_dir=tmp, name=f"daphne-{mode}", stack=stack)
        mock_llm = MockLLMServer()
        mock_llm.start()
        stack.callback(mock_llm.stop)
        found = fuzzing.seed_resources(server, user=user, mock_llm=mock_llm, log_dir=tmp)
        if found.runner_process is not None:
            stack.callback(found.runner_process.stop)
        not_utf8 = fuzzing.not_utf8_sweep(server, found, user=user)
        for failure in not_utf8.failures:
            print(f"not UTF-8: {failure}", flush=True)
        config = fuzzing.write_config(
            tmp / "schemathesis.toml",
            found,
            max_examples=max_examples,
            workers=workers,
            stream_paths=fuzzing.event_stream_paths(server),
        )
        result = fuzzing.run_schemathesis(
            server,
            config=config,
            report_dir=tmp,
            user=user,
            timeout_s=6 * 3600,
            max_time_s=max_time_s,
        )
        print(result.output[-6000:], flush=True)
        return {
            "passed": result.returncode == 0 and not not_utf8.failures,
            "not_utf8_requests": not_utf8.requests,
            "not_utf8_failures": len(not_utf8.failures),
            "deep_operations": fuzzing.deep_successes(result, found),
            **fuzzing.summary(result),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--max-examples", type=int, default=150, help="cases per operation and phase (150)"
    )
    parser.add_argument(
        "--max-time",
        type=int,
        default=None,
        help="seconds per mode: fuzzing and stateful phases repeat until spent (off)",
    )
    parser.add_argument("--workers", type=int, default=2, help="schemathesis workers (2)")
    parser.add_argument("--mode", choices=sorted(MODES), action="append", help="repeatable")
    parser.add_argument("--keep-logs", action="store_true", help="keep the logs folder")
    args = parser.parse_args()
    sigterm_as_interrupt()
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        tmp = log_dir(stack, args.keep_logs)
        for mode in args.mode or sorted(MODES):
            print(f"fuzzing in {mode} mode", flush=True)
            folder = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=tmp))
            results[mode] = run_mode(
                mode,
                folder,
                max_examples=args.max_examples,
                workers=args.workers,
                max_time_s=args.max_time,
            )
    final_json(
        {
            "seed": fuzzing.SEED,
            "max_examples": args.max_examples,
            "max_time_s": args.max_time,
            **results,
        }
    )
    return 0 if all(result["passed"] for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
