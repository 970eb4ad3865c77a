"""What the webhook end-to-end tests share: the settings that let a loopback receiver
in, creating a webhook, sending ``webhook.test`` events through several servers and
checking that each arrived once, signed; a receiver that holds the first request while
its sender stops, and the check that the event was then sent again."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

from standardwebhooks.webhooks import Webhook as Verifier

from testing.processes import Server, base_env, wait_until
from testing.webhook_receiver import Received, WebhookReceiver

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


class FirstRequestHeld:
    """Makes ``receiver`` hold its first request open until ``release`` (the sender
    stops while it is at the receiver); later requests get 200 at once."""

    def __init__(self, receiver: WebhookReceiver) -> None:
        self.arrived, self.released = threading.Event(), threading.Event()
        receiver.answer = self._answer

    def _answer(self, got: Received) -> int:
        if not self.arrived.is_set():
            self.arrived.set()
            self.released.wait(60)
        return 200

    def wait_arrived(self) -> None:
        assert self.arrived.wait(30), "the first attempt never reached the receiver"

    def release(self) -> None:
        self.released.set()


def assert_sent_again_then_delivered(
    server: Server, receiver: WebhookReceiver, hook: dict, event_id: str
) -> None:
    """The event arrived twice with the same id, signed, and its delivery ends
    ``delivered`` after two attempts."""
    arrived = receiver.wait_for(2, timeout=60)
    assert [json.loads(got.body)["id"] for got in arrived] == [event_id, event_id]
    assert arrived[0].headers["webhook-id"] == arrived[1].headers["webhook-id"]
    for got in arrived:
        Verifier(hook["secret"]).verify(got.body, got.headers)

    def settled() -> list[tuple[str, str, int]]:
        with server.client() as client:
            rows = client.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["data"]
        return [(row["event_id"], row["status"], row["attempts"]) for row in rows]

    wait_until(
        lambda: settled() == [(event_id, "delivered", 2)],
        deadline_s=30,
        what="the delivery to be recorded as delivered after two attempts",
    )
