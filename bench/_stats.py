"""Percentiles and their one-line summaries, shared by the benchmark scripts.

Django-free, so a script that does not start the server (``bench/channel_layers.py``)
can use it without configuring the project.
"""

from __future__ import annotations

import math
from typing import Any


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def summary_ms(samples_s: list[float]) -> dict[str, float | int]:
    """p50/p95/p99/mean/min/max in milliseconds of samples given in seconds."""
    values = sorted(samples_s)
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.50) * 1000, 3),
        "p95_ms": round(percentile(values, 0.95) * 1000, 3),
        "p99_ms": round(percentile(values, 0.99) * 1000, 3),
        "mean_ms": round(sum(values) / len(values) * 1000, 3),
        "min_ms": round(values[0] * 1000, 3),
        "max_ms": round(values[-1] * 1000, 3),
    }


def fmt(stats: dict[str, Any]) -> str:
    if not stats.get("n"):
        return "no samples"
    return (
        f"n={stats['n']}  p50={stats['p50_ms']:.2f} ms  p95={stats['p95_ms']:.2f} ms  "
        f"mean={stats['mean_ms']:.2f} ms  max={stats['max_ms']:.2f} ms"
    )
