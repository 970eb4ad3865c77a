"""The embedded channel layer: same behaviour as Channels' in-memory layer, cheaper sweeps."""

from __future__ import annotations

import pytest

from omnigent_site.runtime.channel_layer import (
    EmbeddedChannelLayer,
    ScaleOutChannelLayer,
    group_may_have_members,
)

pytestmark = pytest.mark.timeout(30)


async def test_group_fan_out_and_receive() -> None:
    layer = EmbeddedChannelLayer()
    first, second = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("session.x", first)
    await layer.group_add("session.x", second)
    await layer.group_send("session.x", {"type": "session.events", "events": [[1, "f"]]})
    assert (await layer.receive(first))["events"] == [[1, "f"]]
    assert (await layer.receive(second))["events"] == [[1, "f"]]


async def test_expired_messages_are_still_swept_but_not_on_every_receive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = EmbeddedChannelLayer(expiry=60)
    sweeps = 0
    original = EmbeddedChannelLayer.__mro__[1]._clean_expired

    def counting(self: EmbeddedChannelLayer) -> None:
        nonlocal sweeps
        sweeps += 1
        original(self)

    monkeypatch.setattr(EmbeddedChannelLayer.__mro__[1], "_clean_expired", counting)
    channel = await layer.new_channel()
    for index in range(50):
        await layer.send(channel, {"type": "m", "n": index})
        await layer.receive(channel)
    assert sweeps == 1

    # A message past its expiry is dropped by the next sweep.
    stale = await layer.new_channel()
    await layer.send(stale, {"type": "old"})
    queue = layer.channels[stale]
    expires, message = queue._queue[0]
    queue._queue[0] = (expires - 3600, message)
    layer._next_sweep = 0.0
    fresh = await layer.new_channel()
    await layer.send(fresh, {"type": "new"})
    assert (await layer.receive(fresh))["type"] == "new"
    assert stale not in layer.channels


async def test_a_group_may_have_members_only_while_someone_is_in_it() -> None:
    """The embedded layer answers from its own groups; a shared (Redis) layer cannot
    know about other processes' members and always says yes."""
    layer = EmbeddedChannelLayer()
    assert not group_may_have_members(layer, "session.x")
    channel = await layer.new_channel()
    await layer.group_add("session.x", channel)
    assert group_may_have_members(layer, "session.x")
    assert not group_may_have_members(layer, "session.y")
    await layer.group_discard("session.x", channel)
    assert not group_may_have_members(layer, "session.x")
    shared = ScaleOutChannelLayer(hosts=[{"address": "redis://127.0.0.1:1/0?socket_timeout=10"}])
    assert group_may_have_members(shared, "session.x")  # no connection is made for this
