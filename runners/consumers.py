"""The runner tunnel: one WebSocket per runner (tunnel.md).

The consumer authenticates the handshake, records itself on the Runner row
(channel name and connection generation), forwards commands that any server
process sends to its channel, relays the runner's answers to the waiting caller,
and stores runner events exactly once before acknowledging them.

Every frame is built and parsed by ``omnigent_runner.protocol``; what a failure turns
into (a close code, a failed command) is decided in ``runners.tunnel_errors``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import deque
from collections.abc import Iterable
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from omnigent_runner.json_text import FRAME_DEPTH_MARGIN
from omnigent_runner.protocol import (
    ANSWER_TYPES,
    EVENT_BATCHES,
    Ack,
    AnyCommand,
    ApprovalVerdict,
    EventAck,
    EventAcks,
    EventBatch,
    EventFrame,
    Frame,
    Hello,
    Nack,
    Ping,
    Pong,
    ProtocolError,
    RpcResult,
    SessionCursor,
    SessionOpen,
    TunnelCommand,
    TunnelReplaced,
    TunnelReply,
    TurnStart,
    Welcome,
    decode_channel_message,
    decode_runner_frame,
    encode,
    frame_type,
    with_id,
)
from omnigent_site import metrics, observability
from omnigent_site.runtime.running_gate import run_ahead_of_requests
from omnigent_site.runtime.shutdown import stopping
from sessions import approvals

from . import liveness, runner_events, services
from .relay import notify
from .tunnel_errors import (
    CLOSE_BAD_HELLO,
    CLOSE_DEAD_PEER,
    CLOSE_REPLACED,
    CLOSE_REVOKED,
    CLOSE_SERVER_STOPPING,
    TunnelClosed,
    close_code_for,
    nack_error,
    reply_error_for,
)
from .upkeep import sweep_stale_runners

log = logging.getLogger(__name__)

TOKEN_HEADER = b"x-omnigent-runner-tunnel-token"

# At most this many events per trip to the database thread: the writer keeps the SQLite
# write lock for its whole batch (runtime/write_priority.py), so this bounds how long
# requests wait for it (500 made streams under a burst wait up to twice as long).
EVENT_BATCH = 100
# How long a closing tunnel may take to store the events it already received.
EVENT_DRAIN_TIMEOUT_S = 10.0


class TunnelConsumer(AsyncWebsocketConsumer):
    runner_id: str
    generation: int = 0
    closing: bool = False

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch, without its ``close_old_connections`` before each message.

        That call is a trip to the sync thread for every frame and every relayed
        command, on the relay's hot path. It is not needed here: this consumer
        reaches the database only through ``database_sync_to_async``, which closes
        stale connections before and after each call.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    # --- handshake ------------------------------------------------------------------

    async def connect(self) -> None:
        self.runner_id = self.scope["url_route"]["kwargs"]["runner_id"]
        # This connection's task (and the tasks it starts) log with the runner's id.
        observability.runner_id_var.set(self.runner_id)
        self.generation = 0
        self.hello_seen = False
        # Set by the hello: the runner reads ``event.acks`` (docs/protocol.md).
        self.batched_acks = False
        self.closing = False
        self.last_frame = time.monotonic()
        self.last_seen_write = self.last_frame  # the hello writes ``last_seen_at``
        self.pending: dict[str, tuple[str | None, AnyCommand]] = {}
        self.command_counter = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.event_backlog: deque[runner_events.ReceivedEvent] = deque()
        # When each backlog event arrived (for ``omnigent_runner_event_lag_seconds``).
        self.event_arrivals: deque[float] = deque()
        # ``turn.start`` commands the runner acknowledged, marked on their turns by the
        # event writer's next round (no trip to the database of their own).
        self.acked_starts: list[tuple[str, str]] = []
        self.counted_connected = False
        self.event_writer: asyncio.Task[None] | None = None
        if stopping().is_set():
            # A tunnel held by a process on its way out would read online after it.
            # Accepted and closed as a restart (not refused: a 403 tells the runner
            # its token is bad), so the runner comes back at once, through the proxy
            # to another process.
            await self.accept()
            await self.close(code=CLOSE_SERVER_STOPPING)
            return
        headers = dict(self.scope.get("headers") or [])
        client = self.scope.get("client") or (None, None)
        try:
            # Strict: with "replace", other bytes could spell a token's U+FFFD.
            token = headers.get(TOKEN_HEADER, b"").decode("utf-8")
        except UnicodeDecodeError:
            log.warning(
                "refused tunnel for %s from %s: token is not UTF-8", self.runner_id, client[0]
            )
            await self.close()
            return
        auth = await database_sync_to_async(services.authorize_tunnel)(
            path_runner_id=self.runner_id, token=token, peer_host=client[0]
        )
        if auth.runner is None:
            log.warning("refused tunnel for %s from %s: %s", self.runner_id, client[0], auth.reason)
            await self.close()
            return
        await self.accept()
        self.tasks.append(asyncio.create_task(self._expect_hello()))

    async def _expect_hello(self) -> None:
        await asyncio.sleep(settings.OMNIGENT_HELLO_TIMEOUT_S)
        if not self.hello_seen and not self.closing:
            log.warning("tunnel %s sent no hello in time", self.runner_id)
            await self._close(CLOSE_BAD_HELLO)

    async def _refuse_hello(self, exc: Exception) -> None:
        """End a tunnel whose handshake failed, with the code ``tunnel_errors`` assigns."""
        log.warning("tunnel %s: handshake refused: %s", self.runner_id, exc)
        await self._close(close_code_for(exc))

    async def _hello(self, frame: Frame) -> None:
        if self.hello_seen:
            return  # frames racing the welcome; the runner waits for it before sending more
        self.hello_seen = True
        if not isinstance(frame, Hello):
            log.warning(
                "tunnel %s: first frame was %s, not hello", self.runner_id, frame_type(frame)
            )
            await self._close(CLOSE_BAD_HELLO)
            return
        open_ids = set(frame.open_sessions)
        self.batched_acks = frame.capabilities.get(EVENT_BATCHES) is True
        connection = await database_sync_to_async(services.mark_connected)(
            runner_id=self.runner_id,
            channel_name=self.channel_name,
            runner_version=frame.runner_version,
            workspace=frame.workspace,
            process_id=liveness.PROCESS_ID,
            max_turns=frame.max_turns,
        )
        self.generation = connection.generation
        _live_tunnels.add(self)
        liveness.hold(
            channel_name=self.channel_name, runner_id=self.runner_id, generation=self.generation
        )
        if connection.replaced_channel:
            await notify(channel_name=connection.replaced_channel, message=TunnelReplaced())
        resumes = await database_sync_to_async(services.sessions_to_resume)(
            runner_id=self.runner_id, open_sessions=open_ids
        )
        await self._send(
            Welcome(
                runner_id=self.runner_id,
                heartbeat_s=settings.OMNIGENT_HEARTBEAT_S,
                sessions=[
                    SessionCursor(session_id=r.session_id, last_acked_seq=r.last_acked_seq)
                    for r in resumes
                ],
                event_batches=True,
            )
        )
        log.info("runner %s online (generation %s)", self.runner_id, self.generation)
        metrics.runner_connected()
        self.counted_connected = True
        opened: set[str] = set()
        unacked = 0
        for resume in resumes:
            if resume.session_id in open_ids:
                await database_sync_to_async(runner_events.mark_session_opened)(
                    session_id=resume.session_id, generation=self.generation
                )
                # Verdicts given while the tunnel was down (no session.open carries them).
                for verdict in resume.verdict_commands:
                    await self._forward(verdict, reply_channel=None)
                # Turns whose turn.start the runner never acknowledged (lost with a
                # closing tunnel): sent again; a runner that has one ignores the copy.
                for command in resume.turn_commands:
                    await self._forward(command, reply_channel=None)
                unacked += len(resume.turn_commands)
                continue
            if resume.open_command is None:
                continue  # could not be opened (logged); its turns were failed
            await self._forward(resume.open_command, reply_channel=None)
            opened.add(resume.session_id)
            for command in resume.turn_commands:
                await self._forward(command, reply_channel=None)
        if unacked:
            log.info(
                "runner %s: sent again %d turn.start it never acknowledged", self.runner_id, unacked
            )
        # Turns that waited for this runner (a server restart keeps them) start now, in
        # the slots the ones resumed above left.
        await database_sync_to_async(runner_events.start_waiting_turns)(opened=opened)
        self.tasks.append(asyncio.create_task(self._heartbeat()))

    async def _heartbeat(self) -> None:
        interval = settings.OMNIGENT_HEARTBEAT_S
        while not self.closing:
            await asyncio.sleep(interval)
            if time.monotonic() - self.last_frame > 3 * interval:
                log.warning("tunnel %s: no frame for %.0f s, closing", self.runner_id, 3 * interval)
                await self._close(CLOSE_DEAD_PEER)
                return
            await self._send(Ping(ts=time.time()))
            if self.acked_starts:
                # Acks no event carried yet (a turn queued behind a quiet one on the
                # runner): marked now, or the resend sweep would send them again.
                self._wake_event_writer()
            await sweep_stale_runners()

    # --- frames from the runner ---------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closing:
            return
        self.last_frame = time.monotonic()
        if text_data is None:
            log.warning("tunnel %s: ignored a binary message", self.runner_id)
            return
        try:
            frame = decode_runner_frame(
                text_data, max_depth=settings.OMNIGENT_MAX_JSON_DEPTH + FRAME_DEPTH_MARGIN
            )
        except ProtocolError as exc:
            await self._bad_frame(exc)
            return
        if not self.generation:
            try:
                await self._hello(frame)
            except Exception as exc:
                log.exception("tunnel %s: the handshake failed", self.runner_id)
                await self._refuse_hello(exc)
            return
        await self._touch()
        if type(frame) is EventFrame:
            self._store_events((frame,))
        elif type(frame) is EventBatch:
            self._store_events(frame.events)
        elif isinstance(frame, Ack | Nack | RpcResult):
            await self._answer(frame)
        elif type(frame) is not Pong:
            log.warning("tunnel %s: ignored a %s frame", self.runner_id, frame_type(frame))

    async def _bad_frame(self, exc: ProtocolError) -> None:
        """The one handling of a frame that is not a valid frame (docs/protocol.md).

        Before ``hello`` it ends the tunnel (4001, or 4002 for another protocol version).
        After it, the frame is logged and ignored, except an answer whose id names a
        command in flight: that command fails at once (``invalid_reply``) instead of
        leaving its caller to the deadline.
        """
        if not self.generation:
            await self._refuse_hello(exc)
            return
        await self._touch()
        log.warning("tunnel %s: ignored an invalid frame: %s", self.runner_id, exc)
        if exc.frame_type in ANSWER_TYPES and isinstance(exc.frame_id, str):
            entry = self.pending.pop(exc.frame_id, None)
            if entry is not None and entry[0]:
                await notify(
                    channel_name=entry[0],
                    message=TunnelReply(ok=False, error=reply_error_for(exc)),
                )

    async def _touch(self) -> None:
        # Every frame comes here: the due check reads the clock ``receive`` just read.
        if services.seen_is_due(self.last_seen_write, self.last_frame):
            self.last_seen_write = self.last_frame
            await database_sync_to_async(services.mark_seen)(
                runner_id=self.runner_id, generation=self.generation
            )

    def _store_events(self, frames: Iterable[EventFrame]) -> None:
        # Stored by one writer task, in arrival order; events that arrive while it is
        # busy, or together in one ``events`` frame, are stored (and shown to
        # watchers) together in its next round.
        before = len(self.event_backlog)
        self.event_backlog.extend((frame.session_id, frame.seq, frame.event) for frame in frames)
        if not self.event_backlog:
            return
        arrived = time.monotonic()
        self.event_arrivals.extend(arrived for _ in range(len(self.event_backlog) - before))
        self._wake_event_writer()

    def _wake_event_writer(self) -> None:
        if self.event_writer is None or self.event_writer.done():
            self.event_writer = asyncio.create_task(self._write_events())

    async def _write_events(self) -> None:
        try:
            # Runs on after the socket closed too, until what arrived is stored
            # (``disconnect`` waits for it); only the acks stop.
            while self.event_backlog or self.acked_starts:
                batch = [
                    self.event_backlog.popleft()
                    for _ in range(min(len(self.event_backlog), EVENT_BATCH))
                ]
                oldest = self.event_arrivals[0] if self.event_arrivals else time.monotonic()
                for _ in range(min(len(batch), len(self.event_arrivals))):
                    self.event_arrivals.popleft()
                started, self.acked_starts = self.acked_starts, []
                acks = await run_ahead_of_requests(
                    services.record_runner_events,
                    runner_id=self.runner_id,
                    events=batch,
                    acked_starts=started,
                )
                if batch:
                    metrics.runner_events_stored(oldest_wait_s=time.monotonic() - oldest)
                await self._acknowledge(acks)
        except Exception as exc:
            # Nothing unacknowledged is lost: the runner resends it after reconnecting.
            log.exception("tunnel %s: storing runner events failed", self.runner_id)
            await self._close(close_code_for(exc))

    async def _acknowledge(self, acks: dict[str, int]) -> None:
        """One ``event.ack`` per session, or all of them in one ``event.acks`` frame
        for a runner that reads it."""
        if self.batched_acks and len(acks) > 1:
            await self._send(
                EventAcks(acks=[EventAck(session_id=s, seq=seq) for s, seq in acks.items()])
            )
            return
        for session_id, seq in acks.items():
            await self._send(EventAck(session_id=session_id, seq=seq))

    async def _finish_event_writer(self) -> None:
        """Store the events that arrived before the socket closed, within a deadline.

        They are in memory already: storing them spares the runner resending
        them, and its next ``welcome`` reports them acknowledged. If storing takes
        too long, the writer is cancelled and the runner resends what was not
        acknowledged, as after any other loss.
        """
        writer = self.event_writer
        if writer is None or writer.done():
            return
        try:
            async with asyncio.timeout(EVENT_DRAIN_TIMEOUT_S):
                await writer
        except TimeoutError:
            log.warning(
                "tunnel %s: %d received events left to the runner's resend",
                self.runner_id,
                len(self.event_backlog),
            )

    async def _answer(self, frame: Ack | Nack | RpcResult) -> None:
        command_id = frame.id
        entry = self.pending.pop(command_id, None) if isinstance(command_id, str) else None
        if entry is None:
            log.info("tunnel %s: answer for unknown command %r", self.runner_id, command_id)
            return
        reply_channel, command = entry
        if isinstance(frame, Ack):
            reply = TunnelReply(ok=True)
        elif isinstance(frame, RpcResult) and frame.ok:
            reply = TunnelReply(ok=True, result=frame.result)
        else:
            error = nack_error(frame.error)
            log.info(
                "tunnel %s: %s %s rejected: %s: %s",
                self.runner_id,
                frame_type(command),
                command_id,
                error.code,
                error.message,
            )
            status = frame.status if isinstance(frame, RpcResult) else None
            reply = TunnelReply(ok=False, error=error, status=status)
            if type(command) is TurnStart and not reply_channel:
                # Sent fire and forget (a turn that waited for a slot, or one sent again
                # by the resend sweep): nobody waits to fail it, and sent again it would
                # only be refused again. It fails visibly, as a refused message does.
                await database_sync_to_async(runner_events.fail_turn)(
                    session_id=command.session_id,
                    response_id=command.response_id,
                    code="runner_unreachable",
                    message=f"the runner did not accept the turn: {error.message}",
                )
        if reply.ok and type(command) is TurnStart:
            # Marked by the event writer's next round, with the events that follow (the
            # turn's ``response.created``, which marks it anyway, or the running turn's),
            # or when the tunnel closes: no trip to the database on the relay's path. A
            # mark lost with the process only costs the runner a copy of the command,
            # which it ignores.
            self.acked_starts.append((command.session_id, command.response_id))
        if reply.ok and type(command) is SessionOpen:
            await database_sync_to_async(runner_events.mark_session_opened)(
                session_id=command.session_id, generation=self.generation
            )
        if reply.ok and (verdicts := acknowledged_verdicts(command)):
            # Stored verdicts stop riding along with session.open once the runner has them.
            await database_sync_to_async(approvals.mark_acked)(approval_ids=verdicts)
        if reply_channel:
            await notify(channel_name=reply_channel, message=reply)

    # --- messages from other server processes ---------------------------------------

    async def tunnel_command(self, message: dict[str, Any]) -> None:
        try:
            relayed = decode_channel_message(message)
        except ProtocolError as exc:
            log.error("tunnel %s: dropped an unreadable tunnel.command: %s", self.runner_id, exc)
            return
        if not isinstance(relayed, TunnelCommand):
            log.error("tunnel %s: %s is not a tunnel.command", self.runner_id, frame_type(relayed))
            return
        reply_channel = relayed.reply_channel
        try:
            if not self.generation or self.closing:
                raise TunnelClosed("the tunnel is closing")
            await self._forward(relayed.command, reply_channel=reply_channel)
        except Exception as exc:
            if not isinstance(exc, TunnelClosed):
                log.exception("tunnel %s: could not forward a command", self.runner_id)
            if reply_channel:
                await notify(
                    channel_name=reply_channel,
                    message=TunnelReply(ok=False, error=reply_error_for(exc)),
                )

    async def tunnel_replaced(self, message: dict[str, Any]) -> None:
        log.info(
            "tunnel %s generation %s replaced by a newer connection",
            self.runner_id,
            self.generation,
        )
        await self._close(CLOSE_REPLACED)

    async def tunnel_revoked(self, message: dict[str, Any]) -> None:
        log.info("runner %s revoked: closing its tunnel", self.runner_id)
        await self._close(CLOSE_REVOKED)

    # --- plumbing -------------------------------------------------------------------

    async def _forward(self, command: AnyCommand, *, reply_channel: str | None) -> None:
        self.command_counter += 1
        command_id = f"cmd-{self.generation}-{self.command_counter}"
        text = encode(with_id(command, command_id))
        self.pending[command_id] = (reply_channel, command)
        if not self.closing:
            await self.send(text_data=text)

    async def _send(self, frame: Frame) -> None:
        if not self.closing:
            await self.send(text_data=encode(frame))

    async def _close(self, code: int) -> None:
        if self.closing:
            return
        self.closing = True
        await self.close(code=code)

    async def leave_for_restart(self) -> None:
        """This process is stopping: the commands waiting on this tunnel fail at once
        (their callers wait for the runner on its next tunnel and send them there), and
        the tunnel closes with 4005 so the runner reconnects to another process now,
        not when the connections are cut after the drain. Then the ``turn.start`` acks
        it holds are marked at once (``disconnect`` comes only after the drain), so the
        runner's next ``hello`` is not sent those turns again."""
        if self.closing:
            return
        self.closing = True
        await self._fail_pending()
        await self.close(code=CLOSE_SERVER_STOPPING)
        started, self.acked_starts = self.acked_starts, []
        if started:
            try:
                await database_sync_to_async(runner_events.mark_starts_acked)(starts=started)
            except Exception:
                # Only costs the runner copies of those commands, which it ignores.
                log.warning("tunnel %s: could not mark acknowledged turn.starts", self.runner_id)

    async def _fail_pending(self) -> None:
        pending, self.pending = self.pending, {}
        closed = TunnelReply(
            ok=False,
            error=reply_error_for(TunnelClosed("the tunnel closed before the runner answered")),
        )
        for reply_channel, _command in pending.values():
            if reply_channel:
                await notify(channel_name=reply_channel, message=closed)

    async def disconnect(self, code: int) -> None:
        _live_tunnels.discard(self)
        self.closing = True
        if getattr(self, "counted_connected", False):
            self.counted_connected = False
            metrics.runner_disconnected()
        for task in self.tasks:
            task.cancel()
        if self.acked_starts:
            self._wake_event_writer()  # no event came after them to carry them
        await self._finish_event_writer()
        await self._fail_pending()
        if not self.generation:
            return
        liveness.let_go(channel_name=self.channel_name)
        current = await database_sync_to_async(services.mark_disconnected)(
            runner_id=self.runner_id, generation=self.generation
        )
        if current:
            log.info("runner %s offline (code %s)", self.runner_id, code)
            asyncio.get_running_loop().create_task(
                fail_after_grace(runner_id=self.runner_id, generation=self.generation)
            )


# The tunnels this process holds (past their hello), for ``close_tunnels_for_restart``.
_live_tunnels: weakref.WeakSet[TunnelConsumer] = weakref.WeakSet()


async def close_tunnels_for_restart() -> None:
    """``on_stop``: every tunnel this process holds closes as a restart (4005).

    A stop hook runs in a task of its own, so it goes on after daphne has cancelled the
    consumers' own tasks; their connections stay open until the drain ends."""
    tunnels = list(_live_tunnels)
    results = await asyncio.gather(
        *(tunnel.leave_for_restart() for tunnel in tunnels), return_exceptions=True
    )
    for tunnel, result in zip(tunnels, results, strict=True):
        if isinstance(result, BaseException):
            log.warning(
                "tunnel %s: could not close it for the restart: %r", tunnel.runner_id, result
            )
    if tunnels:
        log.info("stopping: %d runner tunnels closed for a restart", len(tunnels))


def acknowledged_verdicts(command: AnyCommand) -> list[str]:
    """The approvals whose verdicts ``command`` carried (none for most commands)."""
    if type(command) is ApprovalVerdict:
        return [command.elicitation_id]
    if type(command) is SessionOpen:
        return [verdict.elicitation_id for verdict in command.verdicts]
    return []


async def fail_after_grace(*, runner_id: str, generation: int) -> None:
    """Fail the runner's busy sessions only if it has not come back within the grace."""
    await asyncio.sleep(settings.OMNIGENT_RECONNECT_GRACE_S)
    try:
        failed = await database_sync_to_async(services.fail_sessions_after_grace)(
            runner_id=runner_id, generation=generation
        )
    except Exception:
        log.exception("could not fail the sessions of runner %s", runner_id)
        return
    if failed:
        log.warning("runner %s did not come back: failed %s", runner_id, ", ".join(failed))
