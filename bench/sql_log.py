"""Count and diff the statements a benchmark server logged with ``BENCH_SQL_LOG=path``.

``bench/server_settings.py`` writes each statement's normalized text (with its thread
kind) and a ``#snapshot`` line whenever the benchmark reads the counters. Two snapshots
bracket each measured round, so section ``k`` (counted from 0) is what ran between the
``k``-th and the ``k+1``-th snapshot: with ``bench.throughput --rounds-only`` sections
0, 2, 4 and 6 are the pollers' rounds 1 and 2, then the streams' rounds 1 and 2.

Run: ``.venv/bin/python -m bench.sql_log LOG [--section 6] [--per 20] [--diff OTHER_LOG]``
prints each distinct statement's count per unit (per turn with ``--per`` the round's
turns), and with ``--diff`` the same for the other log and the difference, largest first.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def sections(path: Path) -> list[Counter[str]]:
    """The statements between consecutive snapshots, counted by their logged text."""
    found: list[Counter[str]] = [Counter()]
    for line in path.read_text().splitlines():
        if line == "#snapshot":
            found.append(Counter())
        elif line:
            found[-1][line] += 1
    return found[1:-1]  # before the first snapshot: setup; after the last: shutdown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--section", type=int, default=6)
    parser.add_argument("--per", type=float, default=20.0)
    parser.add_argument("--diff", type=Path)
    parser.add_argument("--width", type=int, default=150)
    args = parser.parse_args()
    mine = sections(args.log)[args.section]
    other = sections(args.diff)[args.section] if args.diff else Counter()
    keys = sorted(set(mine) | set(other), key=lambda k: (-abs(mine[k] - other[k]), -mine[k], k))
    for key in keys:
        a, b = mine[key] / args.per, other[key] / args.per
        text = key[: args.width]
        if args.diff:
            if mine[key] != other[key]:
                print(f"{a:7.2f} {b:7.2f} {a - b:+7.2f}  {text}")
        else:
            print(f"{a:7.2f}  {text}")
    total_a, total_b = sum(mine.values()) / args.per, sum(other.values()) / args.per
    print(
        f"{total_a:7.2f} {total_b:7.2f} {total_a - total_b:+7.2f}  total"
        if args.diff
        else f"{total_a:7.2f}  total"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
