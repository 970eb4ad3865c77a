"""Delivery to a real receiver on loopback (automation.md, Signed, Delivered at least
once, SSRF): signatures checked with the ``standardwebhooks`` library, the retry schedule
on an injected clock, 410 and 20 failures disabling, the access check at send time."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook as Verifier

from omnigent_site.users import get_or_create_user
from testing.webhook_receiver import WebhookReceiver as Receiver
from tests.api.conftest import ALICE, BOB
from webhook_outbox.events import enqueue_webhook_event
from webhook_outbox.models import WebhookEvent
from webhooks import delivery, fanout, services
from webhooks.delivery import Claimed, Outcome, Sender, claim_due, record_outcome
from webhooks.models import Delivery, DeliveryAttempt, Webhook

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]

DELAYS = [5.0, 30.0, 120.0, 600.0, 3600.0, 21600.0, 86400.0]


async def _send_all(claimed: list[Claimed], now: datetime) -> list[Outcome]:
    sender = Sender()
    try:
        return list(await asyncio.gather(*(sender.send(one, now=now) for one in claimed)))
    finally:
        await sender.aclose()


def deliver_round(now: datetime, *, rng: random.Random | None = None) -> list[Delivery | None]:
    """One worker round, by hand: fan out, claim, send, record."""
    fanout.fan_out(now=now)
    claimed = claim_due(now=now, limit=100)
    outcomes = asyncio.run(_send_all(claimed, now))
    return [
        record_outcome(claimed=one, outcome=outcome, now=now, rng=rng or random.Random(1))
        for one, outcome in zip(claimed, outcomes, strict=True)
    ]


@pytest.fixture
def hook(local_receivers_allowed: None, receiver: Receiver) -> Webhook:
    return services.create_webhook(owner=get_or_create_user(ALICE), url=receiver.url, events=["*"])


def test_a_session_event_arrives_signed(
    hook: Webhook, receiver: Receiver, create_session: Callable[..., str]
) -> None:
    session_id = create_session(ALICE)
    [row] = deliver_round(timezone.now())
    assert row is not None and row.status == "delivered" and row.last_status_code == 200
    [got] = receiver.wait_for(1)
    body = Verifier(hook.secret).verify(got.body, got.headers)
    assert body["type"] == "session.created" and body["id"].startswith("evt_")
    assert body["data"]["session_id"] == session_id and isinstance(body["created_at"], int)
    assert got.headers["webhook-id"] == body["id"] and got.path == "/hook"
    assert got.headers["content-type"] == "application/json"
    assert DeliveryAttempt.objects.get(delivery=row).status_code == 200


def test_retries_on_the_schedule_with_jitter_then_fail(
    hook: Webhook, receiver: Receiver, settings: Any
) -> None:
    settings.OMNIGENT_WEBHOOK_DISABLE_AFTER = 2
    receiver.status = 500
    services.send_test(webhook=hook)
    now = timezone.now()
    for attempt, delay in enumerate(DELAYS, start=1):
        [row] = deliver_round(now)
        assert row is not None and row.status == "pending" and row.attempts == attempt
        assert row.last_status_code == 500 and "500" in row.last_error
        wait = (row.next_attempt_at - now).total_seconds()
        assert delay * 0.9 <= wait <= delay * 1.1, (attempt, wait)
        # Not due a moment before its time.
        assert claim_due(now=row.next_attempt_at - timedelta(seconds=0.5), limit=10) == []
        now = row.next_attempt_at
    [row] = deliver_round(now)
    assert row is not None and row.status == "failed" and row.attempts == 8
    assert len(receiver.wait_for(8)) == 8
    # Every attempt carried the same webhook-id (the event's id).
    assert len({got.headers["webhook-id"] for got in receiver.requests}) == 1
    hook.refresh_from_db()
    assert hook.consecutive_failures == 1 and hook.enabled
    # A second failed event in a row reaches this test's limit of 2: disabled.
    settings.OMNIGENT_WEBHOOK_RETRY_S = [1.0]
    services.send_test(webhook=hook)
    deliver_round(now)
    deliver_round(now + timedelta(seconds=2))
    hook.refresh_from_db()
    assert not hook.enabled and "2 events in a row" in hook.disabled_reason


def test_a_success_resets_the_failure_count(hook: Webhook, receiver: Receiver) -> None:
    Webhook.objects.filter(pk=hook.pk).update(consecutive_failures=19)
    services.send_test(webhook=hook)
    deliver_round(timezone.now())
    hook.refresh_from_db()
    assert hook.consecutive_failures == 0


def test_gone_disables_the_webhook(hook: Webhook, receiver: Receiver) -> None:
    receiver.status = 410
    services.send_test(webhook=hook)
    [row] = deliver_round(timezone.now())
    assert row is not None and row.status == "failed"
    hook.refresh_from_db()
    assert not hook.enabled and "410" in hook.disabled_reason
    # A disabled webhook's events wait: nothing is claimed for it.
    services.send_test(webhook=hook)
    assert deliver_round(timezone.now()) == []


def test_redirects_are_not_followed(hook: Webhook, receiver: Receiver) -> None:
    receiver.status = 307
    services.send_test(webhook=hook)
    [row] = deliver_round(timezone.now())
    assert row is not None and row.status == "pending" and row.last_status_code == 307
    assert len(receiver.requests) == 1


def test_a_slow_receiver_times_out(hook: Webhook, receiver: Receiver, settings: Any) -> None:
    settings.OMNIGENT_WEBHOOK_TIMEOUT_S = 0.5
    answered = threading.Event()

    def slow(got: object) -> int:
        answered.wait(5)  # until the test ends: longer than the timeout
        return 200

    receiver.answer = slow
    services.send_test(webhook=hook)
    try:
        [row] = deliver_round(timezone.now())
    finally:
        answered.set()
    assert row is not None and row.status == "pending" and row.last_status_code is None
    assert row.last_error == "timed out after 0.5 s"


def test_an_answer_is_read_up_to_64_kib(local_receivers_allowed: None) -> None:
    """A receiver answering 16 MiB: the attempt counts (2xx) and the sender closes the
    connection after 64 KiB instead of reading the rest."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sent_all: list[bool] = []

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += connection.recv(65536)
            size = 16 * 1024 * 1024
            try:
                connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
                connection.sendall(b"x" * size)
                sent_all.append(True)
            except OSError:
                sent_all.append(False)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        hook = services.create_webhook(
            owner=get_or_create_user(ALICE), url=f"http://127.0.0.1:{port}/", events=["*"]
        )
        services.send_test(webhook=hook)
        [row] = deliver_round(timezone.now())
        thread.join(timeout=10)
    finally:
        listener.close()
    assert row is not None and row.status == "delivered" and row.last_status_code == 200
    assert sent_all == [False], "the sender read the whole answer"


def test_rotation_signs_with_both_secrets(hook: Webhook, receiver: Receiver) -> None:
    old = hook.secret
    new = services.rotate_secret(webhook=hook)
    services.send_test(webhook=hook)
    deliver_round(timezone.now())
    [got] = receiver.wait_for(1)
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        assert Verifier(secret).verify(got.body, got.headers)["type"] == "webhook.test"
    # After the overlap only the new secret signs.
    Webhook.objects.filter(pk=hook.pk).update(
        previous_secret_expires_at=timezone.now() - timedelta(seconds=1)
    )
    services.send_test(webhook=hook)
    deliver_round(timezone.now())
    latest = receiver.wait_for(2)[-1]
    assert len(latest.headers["webhook-signature"].split(" ")) == 1
    Verifier(new).verify(latest.body, latest.headers)


def test_a_revoked_grant_stops_deliveries(
    local_receivers_allowed: None,
    receiver: Receiver,
    create_session: Callable[..., str],
    grant: Callable[..., None],
    client_for: Callable[..., APIClient],
) -> None:
    session_id = create_session(ALICE)
    fanout.fan_out(now=timezone.now())  # session.created: before Bob's webhook
    bobs = services.create_webhook(
        owner=get_or_create_user(BOB), url=receiver.url, events=["approval.requested", "*"]
    )
    grant(session_id, BOB, 1)
    # Fanned out while Bob can read the session...
    enqueue_webhook_event(
        type="turn.completed", data={"session_id": session_id}, session_id=session_id
    )
    fanout.fan_out(now=timezone.now())
    assert Delivery.objects.filter(webhook=bobs).count() == 1
    # ...and revoked before it is sent: not sent, failed with the reason.
    assert (
        client_for(ALICE).delete(f"/v1/sessions/{session_id}/permissions/{BOB}").status_code == 204
    )
    assert deliver_round(timezone.now()) == []
    row = Delivery.objects.get(webhook=bobs)
    assert row.status == "failed" and row.last_error == delivery.NO_ACCESS
    assert receiver.requests == []
    # Later events of the session are no longer his at all.
    enqueue_webhook_event(
        type="turn.completed", data={"session_id": session_id}, session_id=session_id
    )
    fanout.fan_out(now=timezone.now())
    assert Delivery.objects.filter(webhook=bobs).count() == 1


def test_the_address_is_checked_again_at_send_time(
    hook: Webhook, receiver: Receiver, settings: Any
) -> None:
    settings.OMNIGENT_WEBHOOK_ALLOW_PRIVATE = False
    services.send_test(webhook=hook)
    [row] = deliver_round(timezone.now())
    assert row is not None and row.status == "pending" and row.last_status_code is None
    assert "private" in row.last_error
    assert receiver.requests == []


def test_the_connection_goes_to_the_checked_address(
    local_receivers_allowed: None, receiver: Receiver, fake_dns: dict[str, list[str]]
) -> None:
    """The host name is resolved once; the request goes to that address with the name in
    the Host header."""
    port = receiver.url.split(":")[2].split("/")[0]
    fake_dns["receiver.example.com"] = ["127.0.0.1"]
    hook = services.create_webhook(
        owner=get_or_create_user(ALICE),
        url=f"http://receiver.example.com:{port}/in?x=1",
        events=["*"],
    )
    services.send_test(webhook=hook)
    [row] = deliver_round(timezone.now())
    assert row is not None and row.status == "delivered"
    [got] = receiver.wait_for(1)
    assert got.headers["host"] == f"receiver.example.com:{port}" and got.path == "/in?x=1"


def test_a_killed_attempt_is_retried_after_its_claim_expires(
    hook: Webhook, receiver: Receiver
) -> None:
    services.send_test(webhook=hook)
    now = timezone.now()
    fanout.fan_out(now=now)
    [first] = claim_due(now=now, limit=10)
    # The process dies here: no outcome is recorded. Nobody else takes the row meanwhile.
    assert claim_due(now=now + timedelta(seconds=5), limit=10) == []
    later = now + delivery.claim_lease() + timedelta(seconds=1)
    [row] = deliver_round(later)
    assert row is not None and row.status == "delivered" and row.attempts == 2
    # The dead attempt's late outcome is not recorded over the new one.
    late = Outcome(200, "", 5, now)
    assert record_outcome(claimed=first, outcome=late, now=later, rng=random.Random(1)) is None
    [got] = receiver.wait_for(1)
    assert json.loads(got.body)["id"] == first.event_id


def test_redeliver_adds_an_attempt_with_the_same_id(hook: Webhook, receiver: Receiver) -> None:
    services.send_test(webhook=hook)
    [row] = deliver_round(timezone.now())
    assert row is not None and row.status == "delivered"
    services.redeliver(delivery=row)
    [again] = deliver_round(timezone.now())
    assert again is not None and again.status == "delivered" and again.attempts == 2
    first, second = receiver.wait_for(2)
    assert first.headers["webhook-id"] == second.headers["webhook-id"]


@pytest.fixture
def tls_receiver(tmp_path: Any) -> Any:
    """An HTTPS receiver whose certificate names ``receiver.example.com`` only."""
    import ssl
    import subprocess

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=receiver.example.com",
         "-addext", "subjectAltName=DNS:receiver.example.com"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    trusted = ssl.create_default_context(cafile=str(cert))
    with Receiver(tls=server_side) as running:
        yield running, trusted


def test_tls_is_checked_against_the_host_name_not_the_address(
    local_receivers_allowed: None, tls_receiver: Any, fake_dns: dict[str, list[str]]
) -> None:
    """The attempt connects to the checked address, and TLS (SNI and the certificate
    check) uses the URL's host name: the right name passes, another name on the same
    address fails."""
    receiver, trusted = tls_receiver
    fake_dns["receiver.example.com"] = ["127.0.0.1"]
    fake_dns["impostor.example.com"] = ["127.0.0.1"]
    owner = get_or_create_user(ALICE)
    good = services.create_webhook(
        owner=owner, url=f"https://receiver.example.com:{receiver.port}/hook", events=["*"]
    )
    bad = services.create_webhook(
        owner=owner, url=f"https://impostor.example.com:{receiver.port}/hook", events=["*"]
    )
    services.send_test(webhook=good)
    services.send_test(webhook=bad)
    now = timezone.now()
    fanout.fan_out(now=now)
    claimed = claim_due(now=now, limit=10)

    async def send_all() -> list[Outcome]:
        sender = Sender(verify=trusted)
        try:
            return [await sender.send(one, now=now) for one in claimed]
        finally:
            await sender.aclose()

    outcomes = {
        one.webhook_id: outcome
        for one, outcome in zip(claimed, asyncio.run(send_all()), strict=True)
    }
    assert outcomes[good.id].status_code == 200
    assert outcomes[bad.id].status_code is None
    assert "certificate" in outcomes[bad.id].error.lower(), outcomes[bad.id].error
    [got] = receiver.wait_for(1)
    assert got.headers["host"] == f"receiver.example.com:{receiver.port}"


def test_finished_deliveries_are_pruned_after_the_retention(
    hook: Webhook, receiver: Receiver
) -> None:
    services.send_test(webhook=hook)
    services.send_test(webhook=hook)
    [done, _] = deliver_round(timezone.now())
    assert done is not None
    Delivery.objects.exclude(pk=done.pk).update(status="pending", next_attempt_at=None)
    later = timezone.now() + timedelta(days=8)
    assert delivery.prune(now=later) == 2  # the delivery and its attempt
    assert list(Delivery.objects.values_list("status", flat=True)) == ["pending"]
    assert WebhookEvent.objects.count() == 1


def test_outcomes_are_recorded_together(hook: Webhook, receiver: Receiver) -> None:
    receiver.answer = lambda got: 500 if len(receiver.requests) == 0 else 200
    for _ in range(3):
        services.send_test(webhook=hook)
    now = timezone.now()
    fanout.fan_out(now=now)
    claimed = claim_due(now=now, limit=10)
    outcomes = [asyncio.run(_send_all([one], now))[0] for one in claimed]
    rows = delivery.record_outcomes(
        list(zip(claimed, outcomes, strict=True)), now=now, rng=random.Random(1)
    )
    assert [row.status for row in rows if row] == ["pending", "delivered", "delivered"]
    assert DeliveryAttempt.objects.count() == 3
    # Recording the same attempts again changes nothing (each outcome is stored once).
    again = delivery.record_outcomes(
        list(zip(claimed, outcomes, strict=True)), now=now, rng=random.Random(1)
    )
    assert again == [None, None, None]
