"""The Webhooks page in a real browser against a real daphne and a loopback receiver:
add a webhook (the secret shown once), send a test, see the delivery, redeliver it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook as Verifier

from testing.processes import Server
from testing.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ALICE = "alice@example.com"


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


def test_add_a_webhook_send_a_test_and_redeliver(
    browser: Any, launch_server: Callable[..., Server], receiver: WebhookReceiver
) -> None:
    server = launch_server(OMNIGENT_WEBHOOK_ALLOW_HTTP="1", OMNIGENT_WEBHOOK_ALLOW_PRIVATE="1")
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, extra_http_headers={"X-Forwarded-Email": ALICE}
    )
    page = context.new_page()
    page.goto(f"{server.url}/webhooks")
    assert page.get_attribute("nav a[href='/webhooks']", "aria-current") == "page"
    page.fill("#webhook-url", receiver.url)
    page.fill("#webhook-description", "ci notifier")
    page.check("#webhook-events input[value='turn.completed']")
    page.check("#webhook-events input[value='approval.requested']")
    page.click("#webhook-form button[type=submit]")
    page.wait_for_selector("#webhook-created:not([hidden])")
    secret = page.inner_text("#webhook-secret")
    assert secret.startswith("whsec_")
    row = page.wait_for_selector("#webhook-rows tr")
    assert "turn.completed, approval.requested" in row.inner_text()
    assert "enabled" in row.inner_text()

    page.click("#webhook-rows button:has-text('Send test')")
    [first] = receiver.wait_for(1, timeout=20)
    assert Verifier(secret).verify(first.body, first.headers)["type"] == "webhook.test"
    # The outcome is stored shortly after the receiver answers: the list may still show
    # the attempt pending, so it is opened again until it shows the outcome.
    deadline = time.monotonic() + 20
    while True:
        page.click("#webhook-rows button:has-text('Deliveries')")
        page.wait_for_selector("#delivery-rows tr")
        if page.query_selector("#delivery-rows tr[data-status='delivered']"):
            break
        assert time.monotonic() < deadline, page.inner_text("#delivery-rows")
        page.wait_for_timeout(200)
    assert "HTTP 200" in page.inner_text("#delivery-rows tr")

    page.click("#delivery-rows button:has-text('Redeliver')")
    second = receiver.wait_for(2, timeout=20)[1]
    assert second.headers["webhook-id"] == first.headers["webhook-id"]

    page.click("#webhook-rows button:has-text('Disable')")
    page.wait_for_selector("#webhook-rows tr:has-text('disabled')")
    context.close()
