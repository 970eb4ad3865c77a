"""Requests for the webhook endpoints, for ``test_schema_conformance``.

Each status the schema documents for these operations is produced here once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.test import override_settings
from django.utils import timezone

from webhooks import fanout
from webhooks.models import Delivery

WEBHOOKS = "/v1/webhooks"
WEBHOOK = WEBHOOKS + "/{webhook_id}"
ROTATE = WEBHOOK + "/rotate-secret"
TEST = WEBHOOK + "/test"
DELIVERIES = WEBHOOK + "/deliveries"
REDELIVER = DELIVERIES + "/{delivery_id}/redeliver"


def exercise_webhooks(alice: Any, bob: Any, anon: Any) -> None:
    local = {"url": "http://127.0.0.1:9/hook", "events": ["*"]}
    with override_settings(OMNIGENT_WEBHOOK_ALLOW_HTTP=True, OMNIGENT_WEBHOOK_ALLOW_PRIVATE=True):
        created = alice("post", WEBHOOKS, local)
    webhook_id = created.json()["id"]
    one = {"webhook_id": webhook_id}
    unknown = {"webhook_id": "wh_unknown"}
    statuses = [
        alice("post", WEBHOOKS, {**local, "url": "https://127.0.0.1/"}),
        anon("post", WEBHOOKS, local),
        alice("get", WEBHOOKS),
        anon("get", WEBHOOKS),
        alice("get", WEBHOOK, **one),
        bob("get", WEBHOOK, **one),
        anon("get", WEBHOOK, **one),
        alice("patch", WEBHOOK, {"description": "ci"}, **one),
        alice("patch", WEBHOOK, {"enabled": 1}, **one),
        bob("patch", WEBHOOK, {"description": "x"}, **one),
        anon("patch", WEBHOOK, {"description": "x"}, **one),
        alice("post", ROTATE, **one),
        alice("post", ROTATE, **unknown),
        anon("post", ROTATE, **one),
        alice("post", TEST, **one),
        alice("post", TEST, **unknown),
        anon("post", TEST, **one),
    ]
    assert [r.status_code for r in statuses] == [
        *[400, 401, 200, 401],
        *[200, 404, 401, 200, 400, 404, 401],
        *[200, 404, 401, 202, 404, 401],
    ]
    fanout.fan_out(now=timezone.now())
    delivery = Delivery.objects.get(webhook_id=webhook_id)
    mine = {**one, "delivery_id": delivery.id}
    listed = [
        alice("get", DELIVERIES, **one),
        alice("get", DELIVERIES, query="?limit=zero", **one),
        alice("get", DELIVERIES, **unknown),
        anon("get", DELIVERIES, **one),
        alice("post", REDELIVER, **mine),
        alice("post", REDELIVER, **{**one, "delivery_id": "whd_unknown"}),
        anon("post", REDELIVER, **mine),
    ]
    Delivery.objects.filter(pk=delivery.pk).update(
        claimed_until=timezone.now() + timedelta(minutes=1)
    )
    listed.append(alice("post", REDELIVER, **mine))
    assert [r.status_code for r in listed] == [200, 400, 404, 401, 202, 404, 401, 409]
    assert listed[0].json()["data"][0]["type"] == "webhook.test"
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1024):
        large = alice("post", WEBHOOKS, {**local, "description": "x" * 4096})
    assert large.status_code == 413
    ended = [alice("delete", WEBHOOK, **one), alice("delete", WEBHOOK, **one)]
    assert [r.status_code for r in ended] == [200, 404]
    assert anon("delete", WEBHOOK, **one).status_code == 401
