"""The project's channel layers: the embedded one (one process) and the scale-out one
(Redis), both with one receive prefix per process.

**One receive prefix.** channels-redis serves every ``receive()`` of a process through
one lock: whoever holds it waits (``BZPOPMIN``) on the Redis key of *its own* channel
prefix and hands what arrives to the local waiters. A waiter on another prefix is not
woken until something arrives on the holder's prefix, so a stream channel created with
``new_channel("stream.")`` could wait forever behind a consumer's ``new_channel()``.
With a single prefix every message of the process lands on the one key the holder
waits on, and nobody starves. Both layers therefore refuse any prefix but the default,
so a new call site that passes one fails in the first test instead of starving in
production.

**Timeouts.** The Redis layer blocks ``BZPOPMIN`` for ``brpop_timeout`` (5 s) on the
server side. redis-py's default socket timeout is also 5 s, so an idle channel's read
times out on the client before Redis answers and the receive raises
``redis.exceptions.TimeoutError``: a tunnel with no traffic for 5 s closed with 1011.
The scale-out layer refuses a socket timeout that is not longer than the block, and the
settings give it one (``OMNIGENT_REDIS_SOCKET_TIMEOUT_S``) that still bounds a read on a
dead connection.

**Orphaned buffers.** The process that holds the receive lock moves each message it
pops into a local buffer for the message's channel. A message for a channel nobody
waits on any more (a runner's reply after the relay's deadline, a group event that
reached a stream after it closed) created a buffer that nothing ever read: one entry
per late message, for the life of the process. The scale-out layer drops a buffer that
has had no receiver for a whole expiry period, the same 60 s after which Redis drops a
message that was never received.

**Embedded sweeps.** The stock ``InMemoryChannelLayer`` sweeps every channel and every
group for expired entries on *every* ``receive``. With one channel per stream
subscriber and per waiting request, a busy session's fan-out then costs
O(subscribers²) per event; profiling the stream benchmark showed a third of the
server's time there. Sweeping at most once a second keeps the same expiry rules (an
expired message lives at most a second longer) at a constant cost per message.

**Round trips.** channels-redis' ``send`` makes four round trips to Redis
(``ZREMRANGEBYSCORE``, ``ZCOUNT``, ``ZADD``, ``EXPIRE``), and its ``group_send`` two to
read the group and two more per Redis host to deliver (a pipeline of
``ZREMRANGEBYSCORE`` and the capacity script). Each round trip costs the sender tens of
microseconds of CPU on a small machine, mostly the socket write, and a pollers' turn
made about thirty of them. The scale-out layer runs the same commands as Lua scripts,
by their SHA: ``send`` in one round trip, ``group_send`` in one to read the group and
one per host to deliver (none when the group is empty). A script runs atomically, so
no other sender can come between the capacity check and the add, as it could with the
stock ``send``. Keys, messages, scores, expiries and capacities are the stock layer's,
so processes of either kind can share one Redis (``tests/unit/test_scale_out_layer.py``
compares them).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlsplit

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from django.core.exceptions import ImproperlyConfigured
from redis.commands.core import AsyncScript

log = logging.getLogger(__name__)

# The prefix of every channel a process receives on (Channels' own default).
RECEIVE_PREFIX = "specific"

# ``RedisChannelLayer.send`` in one round trip: drop the expired messages, refuse when
# the channel is at capacity (returns 1), add the message and renew the key's expiry.
# KEYS: the channel's key. ARGV: the oldest score kept, the capacity, the score, the
# message, the expiry in seconds.
SEND_SCRIPT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
if redis.call('ZCOUNT', KEYS[1], '-inf', '+inf') >= tonumber(ARGV[2]) then
    return 1
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 0
"""

# The first half of ``RedisChannelLayer.group_send`` in one round trip: drop the members
# that did not renew in time and return the others. KEYS: the group's key. ARGV: the
# oldest score kept.
GROUP_MEMBERS_SCRIPT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# The second half, for the channel keys on one host: the stock pipeline's clean-up of
# expired messages and its capacity script, together. KEYS: n channel keys. ARGV: their
# n messages, their n capacities, the score, the expiry in seconds, the oldest score
# kept. Returns how many channels were at capacity.
GROUP_DELIVER_SCRIPT = """
local n = #KEYS
local score = ARGV[2 * n + 1]
local expiry = ARGV[2 * n + 2]
local stale = ARGV[2 * n + 3]
local over_capacity = 0
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, stale)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[n + i]) then
        redis.call('ZADD', KEYS[i], score, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


def _check_prefix(prefix: str) -> None:
    if prefix.rstrip(".") != RECEIVE_PREFIX:
        raise ValueError(
            f"new_channel({prefix!r}): this project receives on one channel prefix per "
            "process; with channels-redis a second prefix starves behind the first "
            "(call new_channel() without a prefix)"
        )


class EmbeddedChannelLayer(InMemoryChannelLayer):
    sweep_interval_s = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_sweep = 0.0

    async def new_channel(self, prefix: str = RECEIVE_PREFIX) -> str:
        _check_prefix(prefix)
        return await super().new_channel(prefix=RECEIVE_PREFIX)

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.sweep_interval_s
        super()._clean_expired()


def group_may_have_members(layer: Any, group: str) -> bool:
    """Whether a message sent to ``group`` now could reach anyone; callable from any thread.

    With the embedded layer, only if the group has a member in this (the only) process:
    a writer's thread that finds none is spared its trip to the event loop to send to
    nobody (``sessions.eventlog.send_all``). A member that joins just after still gets
    what was written before, as every group's members do (``sessions.sse.GroupFeed``
    joins before it reads the log). With any other layer (Redis: members in other
    processes) always yes.
    """
    if isinstance(layer, EmbeddedChannelLayer):
        return bool(layer.groups.get(group))
    return True


def _socket_timeout(host: dict[str, Any]) -> float | None:
    """The read timeout a host entry gives its connections (a URL's query wins, as in
    redis-py's ``from_url``); redis-py's default when neither sets one."""
    query = parse_qs(urlsplit(str(host.get("address", ""))).query)
    if "socket_timeout" in query:
        return float(query["socket_timeout"][-1])
    if "socket_timeout" in host:
        value = host["socket_timeout"]
        return None if value is None else float(value)
    from redis.asyncio.connection import Connection

    default = Connection().socket_timeout
    return None if default is None else float(default)


class ScaleOutChannelLayer(RedisChannelLayer):
    """channels-redis' layer with one receive prefix, a socket timeout that outlasts the
    blocking receive, no buffers left behind for channels nobody receives on, and
    ``send`` and ``group_send`` in fewer round trips."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._receivers: Counter[str] = Counter()
        self._last_receive: dict[str, float] = {}
        self._never_received: set[str] = set()
        self._clock = time.monotonic  # replaced by tests
        self._next_buffer_sweep = self._clock() + self.expiry
        for host in self.hosts:
            timeout = _socket_timeout(host)
            if timeout is not None and timeout <= self.brpop_timeout:
                raise ImproperlyConfigured(
                    f"Redis socket_timeout {timeout:g} s must be longer than the channel "
                    f"layer's blocking receive ({self.brpop_timeout:g} s), or an idle "
                    "receive times out; set OMNIGENT_REDIS_SOCKET_TIMEOUT_S higher"
                )
        self._scripts: dict[str, AsyncScript] = {}

    async def new_channel(self, prefix: str = RECEIVE_PREFIX) -> str:
        _check_prefix(prefix)
        return await super().new_channel(prefix=RECEIVE_PREFIX)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """The stock ``send`` (same key, connection, score, expiry and capacity) in one
        round trip instead of four; raises ``ChannelFull`` as it does."""
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        stored_name = channel
        if "!" in channel:
            # A process-local channel: stored under its non-local part, with the full
            # name in the message for the receiving process.
            message = {**message, "__asgi_channel__": channel}
            stored_name = self.non_local_name(channel)
            index = self.consistent_hash(channel)
        else:
            index = next(self._send_index_generator)
        now = time.time()
        full = await self._run(
            SEND_SCRIPT,
            index,
            keys=[self.prefix + stored_name],
            args=[
                int(now) - int(self.expiry),
                self.get_capacity(channel),
                now,
                self.serialize(message),
                int(self.expiry),
            ],
        )
        if full:
            raise ChannelFull()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """The stock ``group_send`` (same members, messages, capacities and expiries) in
        one round trip to read the group and one per host to deliver."""
        assert self.require_valid_group_name(group), "Group name not valid"
        now = time.time()
        members = await self._run(
            GROUP_MEMBERS_SCRIPT,
            self.consistent_hash(group),
            keys=[self._group_key(group)],
            args=[int(now) - self.group_expiry],
        )
        channel_names = [member.decode("utf8") for member in members]
        if not channel_names:
            return
        by_host, messages, capacities = self._map_channel_keys_to_connection(channel_names, message)
        for index, keys in by_host.items():
            over_capacity = await self._run(
                GROUP_DELIVER_SCRIPT,
                index,
                keys=keys,
                args=[
                    *(messages[key] for key in keys),
                    *(capacities[key] for key in keys),
                    now,
                    self.expiry,
                    int(now) - int(self.expiry),
                ],
            )
            if over_capacity:
                log.info(
                    "%s of %s channels over capacity in group %s",
                    over_capacity,
                    len(channel_names),
                    group,
                )

    async def _run(self, script: str, index: int, *, keys: list[Any], args: list[Any]) -> Any:
        """Run ``script`` by its SHA on host ``index``'s connection (loaded on first use)."""
        connection = self.connection(index)
        registered = self._scripts.get(script)
        if registered is None:
            registered = self._scripts[script] = connection.register_script(script)
        return await registered(keys=keys, args=args, client=connection)

    async def receive(self, channel: str) -> dict[str, Any]:
        self._receivers[channel] += 1
        self._last_receive[channel] = self._clock()
        try:
            return await super().receive(channel)
        finally:
            self._receivers[channel] -= 1
            if not self._receivers[channel]:
                del self._receivers[channel]
            self._last_receive[channel] = self._clock()
            self._drop_orphaned_buffers()

    def _drop_orphaned_buffers(self) -> None:
        """Once per expiry period, drop the buffers of channels with no receive for a
        whole period (a consumer between two receives is busy for far less), and of
        channels never received on that were already buffered at the last sweep. Runs
        without an await, so no receive can start or buffer a message in between; a
        receive that starts later gets a new buffer."""
        now = self._clock()
        if now < self._next_buffer_sweep:
            return
        self._next_buffer_sweep = now + self.expiry
        stale = now - self.expiry
        never_received: set[str] = set()
        for channel in list(self.receive_buffer):
            if channel in self._receivers:
                continue
            last = self._last_receive.get(channel)
            if last is None:
                never_received.add(channel)
                if channel not in self._never_received:
                    continue
            elif last > stale:
                continue
            del self.receive_buffer[channel]
        self._never_received = never_received - self._never_received
        for channel, last in list(self._last_receive.items()):
            if last <= stale and channel not in self._receivers:
                del self._last_receive[channel]
