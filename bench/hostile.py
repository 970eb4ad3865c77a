"""Benchmark: how fast hostile agent YAML is refused (issue 15, item 4).

In-process, with the same ``parse_bundle`` the server runs on every upload and the
runner on every ``session.open``:

* ``gzip_bomb``: 24 MiB of agent YAML compressed to tens of kilobytes, refused by the
  1 MiB cap before parsing (the time is the inflation of the archive);
* ``alias_bomb``: nine levels of ten aliases (10^9 values), refused while composing;
* ``deep_flow``: half a million ``[`` (500 KB), refused at the 65th level;
* ``wide_aliases``: a list of 100,000 aliases of one scalar, refused at the value budget;
* ``legit_1mib``: the largest YAML accepted, a 1 MiB prompt, parsed in full (the most
  parse work one upload can cause);
* ``not_utf8_1mib``: the same with an overlong ``\\xc0\\xaf`` at its end, refused when
  the text is decoded, before parsing.

Each case is timed ``--repeat`` times; the median and the maximum are reported in ms.
``--baseline`` also times ``yaml.safe_load`` on the 24 MiB text, what an upload cost
before the cap (seconds).

Run: ``.venv/bin/python -m bench.hostile [--repeat 5] [--baseline]``. The last line
printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import yaml

from bench._common import cpu_reference_us, final_json
from omnigent_runner.bundles import BundleError, build_bundle, parse_bundle


def padded_yaml(size: int) -> str:
    line = "  " + "a" * 77 + "\n"
    return "name: big\nprompt: |\n" + line * (size // len(line) - 1)


def alias_bomb() -> str:
    lines = ["name: bomb", "prompt: p", 'l0: &l0 "lol"']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


def not_utf8(size: int) -> bytes:
    """``size`` bytes of agent YAML whose last two are an overlong ``/`` (not UTF-8)."""
    return padded_yaml(size - 2).encode("utf-8") + b"\xc0\xaf"


CASES: dict[str, Callable[[], str | bytes]] = {
    "gzip_bomb": lambda: padded_yaml(24 * 1024 * 1024),
    "alias_bomb": alias_bomb,
    "deep_flow": lambda: "name: d\nprompt: p\nx: " + "[" * 500_000 + "\n",
    "wide_aliases": lambda: (
        "name: w\nprompt: p\na: &a x\nl: [" + ", ".join(["*a"] * 100_001) + "]\n"
    ),
    "legit_1mib": lambda: padded_yaml(1024 * 1024),
    "not_utf8_1mib": lambda: not_utf8(1024 * 1024),
}


def time_case(data: bytes, repeat: int) -> tuple[dict[str, float], str]:
    times: list[float] = []
    outcome = ""
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            parse_bundle(data)
            outcome = "accepted"
        except BundleError as exc:
            outcome = f"refused: {exc}"[:160]
        times.append((time.perf_counter() - started) * 1000)
    return {
        "median_ms": round(statistics.median(times), 2),
        "max_ms": round(max(times), 2),
    }, outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", action="store_true")
    args = parser.parse_args()
    results: dict[str, object] = {"cpu_reference_us_at_start": cpu_reference_us()}
    for name, make in CASES.items():
        text = make()
        data = build_bundle({"agent.yaml": text})
        numbers, outcome = time_case(data, args.repeat)
        print(f"{name}: {len(text)} bytes of YAML, {len(data)} uploaded: {numbers} {outcome}")
        results[name] = {
            **numbers,
            "yaml_bytes": len(text),
            "upload_bytes": len(data),
            "refused": outcome.startswith("refused"),
        }
    if args.baseline:
        text = padded_yaml(24 * 1024 * 1024)
        started = time.perf_counter()
        yaml.safe_load(text)
        seconds = round(time.perf_counter() - started, 2)
        print(f"baseline: yaml.safe_load of the 24 MiB text took {seconds} s")
        results["baseline_safe_load_24mib_s"] = seconds
    final_json(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
