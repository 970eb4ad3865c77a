"""prometheus-client's multi-process mode as the server uses it (omnigent_site/metrics.py):
figures of several processes sharing PROMETHEUS_MULTIPROC_DIR are summed by a scrape on
any of them, and live gauges of a process that died stop counting."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testing.processes import REPO

pytestmark = pytest.mark.timeout(60)

SETUP = """
import os, sys
sys.path.insert(0, {repo!r})
os.environ["PROMETHEUS_MULTIPROC_DIR"] = {folder!r}
from omnigent_site import metrics
"""


def run(folder: Path, body: str) -> str:
    code = SETUP.format(repo=str(REPO), folder=str(folder)) + textwrap.dedent(body)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_two_processes_are_summed_and_a_dead_ones_live_gauges_forgotten(tmp_path: Path) -> None:
    worker = """
    metrics.request_answered(route="/v1/me", method="GET", status=200, seconds=0.01)
    metrics.runner_connected()
    metrics.stream_opened()
    print(os.getpid())
    """
    first = int(run(tmp_path, worker))
    second = int(run(tmp_path, worker))
    assert first != second
    scrape = """
    from prometheus_client import generate_latest
    print(generate_latest(metrics.Scrape(metrics.multiprocess_dir())).decode())
    """
    # Both workers have exited: counters keep their totals, live gauges still show
    # until someone notices the processes are gone.
    text = run(tmp_path, scrape)
    assert 'omnigent_http_requests_total{method="GET",route="/v1/me",status="200"} 2.0' in text
    assert "omnigent_connected_runners 2.0" in text
    forgotten = run(tmp_path, "print(metrics.forget_dead_processes(metrics.multiprocess_dir()))")
    # (The scraping process, gone too, had its own zero-valued gauge files.)
    assert {first, second} <= set(json.loads(forgotten))
    text = run(tmp_path, scrape)
    assert 'omnigent_http_requests_total{method="GET",route="/v1/me",status="200"} 2.0' in text
    assert "omnigent_connected_runners 0.0" in text or "omnigent_connected_runners" not in text
    assert "omnigent_open_streams 0.0" in text or "omnigent_open_streams " not in text
