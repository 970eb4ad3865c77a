"""The scale-out channel layer on a real Redis: idle receives and mixed receivers.

Both bugs of the Redis mode are reproduced here at the layer: an idle receive that
timed out on the client after 5 s, and a receiver on a second channel prefix that
starved behind the first. The guard tests pin the library behaviour the fix works
around, so they fail (and say what to revisit) when channels-redis or redis-py change.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels_redis.core import RedisChannelLayer
from django.core.exceptions import ImproperlyConfigured

from omnigent_site import settings as project_settings
from omnigent_site.runtime.channel_layer import EmbeddedChannelLayer, ScaleOutChannelLayer
from tests.conftest import require_service

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

REDIS_URL = "redis://127.0.0.1:6379/13"
# Longer than redis-py's 5 s default socket timeout and the layer's 5 s block.
IDLE_S = 7.0


@pytest.fixture
async def layer() -> AsyncIterator[ScaleOutChannelLayer]:
    """The layer exactly as settings configure it for ``REDIS_URL``, on a private prefix."""
    require_service("Redis", "127.0.0.1", 6379)
    config = project_settings.scale_out_channel_layer(REDIS_URL)
    assert config["BACKEND"] == "omnigent_site.runtime.channel_layer.ScaleOutChannelLayer"
    options = {**config["CONFIG"], "prefix": f"omnigent-test-{secrets.token_hex(4)}"}
    built = ScaleOutChannelLayer(**options)
    try:
        yield built
    finally:
        await built.flush()


async def _send_later(layer: RedisChannelLayer, channel: str, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    await layer.send(channel, {"type": "late", "after_s": delay_s})


async def test_a_receive_idle_longer_than_every_redis_timeout_still_gets_its_message(
    layer: ScaleOutChannelLayer,
) -> None:
    channel = await layer.new_channel()
    sender = asyncio.ensure_future(_send_later(layer, channel, IDLE_S))
    async with asyncio.timeout(IDLE_S + 10):
        message = await layer.receive(channel)
    await sender
    assert message == {"type": "late", "after_s": IDLE_S}


async def test_receivers_on_many_channels_of_one_process_do_not_starve(
    layer: ScaleOutChannelLayer,
) -> None:
    """A tunnel consumer, a stream and a relay reply wait at once; each message
    reaches its own waiter however the receive lock is held."""
    consumer, stream, relay = [await layer.new_channel() for _ in range(3)]
    waiting = {
        name: asyncio.ensure_future(layer.receive(channel))
        for name, channel in (("consumer", consumer), ("stream", stream), ("relay", relay))
    }
    await asyncio.sleep(0.2)  # the consumer's receive now holds the lock and blocks in Redis
    async with asyncio.timeout(5):
        await layer.send(stream, {"type": "to.stream"})
        assert (await waiting["stream"])["type"] == "to.stream"
        await layer.send(relay, {"type": "to.relay"})
        assert (await waiting["relay"])["type"] == "to.relay"
        await layer.send(consumer, {"type": "to.consumer"})
        assert (await waiting["consumer"])["type"] == "to.consumer"


async def test_a_second_receive_prefix_is_refused(layer: ScaleOutChannelLayer) -> None:
    with pytest.raises(ValueError, match="one channel prefix"):
        await layer.new_channel("stream.")
    assert (await layer.new_channel("specific")).startswith("specific.")


async def test_the_embedded_layer_refuses_a_second_prefix_too() -> None:
    layer = EmbeddedChannelLayer()
    with pytest.raises(ValueError, match="one channel prefix"):
        await layer.new_channel("relay.")
    assert (await layer.new_channel()).startswith("specific.")


def test_a_socket_timeout_not_longer_than_the_blocking_receive_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="socket_timeout 5 s"):
        ScaleOutChannelLayer(hosts=[{"address": REDIS_URL, "socket_timeout": 5}])
    with pytest.raises(ImproperlyConfigured, match="socket_timeout 2 s"):
        ScaleOutChannelLayer(
            hosts=[{"address": f"{REDIS_URL}?socket_timeout=2", "socket_timeout": 30}]
        )
    ScaleOutChannelLayer(hosts=[{"address": REDIS_URL, "socket_timeout": None}])


def test_settings_read_the_redis_timeouts_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMNIGENT_REDIS_SOCKET_TIMEOUT_S", "31")
    monkeypatch.setenv("OMNIGENT_REDIS_CONNECT_TIMEOUT_S", "2.5")
    (host,) = project_settings.scale_out_channel_layer(REDIS_URL)["CONFIG"]["hosts"]
    assert host["socket_timeout"] == 31.0
    assert host["socket_connect_timeout"] == 2.5
    monkeypatch.setenv("OMNIGENT_REDIS_SOCKET_TIMEOUT_S", "4")
    config = project_settings.scale_out_channel_layer(REDIS_URL)["CONFIG"]
    with pytest.raises(ImproperlyConfigured):
        ScaleOutChannelLayer(**config)


# --- Guards: the library behaviour the layer works around --------------------------


def test_guard_redis_default_socket_timeout_still_equals_the_blocking_receive() -> None:
    """If this fails, redis-py or channels-redis changed the timeouts the settings
    compensate for: re-check docs/deployment.md ("Channel layer") and the pin."""
    with pytest.raises(ImproperlyConfigured):
        ScaleOutChannelLayer(hosts=[REDIS_URL])
    assert RedisChannelLayer.brpop_timeout == 5


async def test_guard_stock_layer_still_starves_a_second_prefix() -> None:
    """The reason for one receive prefix. If this fails, channels-redis now wakes
    every prefix's waiters; the prefix rule may then be relaxed."""
    require_service("Redis", "127.0.0.1", 6379)
    stock = RedisChannelLayer(
        hosts=[{"address": REDIS_URL, "socket_timeout": 15}],
        prefix=f"omnigent-test-{secrets.token_hex(4)}",
    )
    first = await stock.new_channel()
    second = await stock.new_channel("stream.")
    holder = asyncio.ensure_future(stock.receive(first))
    await asyncio.sleep(0.2)
    starved = asyncio.ensure_future(stock.receive(second))
    await stock.send(second, {"type": "stuck"})
    done, _ = await asyncio.wait({starved}, timeout=2.0)
    assert not done, "channels-redis delivered across prefixes: revisit the prefix rule"
    await stock.send(first, {"type": "unblock"})
    async with asyncio.timeout(10):
        assert (await holder)["type"] == "unblock"
        assert (await starved)["type"] == "stuck"
    await stock.flush()


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _buffered(layer: ScaleOutChannelLayer, channel: str) -> None:
    """Wait until the lock holder has moved a message for ``channel`` into its buffer."""
    async with asyncio.timeout(5):
        while channel not in layer.receive_buffer:  # noqa: ASYNC110 - the library has no event for it
            await asyncio.sleep(0.01)


async def _sweep(layer: ScaleOutChannelLayer, keeper: str) -> asyncio.Task[Any]:
    """Complete one receive (which sweeps when due) and start the next one."""
    await layer.send(keeper, {"type": "tick"})
    async with asyncio.timeout(5):
        assert (await layer.receive(keeper))["type"] == "tick"
    return asyncio.ensure_future(layer.receive(keeper))


async def test_buffers_of_channels_nobody_receives_on_are_dropped_after_an_expiry(
    layer: ScaleOutChannelLayer,
) -> None:
    clock = FakeClock()
    layer._clock = clock
    layer._next_buffer_sweep = layer.expiry
    keeper = await layer.new_channel()
    holding = asyncio.ensure_future(layer.receive(keeper))  # holds the receive lock

    # Replies that reach their relay after its deadline: one buffer each, never read.
    late = []
    for index in range(5):
        reply = await layer.new_channel()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await layer.receive(reply)
        await layer.send(reply, {"type": "late", "n": index})
        await _buffered(layer, reply)
        late.append(reply)

    # A consumer busy between two receives, with a message waiting for it.
    busy = await layer.new_channel()
    clock.now = 50.0
    await layer.send(busy, {"type": "first"})
    async with asyncio.timeout(5):
        assert (await layer.receive(busy))["type"] == "first"
    await layer.send(busy, {"type": "second"})
    await _buffered(layer, busy)
    # A message for a channel that was never received on yet.
    fresh = await layer.new_channel()
    await layer.send(fresh, {"type": "early"})
    await _buffered(layer, fresh)

    holding.cancel()
    clock.now = 61.0
    holding = await _sweep(layer, keeper)
    assert not set(late) & set(layer.receive_buffer)
    assert busy in layer.receive_buffer and fresh in layer.receive_buffer
    async with asyncio.timeout(5):
        assert (await layer.receive(busy))["type"] == "second"

    holding.cancel()
    clock.now = 122.0
    holding = await _sweep(layer, keeper)
    assert fresh not in layer.receive_buffer
    holding.cancel()
    assert set(layer._last_receive) <= {keeper, busy}
