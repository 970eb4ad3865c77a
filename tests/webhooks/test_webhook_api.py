"""The webhook endpoints (automation.md, Webhooks): shapes, ownership, validation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tests.api.conftest import ALICE, BOB, assert_error
from webhooks import fanout
from webhooks.models import Delivery, Webhook

pytestmark = pytest.mark.django_db

URL = "https://hooks.example.com/in"


def create(client: APIClient, **body: Any) -> Any:
    return client.post("/v1/webhooks", {"url": URL, "events": ["*"], **body}, format="json")


def test_create_shows_the_secret_once_and_lists_own(client_for: Callable[..., APIClient]) -> None:
    alice = client_for(ALICE)
    response = create(alice, events=["turn.completed", "turn.failed"], description="ci")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"].startswith("wh_")
    assert body["secret"].startswith("whsec_")
    assert body["url"] == URL and body["enabled"] is True and body["description"] == "ci"
    assert body["events"] == ["turn.completed", "turn.failed"]
    assert isinstance(body["created_at"], int)
    listed = alice.get("/v1/webhooks").json()
    assert [row["id"] for row in listed["data"]] == [body["id"]]
    assert "secret" not in listed["data"][0]
    assert "secret" not in alice.get(f"/v1/webhooks/{body['id']}").json()
    assert client_for(BOB).get("/v1/webhooks").json()["data"] == []


def test_another_users_webhook_is_not_found(client_for: Callable[..., APIClient]) -> None:
    webhook_id = create(client_for(ALICE)).json()["id"]
    bob = client_for(BOB)
    for method, path in [
        ("get", f"/v1/webhooks/{webhook_id}"),
        ("patch", f"/v1/webhooks/{webhook_id}"),
        ("delete", f"/v1/webhooks/{webhook_id}"),
        ("post", f"/v1/webhooks/{webhook_id}/rotate-secret"),
        ("post", f"/v1/webhooks/{webhook_id}/test"),
        ("get", f"/v1/webhooks/{webhook_id}/deliveries"),
    ]:
        assert_error(getattr(bob, method)(path, {}, format="json"), 404, "not_found")
    assert Webhook.objects.filter(pk=webhook_id).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://hooks.example.com/"}, "url"),
        ({"url": "http://hooks.example.com/"}, "url"),
        ({"url": "https://internal.example.com/"}, "url"),
        ({"url": "https://mixed.example.com/"}, "url"),
        ({"url": "https://metadata.example.com/"}, "url"),
        ({"url": "https://mapped.example.com/"}, "url"),
        ({"url": "https://127.0.0.1/"}, "url"),
        ({"url": "https://0.0.0.0/"}, "url"),
        ({"url": "https://2130706433/"}, "url"),
        ({"url": "https://[::1]/"}, "url"),
        ({"url": "https://[::ffff:169.254.169.254]/"}, "url"),
        ({"url": "https://nowhere.invalid/"}, "url"),
        ({"url": "https://user:pw@hooks.example.com/"}, "url"),
        ({"url": 5}, "url"),
        ({"events": []}, "events"),
        ({"events": ["turn.done"]}, "events"),
        ({"events": "turn.completed"}, "events"),
        ({"description": 3}, "description"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    client_for: Callable[..., APIClient], body: dict[str, Any], field: str
) -> None:
    response = create(client_for(ALICE), **body)
    error = assert_error(response, 400, "invalid_input")
    assert field in error["message"] or field in (error.get("fields") or {}), error
    assert Webhook.objects.count() == 0


def test_local_opt_outs_allow_loopback_http(
    client_for: Callable[..., APIClient], settings: Any
) -> None:
    settings.OMNIGENT_WEBHOOK_ALLOW_HTTP = True
    settings.OMNIGENT_WEBHOOK_ALLOW_PRIVATE = True
    assert create(client_for(ALICE), url="http://127.0.0.1:9/hook").status_code == 201
    settings.OMNIGENT_WEBHOOK_ALLOW_PRIVATE = False
    assert_error(create(client_for(ALICE), url="http://127.0.0.1:9/hook"), 400, "invalid_input")


def test_local_single_user_mode_allows_both(
    client_for: Callable[..., APIClient], settings: Any
) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = True
    assert create(client_for(ALICE), url="http://localhost:9/hook").status_code == 201


def test_patch_delete_and_reenable(client_for: Callable[..., APIClient]) -> None:
    alice = client_for(ALICE)
    webhook_id = create(alice).json()["id"]
    response = alice.patch(
        f"/v1/webhooks/{webhook_id}",
        {"events": ["session.created"], "enabled": False, "description": "x"},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["events"] == ["session.created"]
    assert response.json()["enabled"] is False
    assert_error(
        alice.patch(f"/v1/webhooks/{webhook_id}", {"enabled": "yes"}, format="json"),
        400,
        "invalid_input",
    )
    assert_error(
        alice.patch(
            f"/v1/webhooks/{webhook_id}", {"url": "https://internal.example.com/"}, format="json"
        ),
        400,
        "invalid_input",
    )
    Webhook.objects.filter(pk=webhook_id).update(disabled_reason="gone", consecutive_failures=20)
    body = alice.patch(f"/v1/webhooks/{webhook_id}", {"enabled": True}, format="json").json()
    assert body["enabled"] is True and body["disabled_reason"] is None
    assert Webhook.objects.get(pk=webhook_id).consecutive_failures == 0
    deleted = alice.delete(f"/v1/webhooks/{webhook_id}").json()
    assert deleted == {"id": webhook_id, "object": "webhook.deleted", "deleted": True}
    assert_error(alice.get(f"/v1/webhooks/{webhook_id}"), 404, "not_found")


def test_rotate_secret_keeps_the_old_one_for_a_day(client_for: Callable[..., APIClient]) -> None:
    alice = client_for(ALICE)
    created = create(alice).json()
    response = alice.post(f"/v1/webhooks/{created['id']}/rotate-secret")
    assert response.status_code == 200
    new = response.json()["secret"]
    assert new.startswith("whsec_") and new != created["secret"]
    webhook = Webhook.objects.get(pk=created["id"])
    assert webhook.secret == new and webhook.previous_secret == created["secret"]
    left = webhook.previous_secret_expires_at - timezone.now()
    assert 23.9 * 3600 < left.total_seconds() <= 24 * 3600


def test_test_event_and_deliveries_and_redeliver(client_for: Callable[..., APIClient]) -> None:
    alice = client_for(ALICE)
    webhook_id = create(alice, events=["turn.completed"]).json()["id"]
    response = alice.post(f"/v1/webhooks/{webhook_id}/test")
    assert response.status_code == 202
    event_id = response.json()["event_id"]
    # Sent whatever the filter: the fan-out gives it a delivery row.
    fanout.fan_out(now=timezone.now())
    page = alice.get(f"/v1/webhooks/{webhook_id}/deliveries").json()
    assert page["object"] == "list" and page["has_more"] is False
    [row] = page["data"]
    assert row["event_id"] == event_id and row["type"] == "webhook.test"
    assert row["id"].startswith("whd_")
    assert row["status"] == "pending" and row["attempts"] == 0
    assert set(row) >= {
        "last_status_code",
        "last_error",
        "latency_ms",
        "next_attempt_at",
        "created_at",
    }
    Delivery.objects.filter(pk=row["id"]).update(status="failed", attempts=8, next_attempt_at=None)
    response = alice.post(f"/v1/webhooks/{webhook_id}/deliveries/{row['id']}/redeliver")
    assert response.status_code == 202
    delivery = Delivery.objects.get(pk=row["id"])
    assert delivery.status == "pending" and delivery.extra_attempts == 1
    assert_error(
        alice.post(f"/v1/webhooks/{webhook_id}/deliveries/whd_nope/redeliver"), 404, "not_found"
    )
    assert_error(alice.get(f"/v1/webhooks/{webhook_id}/deliveries?limit=0"), 400, "invalid_input")
