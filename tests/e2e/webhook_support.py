"""What the webhook end-to-end tests share: the settings that let a loopback receiver
in, creating a webhook, and sending ``webhook.test`` events through several servers
and checking that each arrived once, signed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from standardwebhooks.webhooks import Webhook as Verifier

from testing.processes import Server, base_env
from testing.webhook_receiver import WebhookReceiver

LOCAL_RECEIVERS = {"OMNIGENT_WEBHOOK_ALLOW_HTTP": "1", "OMNIGENT_WEBHOOK_ALLOW_PRIVATE": "1"}


def create_webhook(server: Server, url: str, events: list[str]) -> dict:
    with server.client() as client:
        response = client.post("/v1/webhooks", json={"url": url, "events": events})
    assert response.status_code == 201, response.text
    return dict(response.json())


def scale_out_env(tmp_path: Path, postgres_url: str, redis_url: str, **extra: str) -> dict:
    """Server processes sharing one PostgreSQL database and one Redis prefix."""
    return base_env(
        DATABASE_URL=postgres_url,
        REDIS_URL=redis_url,
        OMNIGENT_CHANNEL_PREFIX=f"omnigent-e2e-{Path(tmp_path).name}",
        OMNIGENT_DATA_DIR=str(tmp_path / "data"),
        **LOCAL_RECEIVERS,
        **extra,
    )


def send_tests(servers: list[Server], hook_id: str, count: int) -> list[str]:
    """``count`` test events written through the servers in turn; their event ids."""
    sent = []
    clients = [server.client() for server in servers]
    try:
        for number in range(count):
            response = clients[number % len(clients)].post(f"/v1/webhooks/{hook_id}/test")
            assert response.status_code == 202, response.text
            sent.append(response.json()["event_id"])
    finally:
        for client in clients:
            client.close()
    return sent


def assert_each_arrived_once(
    receiver: WebhookReceiver, sent: list[str], secret: str, *, timeout: float
) -> None:
    receiver.wait_for(len(sent), timeout=timeout)
    arrived = Counter(json.loads(got.body)["id"] for got in receiver.requests)
    assert set(arrived) == set(sent)
    assert [event for event, count in arrived.items() if count > 1] == []
    for got in receiver.requests:
        Verifier(secret).verify(got.body, got.headers)
