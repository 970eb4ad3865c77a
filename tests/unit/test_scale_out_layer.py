"""The scale-out channel layer on a real Redis: idle receives and mixed receivers.

Both bugs of the Redis mode are reproduced here at the layer: an idle receive that
timed out on the client after 5 s, and a receiver on a second channel prefix that
starved behind the first. The guard tests pin the library behaviour the fix works
around, so they fail (and say what to revisit) when channels-redis or redis-py change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer
from django.core.exceptions import ImproperlyConfigured
from redis.asyncio.connection import AbstractConnection

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


# --- Fewer round trips: the same messages, keys, capacities and expiries ----------


def _stock_twin(layer: ScaleOutChannelLayer, **options: Any) -> RedisChannelLayer:
    """channels-redis' own layer on ``layer``'s Redis and prefix (another process's)."""
    return RedisChannelLayer(
        hosts=layer.hosts, prefix=layer.prefix, capacity=layer.capacity, **options
    )


@contextlib.contextmanager
def _round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """What the calling task writes to Redis inside the block, one entry per write (a
    round trip; a pipeline is one write). Receives running beside it are not counted."""
    written: list[bytes] = []
    caller = asyncio.current_task()
    original = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        if asyncio.current_task() is caller:
            first = command if isinstance(command, bytes | bytearray | memoryview) else command[0]
            written.append(bytes(first)[:40])
        await original(self, command, check_health)

    with monkeypatch.context() as patch:
        patch.setattr(AbstractConnection, "send_packed_command", counting)
        yield written


async def test_send_is_one_round_trip_and_interoperates_with_the_stock_layer(
    layer: ScaleOutChannelLayer, monkeypatch: pytest.MonkeyPatch
) -> None:
    stock = _stock_twin(layer)
    ours_inbox, stock_inbox = await layer.new_channel(), await stock.new_channel()
    # Connections open and the script loaded before counting.
    await layer.send("warm.up", {"type": "warm"})
    await stock.send("warm.up", {"type": "warm"})
    with _round_trips(monkeypatch) as ours_writes:
        await layer.send(stock_inbox, {"type": "from.ours", "n": 1})
        await layer.send("general.ours", {"type": "general", "n": 2})
    with _round_trips(monkeypatch) as stock_writes:
        await stock.send(ours_inbox, {"type": "from.stock", "n": 3})
        await stock.send("general.stock", {"type": "general", "n": 2})
    assert len(ours_writes) == 2, ours_writes
    assert len(stock_writes) == 8, stock_writes

    async with asyncio.timeout(10):
        assert await stock.receive(stock_inbox) == {"type": "from.ours", "n": 1}
        assert await layer.receive(ours_inbox) == {"type": "from.stock", "n": 3}
        # General channels: the same key layout, message, score and expiry either way.
        assert await stock.receive("general.ours") == {"type": "general", "n": 2}
    connection = layer.connection(0)
    key = (layer.prefix + "general.stock").encode()
    ((member, score),) = await connection.zrange(key, 0, -1, withscores=True)
    assert layer.deserialize(member) == {"type": "general", "n": 2}
    await layer.send("general.stock", {"type": "general", "n": 4})
    stored = await connection.zrange(key, 0, -1, withscores=True)
    assert [layer.deserialize(m) for m, _ in stored] == [
        {"type": "general", "n": 2},
        {"type": "general", "n": 4},
    ]
    assert abs(stored[1][1] - time.time()) < 5 and stored[1][1] >= score
    assert 0 < await connection.ttl(key) <= layer.expiry
    await stock.flush()


async def test_sends_load_their_scripts_again_after_redis_forgets_them(
    layer: ScaleOutChannelLayer,
) -> None:
    """A restarted or failed-over Redis has no scripts: the next send loads its own."""
    member = await layer.new_channel()
    await layer.group_add("after-flush", member)
    await layer.send(member, {"type": "before"})
    await layer.connection(0).script_flush()
    await layer.send(member, {"type": "after"})
    await layer.group_send("after-flush", {"type": "group"})
    async with asyncio.timeout(10):
        assert [await layer.receive(member) for _ in range(3)] == [
            {"type": "before"},
            {"type": "after"},
            {"type": "group"},
        ]


@pytest.mark.parametrize("kind", ["ours", "stock"])
async def test_a_full_channel_refuses_after_expired_messages_are_dropped(
    layer: ScaleOutChannelLayer, kind: str
) -> None:
    """Both layers decide capacity the same way: messages older than the expiry do not
    count, and a send to a full channel raises ``ChannelFull`` and stores nothing."""
    sender = layer if kind == "ours" else _stock_twin(layer)
    sender.capacity = 3
    connection = layer.connection(0)
    key = layer.prefix + "bounded"
    stale = layer.serialize({"type": "stale"})
    await connection.zadd(key, {stale: time.time() - layer.expiry - 10})
    for n in range(3):
        await sender.send("bounded", {"type": "fresh", "n": n})
    with pytest.raises(ChannelFull):
        await sender.send("bounded", {"type": "over"})
    stored = [layer.deserialize(m) for m in await connection.zrange(key, 0, -1)]
    assert stored == [{"type": "fresh", "n": n} for n in range(3)]


async def test_group_send_reads_the_group_once_and_delivers_once_per_host(
    layer: ScaleOutChannelLayer, monkeypatch: pytest.MonkeyPatch
) -> None:
    stock = _stock_twin(layer)
    ours_member, stock_member = await layer.new_channel(), await stock.new_channel()
    await layer.group_add("watchers", ours_member)
    await stock.group_add("watchers", stock_member)
    await layer.group_send("warm-up", {"type": "warm"})
    await layer.group_send("watchers", {"type": "warm"})
    async with asyncio.timeout(10):
        assert await layer.receive(ours_member) == {"type": "warm"}
        assert await stock.receive(stock_member) == {"type": "warm"}

    with _round_trips(monkeypatch) as ours_writes:
        await layer.group_send("watchers", {"type": "event", "seq": 1})
        await layer.group_send("nobody", {"type": "event", "seq": 1})
    with _round_trips(monkeypatch) as stock_writes:
        await stock.group_send("watchers", {"type": "event", "seq": 2})
        await stock.group_send("nobody", {"type": "event", "seq": 2})
    assert len(ours_writes) == 2 + 1, ours_writes
    assert len(stock_writes) == 4 + 2, stock_writes

    async with asyncio.timeout(10):
        for seq in (1, 2):
            assert await layer.receive(ours_member) == {"type": "event", "seq": seq}
            assert await stock.receive(stock_member) == {"type": "event", "seq": seq}
    await stock.flush()


async def test_group_send_skips_a_full_member_and_drops_members_that_did_not_renew(
    layer: ScaleOutChannelLayer, caplog: pytest.LogCaptureFixture
) -> None:
    full, other = "member.full", "member.other"
    layer.capacity = 2
    for channel in (full, other):
        await layer.group_add("crowd", channel)
    for n in range(2):
        await layer.send(full, {"type": "backlog", "n": n})
    connection = layer.connection(0)
    group_key = layer._group_key("crowd")
    await connection.zadd(group_key, {"member.gone": time.time() - layer.group_expiry - 10})

    with caplog.at_level(logging.INFO, logger="omnigent_site.runtime.channel_layer"):
        await layer.group_send("crowd", {"type": "event"})
    assert "1 of 2 channels over capacity in group crowd" in caplog.text
    async with asyncio.timeout(10):
        assert await layer.receive(other) == {"type": "event"}
        assert [await layer.receive(full) for _ in range(2)] == [
            {"type": "backlog", "n": 0},
            {"type": "backlog", "n": 1},
        ]
    assert await connection.zrange(group_key, 0, -1) == [b"member.full", b"member.other"]
    assert await connection.zcard(layer.prefix + "member.gone") == 0


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
    # Only the eventual delivery is checked: the starved receive may sit out a whole
    # blocking pop of the layer (5 s) and, on a loaded machine, another (a full suite
    # beside it once took longer than 10 s).
    async with asyncio.timeout(30):
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


async def _sweep(
    layer: ScaleOutChannelLayer, keeper: str, holding: asyncio.Task[Any]
) -> asyncio.Task[Any]:
    """Complete the receive that holds the lock (it sweeps when due) and start the next.

    It is completed with a message, not cancelled: a holder cancelled while its
    ``BZPOPMIN`` still blocks in Redis loses a message that Redis hands it before the
    closed connection reaches Redis, a window of the stock layer's that a message sent
    straight after the cancel can fall into."""
    await layer.send(keeper, {"type": "tick"})
    async with asyncio.timeout(5):
        assert (await holding)["type"] == "tick"
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

    clock.now = 61.0
    holding = await _sweep(layer, keeper, holding)
    assert not set(late) & set(layer.receive_buffer)
    assert busy in layer.receive_buffer and fresh in layer.receive_buffer
    async with asyncio.timeout(5):
        assert (await layer.receive(busy))["type"] == "second"

    clock.now = 122.0
    holding = await _sweep(layer, keeper, holding)
    assert fresh not in layer.receive_buffer
    holding.cancel()
    assert set(layer._last_receive) <= {keeper, busy}
