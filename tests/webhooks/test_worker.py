"""The worker loop of a server process: woken by the outbox's commit, not by its poll."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async

from omnigent_site.users import get_or_create_user
from testing.webhook_receiver import WebhookReceiver as Receiver
from tests.api.conftest import ALICE
from webhooks import delivery, services
from webhooks.models import Delivery

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


async def test_an_event_is_sent_at_once_after_its_commit(
    local_receivers_allowed: None, receiver: Receiver
) -> None:
    hook = await sync_to_async(services.create_webhook)(
        owner=await sync_to_async(get_or_create_user)(ALICE), url=receiver.url, events=["*"]
    )
    worker = delivery.Worker()
    task = asyncio.create_task(delivery.serve(worker, poll_s=30.0))
    try:
        started = time.monotonic()
        await sync_to_async(services.send_test)(webhook=hook)
        await asyncio.to_thread(receiver.wait_for, 1, timeout=10)
        assert time.monotonic() - started < 5, "woken by the commit, not the 30 s poll"
        await worker.drain(deadline_s=5)
        row = await Delivery.objects.aget(webhook=hook)
        assert row.status == "delivered" and row.attempts == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
