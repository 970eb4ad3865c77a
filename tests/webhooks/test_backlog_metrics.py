"""``omnigent_webhook_backlog`` and ``omnigent_webhook_oldest_wait_seconds``: what waits
for a sender, read from the database at each scrape (webhooks/metrics.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from omnigent_site.users import get_or_create_user
from tests.api.conftest import ALICE
from tests.api.test_metrics import sample
from webhook_outbox.models import WebhookEvent
from webhooks import delivery, fanout, services
from webhooks.metrics import WebhookBacklog
from webhooks.models import Delivery, Webhook

pytestmark = pytest.mark.django_db


def read(collector: WebhookBacklog) -> dict[str, float]:
    values = {}
    for family in collector.collect():
        for found in family.samples:
            kind = found.labels.get("kind")
            values[f"{found.name}:{kind}" if kind else found.name] = found.value
    return values


@pytest.fixture
def hook(local_receivers_allowed: None) -> Webhook:
    return services.create_webhook(
        owner=get_or_create_user(ALICE), url="http://127.0.0.1:9/hook", events=["*"]
    )


def test_what_waits_and_for_how_long(hook: Webhook) -> None:
    event = WebhookEvent.objects.get(pk=services.send_test(webhook=hook))
    clock: list[datetime] = [event.created_at + timedelta(seconds=30)]
    backlog = WebhookBacklog(clock=lambda: clock[0])
    assert read(backlog) == {
        "omnigent_webhook_backlog:events": 1,
        "omnigent_webhook_backlog:deliveries": 0,
        "omnigent_webhook_oldest_wait_seconds": 30.0,
    }
    # Fanned out: a delivery due since the fan-out, 5 s before the scrape.
    fanout.fan_out(now=clock[0] - timedelta(seconds=5))
    assert read(backlog) == {
        "omnigent_webhook_backlog:events": 0,
        "omnigent_webhook_backlog:deliveries": 1,
        "omnigent_webhook_oldest_wait_seconds": 5.0,
    }
    # Claimed: in flight, no longer waiting for a sender.
    [claimed] = delivery.claim_due(now=clock[0], limit=10)
    assert read(backlog)["omnigent_webhook_backlog:deliveries"] == 0
    assert read(backlog)["omnigent_webhook_oldest_wait_seconds"] == 0.0
    # Its claim expired (the sender died): due again, and waiting since the expiry.
    expiry = Delivery.objects.get(pk=claimed.delivery_id).next_attempt_at
    assert expiry is not None
    clock[0] = expiry + timedelta(seconds=2)
    assert read(backlog)["omnigent_webhook_backlog:deliveries"] == 1
    assert read(backlog)["omnigent_webhook_oldest_wait_seconds"] == 2.0


def test_a_disabled_webhook_s_deliveries_wait_for_no_sender(hook: Webhook) -> None:
    services.send_test(webhook=hook)
    now = WebhookEvent.objects.get().created_at
    fanout.fan_out(now=now)
    Webhook.objects.filter(pk=hook.pk).update(enabled=False)
    values = read(WebhookBacklog(clock=lambda: now + timedelta(seconds=60)))
    assert values["omnigent_webhook_backlog:deliveries"] == 0
    assert values["omnigent_webhook_oldest_wait_seconds"] == 0.0


@override_settings(OMNIGENT_METRICS=True, OMNIGENT_METRICS_TOKEN="")
def test_the_scrape_reports_them(hook: Webhook) -> None:
    services.send_test(webhook=hook)
    text = APIClient().get("/metrics").content.decode()
    assert sample(text, "omnigent_webhook_backlog", kind="events") == 1
    assert sample(text, "omnigent_webhook_backlog", kind="deliveries") == 0
    assert "# TYPE omnigent_webhook_oldest_wait_seconds gauge" in text
