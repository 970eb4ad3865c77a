"""The runner's side of the tunnel (tunnel.md): dial out, hand commands to the executor,
deliver its events at-least-once, and keep reconnecting until told to stop.

The runner only ever dials out, so the tunnel survives NAT and server restarts as long
as this loop keeps trying. Only answers that retrying cannot fix end it: a refused
upgrade (403, a wrong or revoked token) and the server's 4001/4002 close codes.

One connection at a time runs two things: the receive loop, which handles frames one by
one in arrival order, and a single sender task draining a queue, so that frames (events
above all) leave in the order they were produced and :meth:`RunnerTunnel.emit` never
waits on the network.

Frames are built and parsed by ``omnigent_runner.protocol``. A command that is not a
valid frame but carries an ``id`` gets a ``nack`` (``invalid_command``, or
``unknown_command`` for a type this runner does not know); see :meth:`_reject`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable
from typing import Any

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from omnigent_runner import PROTOCOL_VERSION, RUNNER_VERSION, logs
from omnigent_runner.config import RunnerConfig
from omnigent_runner.event_batches import pack_messages
from omnigent_runner.executor import CommandRejected, SessionExecutor
from omnigent_runner.outbox import DEFAULT_MAX_UNACKED, Outbox
from omnigent_runner.protocol import (
    COMMAND_TYPES,
    EVENT_BATCHES,
    INVALID,
    SERVER_FRAME_TYPES,
    UNKNOWN_TYPE,
    Ack,
    AnyCommand,
    AnyEvent,
    ApprovalVerdict,
    ErrorInfo,
    EventAck,
    EventAcks,
    Frame,
    Hello,
    Nack,
    Ping,
    PolicyUpdate,
    Pong,
    ProtocolError,
    Rpc,
    RpcResult,
    ServerFrame,
    SessionClose,
    SessionOpen,
    ToolResult,
    TurnInterrupt,
    TurnStart,
    Welcome,
    decode_server_frame,
    encode,
    encode_bytes,
    frame_type,
)
from omnigent_runner.tools.fsutil import os_reason

logger = logging.getLogger(__name__)

# websockets logs every handshake header at DEBUG, the binding token among them. Its
# connections log to this logger, pinned at INFO, so no --log-level can print the token.
_ws_logger = logging.getLogger(__name__ + ".websocket")
_ws_logger.setLevel(logging.INFO)

TOKEN_HEADER = "X-Omnigent-Runner-Tunnel-Token"
# What the runner accepts from the server. Larger than the server's own 16 MiB
# limit on what runners send: ``session.open`` carries the bundle in base64 (a
# 12 MiB bundle is 16 MiB of text) plus the session's history.
MAX_FRAME_BYTES = 64 * 1024 * 1024
DEFAULT_HEARTBEAT_S = 20.0
EXIT_OK = 0
EXIT_FATAL = 2

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_REPLACED = 4000
CLOSE_BAD_HELLO = 4001
CLOSE_BAD_PROTOCOL = 4002
CLOSE_HEARTBEAT = 4003
CLOSE_SERVER_STOPPING = 4005

# The nack code for a command that is not a valid frame, by ProtocolError code.
NACK_CODES = {INVALID: "invalid_command", UNKNOWN_TYPE: "unknown_command"}

_Reply = Callable[[Frame], None]


class _Fatal(Exception):
    """The server refused us in a way retrying cannot fix; the message says what to check."""


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` still exists (signal 0 checks without signalling)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # e.g. PermissionError: it exists but belongs to someone else
    return True


def _shown(exc: Exception) -> str:
    """An unexpected failure's text for the server: an ``OSError``'s without the absolute
    path of this machine it carries (the server may show it to an API client)."""
    return os_reason(exc) if isinstance(exc, OSError) else str(exc)


class RunnerTunnel:
    """Keeps one runner connected to its server; the executor's :class:`EventSink`."""

    def __init__(
        self,
        config: RunnerConfig,
        executor: SessionExecutor,
        *,
        workspace_info: dict[str, Any],
        capabilities: dict[str, Any] | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 10.0,
        hello_extra: dict[str, Any] | None = None,  # overrides hello fields (tests)
        max_unacked: int = DEFAULT_MAX_UNACKED,
        open_timeout: float = 10.0,
        close_timeout: float = 5.0,
        send_timeout: float = 30.0,
        parent_poll_s: float = 1.0,
    ) -> None:
        self._config = config
        self._executor = executor
        self._workspace_info = dict(workspace_info)
        self._capabilities = dict(capabilities or {})
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._hello_extra = dict(hello_extra or {})
        self._open_timeout = open_timeout
        self._close_timeout = close_timeout
        self._send_timeout = send_timeout
        self._parent_poll_s = parent_poll_s

        self._outbox = Outbox(max_unacked)
        self._attempt = 0
        self._exit_code = EXIT_OK
        self._stop_event = asyncio.Event()
        self._finished = asyncio.Event()
        self._running = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # The live connection's send queue; None while not connected and welcomed.
        self._live: asyncio.Queue[Frame] | None = None
        self._shutdown_task: asyncio.Future[None] | None = None
        self._rpc_tasks: set[asyncio.Task[None]] = set()
        executor.bind(self)

    # ----------------------------------------------------------------- EventSink

    def emit(self, session_id: str, event: AnyEvent) -> None:
        """Number and keep ``event``; send it now if the tunnel is up. Never blocks.

        Safe to call from another thread: the work is handed to the tunnel's loop.
        """
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                loop.call_soon_threadsafe(self._emit, session_id, event)
                return
        self._emit(session_id, event)

    def _emit(self, session_id: str, event: AnyEvent) -> None:
        frame = self._outbox.emit(session_id, event)
        if frame is not None and self._live is not None:
            self._live.put_nowait(frame)

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> int:
        """Stay connected until stopped; return the process exit code (0, or 2 if fatal)."""
        if self._running:
            raise RuntimeError("RunnerTunnel.run() is already running")
        self._running = True
        self._finished.clear()
        self._loop = asyncio.get_running_loop()
        watcher = None
        if self._config.parent_pid is not None:
            watcher = asyncio.create_task(self._watch_parent(self._config.parent_pid))
        conn: asyncio.Task[None] | None = None
        try:
            while not self._stop_event.is_set():
                conn = asyncio.create_task(self._connection())
                stopper = asyncio.create_task(self._stop_event.wait())
                try:
                    await asyncio.wait({conn, stopper}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopper.cancel()
                if not conn.done():
                    conn.cancel()  # its cleanup closes the socket with 1000
                    await asyncio.gather(conn, return_exceptions=True)
                    break
                try:
                    conn.result()
                except _Fatal as exc:
                    logger.error("%s", exc)
                    self._exit_code = EXIT_FATAL
                    break
                except Exception:
                    logger.exception("tunnel connection failed unexpectedly")
                if self._stop_event.is_set():
                    break
                delay = self._next_delay()
                logger.info("reconnecting in %.2f s", delay)
                try:
                    await asyncio.wait_for(self._stop_event.wait(), delay)
                except TimeoutError:
                    pass
        finally:
            if conn is not None and not conn.done():
                conn.cancel()
                await asyncio.gather(conn, return_exceptions=True)
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            for task in list(self._rpc_tasks):
                task.cancel()
            await asyncio.gather(*self._rpc_tasks, return_exceptions=True)
            await self._shutdown_executor()
            self._running = False
            self._finished.set()
        logger.info("runner tunnel stopped (exit code %d)", self._exit_code)
        return self._exit_code

    async def stop(self) -> None:
        """Close the tunnel with 1000, shut the executor down, and make run() return 0."""
        self._request_stop(EXIT_OK)
        if self._running:
            await self._finished.wait()
        else:
            await self._shutdown_executor()

    def _request_stop(self, exit_code: int) -> None:
        if not self._stop_event.is_set():
            self._exit_code = exit_code
            self._stop_event.set()

    async def _shutdown_executor(self) -> None:
        """Run executor.shutdown() exactly once, however many paths ask for it."""
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.ensure_future(self._executor.shutdown())
        try:
            await asyncio.shield(self._shutdown_task)
        except Exception:
            logger.exception("executor shutdown failed")

    def _next_delay(self) -> float:
        """Exponential backoff with equal jitter, so many runners do not retry in step."""
        base = min(self._backoff_max, self._backoff_initial * (2**self._attempt))
        self._attempt = min(self._attempt + 1, 32)
        return base / 2 + random.uniform(0, base / 2)

    async def _watch_parent(self, pid: int) -> None:
        """Stop when the process that launched us is gone, so runners are never orphaned."""
        was_our_parent = os.getppid() == pid
        while True:
            await asyncio.sleep(self._parent_poll_s)
            # A dead parent may linger as a zombie; being re-parented also means it exited.
            if not _pid_alive(pid) or (was_our_parent and os.getppid() != pid):
                logger.info("parent process %d exited; stopping", pid)
                self._request_stop(EXIT_OK)
                return

    # ----------------------------------------------------------------- connection

    async def _connection(self) -> None:
        """One connection: dial, handshake, pump frames. Returns when it is over.

        Raises :class:`_Fatal` when the server refused us for good.
        """
        url = self._config.tunnel_url
        try:
            ws = await connect(
                url,
                additional_headers={TOKEN_HEADER: self._config.token},
                max_size=MAX_FRAME_BYTES,
                open_timeout=self._open_timeout,
                close_timeout=self._close_timeout,
                logger=_ws_logger,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise _Fatal(
                    f"server refused the tunnel (HTTP {status}): check the binding token "
                    f"and that the runner {self._config.runner_id} is registered"
                ) from None
            logger.warning("server rejected the tunnel upgrade at %s (HTTP %d)", url, status)
            return
        except (OSError, TimeoutError, WebSocketException) as exc:
            logger.warning("cannot open the tunnel to %s: %s", url, exc or type(exc).__name__)
            return

        logger.info("tunnel open to %s", url)
        try:
            await self._converse(ws)
        except ConnectionClosed as exc:
            self._on_closed(exc)
        finally:
            self._live = None
            code = CLOSE_NORMAL if self._stop_event.is_set() else CLOSE_GOING_AWAY
            await ws.close(code, "runner stopping" if code == CLOSE_NORMAL else "")

    def _on_closed(self, exc: ConnectionClosed) -> None:
        """Decide, from the server's close code, whether to reconnect or give up."""
        if self._stop_event.is_set():
            return
        code = exc.rcvd.code if exc.rcvd is not None else None
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        if code == CLOSE_BAD_HELLO:
            raise _Fatal(
                f"server closed the tunnel with {code} (hello missing, late or invalid): {reason}"
            )
        if code == CLOSE_BAD_PROTOCOL:
            raise _Fatal(
                f"server closed the tunnel with {code}: it does not support tunnel protocol "
                f"{PROTOCOL_VERSION} (runner {RUNNER_VERSION}); upgrade the runner or the server"
            )
        if code == CLOSE_REPLACED:
            logger.warning(
                "tunnel replaced by a newer connection for runner %s (close 4000); is another "
                "runner process using the same token? reconnecting",
                self._config.runner_id,
            )
        elif code == CLOSE_HEARTBEAT:
            logger.warning("server closed the tunnel: it missed our heartbeats (4003)")
        elif code == CLOSE_SERVER_STOPPING:
            logger.info("the server process is stopping (4005); reconnecting to another")
            # Not a failure: another process takes the tunnel. A proxy may hand the next
            # dial to the stopping process again (a kept-alive upstream connection), which
            # closes it before the welcome; the delay stays at the first step instead of
            # doubling each time, so the runner is back within the rolling restart's 2 s.
            self._attempt = 0
        else:
            logger.warning("tunnel closed (%s)", exc)

    async def _converse(self, ws: ClientConnection) -> None:
        """Handshake, resend what the server lacks, then serve frames until the end."""
        hello = Hello(
            protocol=PROTOCOL_VERSION,
            runner_version=RUNNER_VERSION,
            workspace=self._workspace_info,
            capabilities={**self._capabilities, EVENT_BATCHES: True},
            open_sessions=self._open_session_ids(),
            max_turns=self._config.max_turns,
        )
        if self._hello_extra:
            hello = msgspec.structs.replace(hello, **self._hello_extra)
        async with asyncio.timeout(self._send_timeout):
            await ws.send(encode(hello))
        welcome = await self._await_welcome(ws)
        if welcome is None:
            return
        heartbeat_s = float(welcome.heartbeat_s)

        queue: asyncio.Queue[Frame] = asyncio.Queue()
        resend = self._outbox.pending()
        for frame in resend:
            queue.put_nowait(frame)
        self._live = queue  # from here on emit() feeds this queue, after the resend
        self._attempt = 0
        logger.info(
            "tunnel up for runner %s (heartbeat %.1f s, resending %d events)",
            self._config.runner_id,
            heartbeat_s,
            len(resend),
        )
        sender = asyncio.create_task(self._send_loop(ws, queue, batch_events=welcome.event_batches))
        try:
            await self._receive_loop(ws, heartbeat_s, queue)
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    def _open_session_ids(self) -> list[str]:
        try:
            return list(self._executor.open_session_ids())
        except Exception:
            logger.exception("executor.open_session_ids() failed; reporting none")
            return []

    async def _await_welcome(self, ws: ClientConnection) -> Welcome | None:
        """Wait (with a deadline) for ``welcome``; apply it and return it.

        Anything else before it is ignored, except ``ping``; an invalid ``welcome`` is
        ignored like any invalid frame, so the deadline passes and the runner dials again.
        """
        try:
            async with asyncio.timeout(self._open_timeout):
                while True:
                    frame = self._parse(await ws.recv())
                    if isinstance(frame, Welcome):
                        break
                    if isinstance(frame, Ping):
                        await ws.send(encode(Pong(ts=frame.ts)))
                    elif frame is not None:
                        logger.warning(
                            "ignoring %r frame received before welcome", frame_type(frame)
                        )
        except TimeoutError:
            logger.warning("no welcome from the server within %.1f s", self._open_timeout)
            return None

        if frame.runner_id != self._config.runner_id:
            logger.warning(
                "welcome names runner %r, expected %r", frame.runner_id, self._config.runner_id
            )
        for cursor in frame.sessions:
            self._outbox.resync(cursor.session_id, cursor.last_acked_seq)
        return frame

    async def _send_loop(
        self, ws: ClientConnection, queue: asyncio.Queue[Frame], *, batch_events: bool
    ) -> None:
        """The only writer after the handshake, so frames leave in queue order.

        It takes everything queued when it wakes; with ``batch_events`` (the server's
        ``welcome`` offered it) runs of events among them leave as one ``events``
        message each (``omnigent_runner.event_batches``).
        """
        while True:
            frames = [await queue.get()]
            while not queue.empty():
                frames.append(queue.get_nowait())
            for data in pack_messages(frames, batch_events=batch_events):
                try:
                    async with asyncio.timeout(self._send_timeout):
                        await ws.send(data, text=True)
                except TimeoutError:
                    # The server stopped reading; drop the connection so the receive
                    # loop ends and we reconnect (unacked events are resent from the
                    # outbox).
                    logger.warning(
                        "send stalled for %.1f s; dropping the connection", self._send_timeout
                    )
                    ws.transport.abort()
                    return
                except ConnectionClosed:
                    return

    async def _receive_loop(
        self, ws: ClientConnection, heartbeat_s: float, queue: asyncio.Queue[Frame]
    ) -> None:
        """Handle frames in arrival order; return if the server falls silent."""
        silence_limit = 3 * heartbeat_s
        while True:
            try:
                async with asyncio.timeout(silence_limit):
                    raw = await ws.recv()
            except TimeoutError:
                logger.warning("no frame from the server for %.1f s; reconnecting", silence_limit)
                return
            if isinstance(raw, bytes):
                logger.warning("ignoring a binary message (%d bytes)", len(raw))
                continue
            try:
                frame = decode_server_frame(raw)
            except ProtocolError as exc:
                self._reject(exc, queue.put_nowait)
                continue
            await self._dispatch(frame, queue.put_nowait)

    @staticmethod
    def _parse(raw: str | bytes) -> ServerFrame | None:
        """Decode a frame before ``welcome``; anything invalid is logged and ignored."""
        if isinstance(raw, bytes):
            logger.warning("ignoring a binary message (%d bytes)", len(raw))
            return None
        try:
            return decode_server_frame(raw)
        except ProtocolError as exc:
            logger.warning("ignoring an invalid frame: %s", exc)
            return None

    # -------------------------------------------------------------------- frames

    @staticmethod
    def _reject(exc: ProtocolError, reply: _Reply) -> None:
        """The one answer to a frame that is not a valid frame.

        A command (a known command type, or a type this runner does not know) that
        carries an ``id`` gets a ``nack`` with ``invalid_command`` or ``unknown_command``
        (an ``rpc`` gets its ``rpc.result`` error instead), so the server's caller learns
        at once rather than at its deadline. Anything else is logged and ignored.
        """
        kind = exc.frame_type
        is_command = kind in COMMAND_TYPES or (kind is not None and kind not in SERVER_FRAME_TYPES)
        code = NACK_CODES.get(exc.code)
        if exc.frame_id is None or not is_command or code is None:
            logger.warning("ignoring an invalid frame: %s", exc)
            return
        logger.warning("rejecting command %r: %s", exc.frame_id, exc)
        error = ErrorInfo(code=code, message=str(exc))
        if kind == "rpc":
            reply(RpcResult(id=exc.frame_id, ok=False, error=error))
        else:
            reply(Nack(id=exc.frame_id, error=error))

    async def _dispatch(self, frame: ServerFrame, reply: _Reply) -> None:
        if isinstance(frame, Ping):
            reply(Pong(ts=frame.ts))
        elif isinstance(frame, EventAck):
            self._outbox.ack(frame.session_id, frame.seq)
        elif isinstance(frame, EventAcks):
            for ack in frame.acks:
                self._outbox.ack(ack.session_id, ack.seq)
        elif isinstance(frame, Rpc):
            # An rpc can take seconds (a workspace search, a large read): it runs beside
            # the receive loop, so pings and commands behind it are not held up.
            task = asyncio.create_task(self._rpc(frame, reply))
            self._rpc_tasks.add(task)
            task.add_done_callback(self._rpc_tasks.discard)
        elif isinstance(frame, Welcome):
            logger.warning("ignoring a welcome after the handshake")
        else:
            await self._command(frame, reply)

    async def _command(self, command: AnyCommand, reply: _Reply) -> None:
        """Run one command and answer ``ack`` or ``nack``; a failure never ends the tunnel."""
        command_id = command.id
        kind = frame_type(command)
        if command_id is None:
            logger.warning("ignoring %r command without an id", kind)
            return
        try:
            await self._execute(command)
        except CommandRejected as exc:
            reply(Nack(id=command_id, error=ErrorInfo(code=exc.code, message=exc.message)))
        except Exception as exc:
            logger.exception("%s command %r failed", kind, command_id)
            reply(Nack(id=command_id, error=ErrorInfo(code="internal_error", message=_shown(exc))))
        else:
            reply(Ack(id=command_id))

    async def _execute(self, command: AnyCommand) -> None:
        """Hand a command to the executor; raise :class:`CommandRejected` to nack it."""
        executor = self._executor
        if isinstance(command, SessionOpen):
            if command.last_acked_seq is not None:
                # A session bound while connected (or bound again) continues the server's
                # numbering, so its events are not taken for duplicates.
                self._outbox.resync(command.session_id, command.last_acked_seq)
            await executor.open_session(
                session_id=command.session_id, agent=command.agent, history=command.history
            )
            # Before any turn.start (commands are handled in order): the rules, and the
            # verdicts the server stored while this runner was away.
            await executor.update_policies(session_id=command.session_id, rules=command.policies)
            if command.budgets is not None:
                await executor.update_budgets(
                    session_id=command.session_id, budgets=command.budgets
                )
            for verdict in command.verdicts:
                await executor.approval_verdict(session_id=command.session_id, verdict=verdict)
        elif isinstance(command, TurnStart):
            # The turn's tasks copy this context: their log lines carry both ids.
            session_token = logs.session_id_var.set(command.session_id)
            request_token = logs.request_id_var.set(command.request_id)
            try:
                if command.budgets is not None:
                    # Before the turn is queued: its first model call sees them.
                    await executor.update_budgets(
                        session_id=command.session_id, budgets=command.budgets
                    )
                await executor.start_turn(
                    session_id=command.session_id,
                    response_id=command.response_id,
                    input=command.input,
                    tools=command.tools,
                )
            finally:
                logs.request_id_var.reset(request_token)
                logs.session_id_var.reset(session_token)
        elif isinstance(command, ToolResult):
            await executor.tool_result(
                session_id=command.session_id,
                call_id=command.call_id,
                output=command.output_text(),
            )
        elif isinstance(command, TurnInterrupt):
            await executor.interrupt(session_id=command.session_id)
        elif isinstance(command, SessionClose):
            await executor.close_session(session_id=command.session_id)
        elif isinstance(command, PolicyUpdate):
            if command.rules is not None:
                await executor.update_policies(session_id=command.session_id, rules=command.rules)
            if command.budgets is not None:
                await executor.update_budgets(
                    session_id=command.session_id, budgets=command.budgets
                )
        elif isinstance(command, ApprovalVerdict):
            await executor.approval_verdict(
                session_id=command.session_id, verdict=command.verdict()
            )
        else:
            raise CommandRejected(
                "unsupported_command", f"this runner does not support {frame_type(command)!r}"
            )

    async def _rpc(self, frame: Rpc, reply: _Reply) -> None:
        if frame.id is None:
            logger.warning("ignoring rpc without an id")
            return
        status = None
        try:
            result = await self._executor.rpc(method=frame.method, params=frame.params)
            answer = RpcResult(id=frame.id, ok=True, result=result)
            encode_bytes(answer)  # fail here, as an rpc error, rather than in the sender
        except CommandRejected as exc:
            error = ErrorInfo(code=exc.code, message=exc.message)
            status = exc.status
        except Exception as exc:
            logger.exception("rpc %r failed", frame.method)
            error = ErrorInfo(code="internal_error", message=_shown(exc))
        else:
            reply(answer)
            return
        reply(RpcResult(id=frame.id, ok=False, error=error, status=status))
