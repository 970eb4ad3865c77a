"""The sessions app's figures read when ``/metrics`` is scraped (omnigent_site/metrics.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from omnigent_site import metrics

from .models import Turn

log = logging.getLogger(__name__)


class QueuedTurns(Collector):
    """``omnigent_queued_turns``: turns stored and not yet started by their runner, read
    from the database when scraped, so every process reports the same number."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "omnigent_queued_turns", "Turns stored and not yet started by their runner"
        )
        try:
            gauge.add_metric([], Turn.objects.filter(status=Turn.Status.QUEUED).count())
        except Exception:  # noqa: BLE001 - the scrape still answers without it
            log.warning("metrics: counting queued turns failed", exc_info=True)
            metrics.backend_error("database")
            return
        yield gauge

    def describe(self) -> Iterable[Any]:
        return []
