"""The webhooks app's figures read when ``/metrics`` is scraped (omnigent_site/metrics.py).

``omnigent_webhook_backlog{kind}``: outbox events not yet given their deliveries
(``events``) and deliveries of enabled webhooks due now (``deliveries``: waiting for a
sender, not for their retry time). ``omnigent_webhook_oldest_wait_seconds``: how long
the oldest of them has waited. Read from the database, so every process reports the
same numbers. An age that keeps growing means nothing delivers: with
``OMNIGENT_WEBHOOK_DELIVERY=worker``, no ``manage.py deliverwebhooks`` process runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from omnigent_site import metrics
from webhook_outbox.models import WebhookEvent

from .models import Delivery

log = logging.getLogger(__name__)


class WebhookBacklog(Collector):
    def __init__(self, *, clock: Callable[[], datetime] = timezone.now) -> None:
        self.clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        try:
            events = WebhookEvent.objects.filter(dispatched=False).aggregate(
                n=Count("id"), oldest=Min("created_at")
            )
            due = Delivery.objects.filter(
                status=Delivery.Status.PENDING, next_attempt_at__lte=now, webhook__enabled=True
            ).aggregate(n=Count("id"), oldest=Min("next_attempt_at"))
        except Exception:  # noqa: BLE001 - the scrape still answers without them
            log.warning("metrics: reading the webhook backlog failed", exc_info=True)
            metrics.backend_error("database")
            return
        backlog = GaugeMetricFamily(
            "omnigent_webhook_backlog",
            "Webhook events waiting for their deliveries, and deliveries due now",
            labels=["kind"],
        )
        backlog.add_metric(["events"], events["n"])
        backlog.add_metric(["deliveries"], due["n"])
        yield backlog
        waits = [
            (now - since).total_seconds() for since in (events["oldest"], due["oldest"]) if since
        ]
        oldest = GaugeMetricFamily(
            "omnigent_webhook_oldest_wait_seconds",
            "How long the oldest waiting webhook event or due delivery has waited",
        )
        oldest.add_metric([], max([0.0, *waits]))
        yield oldest

    def describe(self) -> Iterable[Any]:
        return []
