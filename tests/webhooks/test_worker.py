"""The worker loop: woken by the outbox's commit, not by its poll; with
``OMNIGENT_WEBHOOK_DELIVERY=worker``, woken through the channel layer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.core.management import CommandError, call_command

from omnigent_site.users import get_or_create_user
from testing.webhook_receiver import WebhookReceiver as Receiver
from tests.api.conftest import ALICE
from webhooks import delivery, services, wakeup
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


# --- OMNIGENT_WEBHOOK_DELIVERY=worker ------------------------------------------------------


async def test_in_worker_mode_a_server_wakes_the_worker_and_sends_nothing(
    local_receivers_allowed: None, receiver: Receiver, settings: Any
) -> None:
    """The server side (``deliver_forever``) only relays; the worker side delivers,
    woken through the channel layer (one process here: the embedded layer)."""
    settings.OMNIGENT_WEBHOOK_DELIVERY = "worker"
    hook = await sync_to_async(services.create_webhook)(
        owner=await sync_to_async(get_or_create_user)(ALICE), url=receiver.url, events=["*"]
    )
    server_side = asyncio.create_task(delivery.deliver_forever())
    worker = delivery.Worker()
    # ``deliver_as_worker`` in another process; with the embedded layer of this one,
    # its parts by hand (it would only poll, the layer reaching no other process).
    listener = asyncio.create_task(wakeup.listen(get_channel_layer(), worker.wake_soon))
    worker_side = asyncio.create_task(delivery.serve(worker, poll_s=30.0))
    try:
        await _until(lambda: delivery._relay is not None and bool(get_channel_layer().groups))
        assert delivery._worker is worker, "the server side started no worker of its own"
        # The worker's first round has passed; from now on only a wake-up sends at once.
        started = time.monotonic()
        await sync_to_async(services.send_test)(webhook=hook)
        await asyncio.to_thread(receiver.wait_for, 1, timeout=10)
        assert time.monotonic() - started < 5, "woken through the layer, not the 30 s poll"
        assert delivery._relay is not None and delivery._relay.sent >= 1
    finally:
        for task in (server_side, listener, worker_side):
            task.cancel()
        await asyncio.gather(server_side, listener, worker_side, return_exceptions=True)
    assert delivery._relay is None and delivery._worker is None
    assert not get_channel_layer().groups.get(wakeup.GROUP), "the worker left the group"


async def test_the_relay_sends_one_wake_up_for_the_commits_of_its_wait() -> None:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(wakeup.GROUP, channel)
    relay = wakeup.Relay(layer, after_s=0.05)
    running = asyncio.create_task(relay.run())
    try:
        for _ in range(10):
            relay.wake_soon()
        assert await asyncio.wait_for(layer.receive(channel), 10) == wakeup.WAKE
        assert relay.sent == 1
        relay.wake_soon()
        assert await asyncio.wait_for(layer.receive(channel), 10) == wakeup.WAKE
        assert relay.sent == 2
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await layer.group_discard(wakeup.GROUP, channel)


async def test_the_relay_sends_nothing_while_no_worker_listens() -> None:
    relay = wakeup.Relay(get_channel_layer(), after_s=0.01)
    running = asyncio.create_task(relay.run())
    try:
        relay.wake_soon()
        await _until(lambda: not relay.pending.is_set())
        assert relay.sent == 0
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_listener_wakes_on_wake_ups_only() -> None:
    layer = get_channel_layer()
    woken = asyncio.Event()
    calls: list[None] = []

    def on_wake() -> None:
        calls.append(None)
        woken.set()

    listening = asyncio.create_task(wakeup.listen(layer, on_wake))
    try:
        await _until(lambda: bool(layer.groups.get(wakeup.GROUP)))
        await layer.group_send(wakeup.GROUP, {"type": "something.else"})
        await layer.group_send(wakeup.GROUP, dict(wakeup.WAKE))
        await asyncio.wait_for(woken.wait(), 10)
        assert len(calls) == 1
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
    assert not layer.groups.get(wakeup.GROUP)


async def test_a_worker_on_the_embedded_layer_only_polls(
    local_receivers_allowed: None, receiver: Receiver
) -> None:
    hook = await sync_to_async(services.create_webhook)(
        owner=await sync_to_async(get_or_create_user)(ALICE), url=receiver.url, events=["*"]
    )
    await sync_to_async(services.send_test)(webhook=hook)
    task = asyncio.create_task(delivery.deliver_as_worker(delivery.Worker(), poll_s=30.0))
    try:
        await asyncio.to_thread(receiver.wait_for, 1, timeout=10)
        assert not get_channel_layer().groups.get(wakeup.GROUP), "nobody to hear it"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class FlakyLayer:
    """A channel layer whose first receive fails, as while Redis restarts, and whose
    ``group_discard`` never answers, as when it is gone."""

    def __init__(self) -> None:
        self.receives = 0
        self.joined: list[str] = []

    async def new_channel(self) -> str:
        return "worker!1"

    async def group_add(self, group: str, channel: str) -> None:
        self.joined.append(group)

    async def group_discard(self, group: str, channel: str) -> None:
        await asyncio.Event().wait()

    async def receive(self, channel: str) -> dict[str, str]:
        self.receives += 1
        if self.receives == 1:
            raise ConnectionError("Redis is restarting")
        if self.receives == 2:
            return dict(wakeup.WAKE)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_listener_survives_a_failed_receive_and_stops_within_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wakeup, "RETRY_S", 0.01)
    monkeypatch.setattr(wakeup, "LEAVE_DEADLINE_S", 0.05)
    layer, woken = FlakyLayer(), asyncio.Event()
    listening = asyncio.create_task(wakeup.listen(layer, woken.set))
    await asyncio.wait_for(woken.wait(), 10)
    assert layer.joined == [wakeup.GROUP] and layer.receives >= 2
    listening.cancel()
    # The group_discard that never answers is given up after its deadline.
    done, _ = await asyncio.wait({listening}, timeout=10)
    assert done == {listening}


def test_the_worker_command_refuses_an_unknown_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIGENT_EVENT_LOOP", "twisted")
    with pytest.raises(CommandError, match="OMNIGENT_EVENT_LOOP must be one of"):
        call_command("deliverwebhooks")


async def _until(check: Callable[[], bool], deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)
