"""The runner tunnel: one WebSocket per runner (tunnel.md).

The consumer authenticates the handshake, records itself on the Runner row
(channel name and connection generation), forwards commands that any server
process sends to its channel, relays the runner's answers to the waiting caller,
and stores runner events exactly once before acknowledging them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from omnigent_runner import PROTOCOL_VERSION

from . import runner_events, services
from .relay import notify
from .upkeep import sweep_stale_runners

log = logging.getLogger(__name__)

TOKEN_HEADER = b"x-omnigent-runner-tunnel-token"

CLOSE_REPLACED = 4000
CLOSE_BAD_HELLO = 4001
CLOSE_BAD_PROTOCOL = 4002
CLOSE_DEAD_PEER = 4003
CLOSE_REVOKED = 4004
CLOSE_SERVER_ERROR = 1011
EVENT_BATCH = 500
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
        self.generation = 0
        self.hello_seen = False
        self.closing = False
        self.last_frame = time.monotonic()
        self.last_seen_write = timezone.now()
        self.pending: dict[str, tuple[str | None, dict[str, Any]]] = {}
        self.command_counter = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.event_backlog: deque[tuple[str, int, dict[str, Any]]] = deque()
        self.event_writer: asyncio.Task[None] | None = None
        headers = dict(self.scope.get("headers") or [])
        token = headers.get(TOKEN_HEADER, b"").decode("utf-8", errors="replace")
        client = self.scope.get("client") or (None, None)
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

    async def _hello(self, frame: dict[str, Any]) -> None:
        if self.hello_seen:
            return  # frames racing the welcome; the runner waits for it before sending more
        self.hello_seen = True
        if frame.get("type") != "hello":
            log.warning("tunnel %s: first frame was not hello", self.runner_id)
            await self._close(CLOSE_BAD_HELLO)
            return
        if frame.get("protocol") != PROTOCOL_VERSION:
            log.warning("tunnel %s: unsupported protocol %r", self.runner_id, frame.get("protocol"))
            await self._close(CLOSE_BAD_PROTOCOL)
            return
        workspace = frame.get("workspace") if isinstance(frame.get("workspace"), dict) else {}
        open_sessions = frame.get("open_sessions")
        open_ids = (
            {s for s in open_sessions if isinstance(s, str)}
            if isinstance(open_sessions, list)
            else set()
        )
        connection = await database_sync_to_async(services.mark_connected)(
            runner_id=self.runner_id,
            channel_name=self.channel_name,
            runner_version=str(frame.get("runner_version") or ""),
            workspace=workspace,
        )
        self.generation = connection.generation
        if connection.replaced_channel:
            await notify(
                channel_name=connection.replaced_channel, message={"type": "tunnel.replaced"}
            )
        resumes = await database_sync_to_async(services.sessions_to_resume)(
            runner_id=self.runner_id, open_sessions=open_ids
        )
        await self._send(
            {
                "type": "welcome",
                "runner_id": self.runner_id,
                "heartbeat_s": settings.OMNIGENT_HEARTBEAT_S,
                "sessions": [
                    {"session_id": r.session_id, "last_acked_seq": r.last_acked_seq}
                    for r in resumes
                ],
            }
        )
        log.info("runner %s online (generation %s)", self.runner_id, self.generation)
        for resume in resumes:
            if resume.session_id in open_ids:
                await database_sync_to_async(runner_events.mark_session_opened)(
                    session_id=resume.session_id, generation=self.generation
                )
                continue
            if not resume.open_command:
                continue  # could not be opened (logged); its turns were failed
            await self._forward(resume.open_command, reply_channel=None)
            for command in resume.turn_commands:
                await self._forward(command, reply_channel=None)
        self.tasks.append(asyncio.create_task(self._heartbeat()))

    async def _heartbeat(self) -> None:
        interval = settings.OMNIGENT_HEARTBEAT_S
        while not self.closing:
            await asyncio.sleep(interval)
            if time.monotonic() - self.last_frame > 3 * interval:
                log.warning("tunnel %s: no frame for %.0f s, closing", self.runner_id, 3 * interval)
                await self._close(CLOSE_DEAD_PEER)
                return
            await self._send({"type": "ping", "ts": time.time()})
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
            frame = json.loads(text_data)
        except ValueError:
            frame = None
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            if not self.generation:
                await self._close(CLOSE_BAD_HELLO)
            else:
                log.warning("tunnel %s: ignored a malformed frame", self.runner_id)
            return
        if not self.generation:
            await self._hello(frame)
            return
        await self._touch()
        kind = frame["type"]
        if kind == "event":
            await self._event(frame)
        elif kind in ("ack", "nack", "rpc.result"):
            await self._answer(frame)
        elif kind == "pong":
            return
        else:
            log.warning("tunnel %s: ignored a frame of type %r", self.runner_id, kind)

    async def _touch(self) -> None:
        now = timezone.now()
        if services.seen_is_due(self.last_seen_write, now):
            self.last_seen_write = now
            await database_sync_to_async(services.mark_seen)(
                runner_id=self.runner_id, generation=self.generation
            )

    async def _event(self, frame: dict[str, Any]) -> None:
        session_id, seq, event = frame.get("session_id"), frame.get("seq"), frame.get("event")
        if not isinstance(session_id, str) or not isinstance(seq, int) or seq < 1:
            log.warning("tunnel %s: ignored an event frame without session_id/seq", self.runner_id)
            return
        if not isinstance(event, dict):
            event = {"type": None}
        # Stored by one writer task, in arrival order; events that arrive while it is
        # busy are stored (and shown to watchers) together in its next round.
        self.event_backlog.append((session_id, seq, event))
        if self.event_writer is None or self.event_writer.done():
            self.event_writer = asyncio.create_task(self._write_events())

    async def _write_events(self) -> None:
        try:
            # Runs on after the socket closed too, until what arrived is stored
            # (``disconnect`` waits for it); only the acks stop.
            while self.event_backlog:
                batch = [
                    self.event_backlog.popleft()
                    for _ in range(min(len(self.event_backlog), EVENT_BATCH))
                ]
                acks = await database_sync_to_async(services.record_runner_events)(
                    runner_id=self.runner_id, events=batch
                )
                for session_id, seq in acks.items():
                    await self._send({"type": "event.ack", "session_id": session_id, "seq": seq})
        except Exception:
            # Nothing unacknowledged is lost: the runner resends it after reconnecting.
            log.exception("tunnel %s: storing runner events failed", self.runner_id)
            await self._close(CLOSE_SERVER_ERROR)

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

    async def _answer(self, frame: dict[str, Any]) -> None:
        command_id = frame.get("id")
        entry = self.pending.pop(command_id, None) if isinstance(command_id, str) else None
        if entry is None:
            log.info("tunnel %s: answer for unknown command %r", self.runner_id, command_id)
            return
        reply_channel, command = entry
        ok = frame["type"] == "ack" or (frame["type"] == "rpc.result" and bool(frame.get("ok")))
        if ok and command.get("type") == "session.open":
            await database_sync_to_async(runner_events.mark_session_opened)(
                session_id=command["session_id"], generation=self.generation
            )
        if not ok:
            log.info(
                "tunnel %s: %s %s rejected: %s",
                self.runner_id,
                command.get("type"),
                command_id,
                frame.get("error"),
            )
        if reply_channel:
            reply: dict[str, Any] = {"type": "tunnel.reply", "ok": ok}
            if frame["type"] == "rpc.result":
                reply["result"] = frame.get("result")
            if not ok:
                raw_error = frame.get("error")
                error = raw_error if isinstance(raw_error, dict) else {}
                reply["error"] = {
                    "code": str(error.get("code") or "rejected"),
                    "message": str(error.get("message") or "the runner rejected the command"),
                }
            await notify(channel_name=reply_channel, message=reply)

    # --- messages from other server processes ---------------------------------------

    async def tunnel_command(self, message: dict[str, Any]) -> None:
        command = message.get("command") or {}
        reply_channel = message.get("reply_channel")
        if not self.generation or self.closing:
            if reply_channel:
                await notify(
                    channel_name=reply_channel,
                    message={
                        "type": "tunnel.reply",
                        "ok": False,
                        "error": {"code": "tunnel_closed", "message": "the tunnel is closing"},
                    },
                )
            return
        await self._forward(command, reply_channel=reply_channel)

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

    async def _forward(self, command: dict[str, Any], *, reply_channel: str | None) -> None:
        self.command_counter += 1
        command_id = f"cmd-{self.generation}-{self.command_counter}"
        frame = {**command, "id": command_id}
        self.pending[command_id] = (reply_channel, command)
        await self._send(frame)

    async def _send(self, frame: dict[str, Any]) -> None:
        if not self.closing:
            await self.send(text_data=json.dumps(frame))

    async def _close(self, code: int) -> None:
        if self.closing:
            return
        self.closing = True
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        self.closing = True
        for task in self.tasks:
            task.cancel()
        await self._finish_event_writer()
        pending, self.pending = self.pending, {}
        for reply_channel, _command in pending.values():
            if reply_channel:
                await notify(
                    channel_name=reply_channel,
                    message={
                        "type": "tunnel.reply",
                        "ok": False,
                        "error": {
                            "code": "tunnel_closed",
                            "message": "the tunnel closed before the runner answered",
                        },
                    },
                )
        if not self.generation:
            return
        current = await database_sync_to_async(services.mark_disconnected)(
            runner_id=self.runner_id, generation=self.generation
        )
        if current:
            log.info("runner %s offline (code %s)", self.runner_id, code)
            asyncio.get_running_loop().create_task(
                fail_after_grace(runner_id=self.runner_id, generation=self.generation)
            )


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
