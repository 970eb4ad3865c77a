"""Relay user input to the session's runner (http-api.md, Events; architecture.md, Data flow).

The coroutines run in async views: they wait for the runner's acknowledgement with a
deadline without holding a request thread. ``accept_message`` is the sync part of a
message, run on the request's thread in the trip the events view makes for DRF's
checks (``SessionEventsView.initial``); ``deliver_message`` is the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from omnigent_runner.protocol import (
    AnyCommand,
    Budgets,
    ToolResult,
    TunnelReply,
    TurnInterrupt,
    TurnStart,
)
from omnigent_site.domain_errors import AgentUnavailable, RunnerUnavailable
from sessions import approvals, budgets
from sessions import files as session_files
from sessions.blobs import BundleMissing
from sessions.eventlog import Publication, collecting_publications, send_publications
from sessions.models import Item, Session, Turn

from . import runner_events, scheduler
from .models import Runner
from .relay import TUNNEL_GONE, RelayError, post_command, send_command
from .tunnel_errors import TUNNEL_CLOSED
from .verdicts import relay_verdict

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

log = logging.getLogger(__name__)

# How often a request waiting for a reconnecting runner reads its row: only in the
# seconds after a tunnel dropped, so a poll costs less than a channel-layer subscription.
RECONNECT_POLL_S = 0.1
# Delivery failures after which the runner may soon be back on a new tunnel, where the
# command is sent again (a re-sent ``turn.start`` or ``tool_result`` never runs twice:
# tunnel.md). A missed deadline or a nack is final.
_RECONNECTABLE = frozenset({"runner_offline", TUNNEL_CLOSED, TUNNEL_GONE})
# Tunnels a command follows the runner across before it gives up (a flapping link).
_MAX_RESENDS = 3


async def _poll_until_back(
    *, runner_id: str, after_generation: int, deadline: float
) -> Runner | None:
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        await asyncio.sleep(min(RECONNECT_POLL_S, max(0.0, deadline - loop.time())))
        current = await Runner.objects.filter(pk=runner_id).afirst()
        if current is None or current.is_revoked:
            return None
        if current.online and current.generation > after_generation:
            return current
    return None


async def wait_for_reconnecting_runner(*, session: Session) -> None:
    """The session's runner dropped its tunnel moments ago (a server process restarting,
    a network blip): wait for it to reconnect, to any process, until
    ``OMNIGENT_RUNNER_RECONNECT_WAIT_S`` after the drop, so the message is delivered
    instead of refused. Returns at once when the runner is online, was never connected,
    or dropped longer ago; the caller's own check then answers 503 as before."""
    runner = session.runner
    window = settings.OMNIGENT_RUNNER_RECONNECT_WAIT_S
    if runner is None or runner.online or runner.is_revoked or runner.disconnected_at is None:
        return
    left = window - (timezone.now() - runner.disconnected_at).total_seconds()
    if left <= 0:
        return
    back = await _poll_until_back(
        runner_id=runner.id,
        after_generation=runner.generation - 1,
        deadline=asyncio.get_running_loop().time() + left,
    )
    if back is not None:
        session.runner = back


async def _runner_back_after(exc: RelayError, runner: Runner) -> Runner | None:
    """After a command was lost with ``runner``'s tunnel: the runner on a newer tunnel
    (within ``OMNIGENT_RUNNER_RECONNECT_WAIT_S``), or None when the failure is final."""
    window = settings.OMNIGENT_RUNNER_RECONNECT_WAIT_S
    if exc.code not in _RECONNECTABLE or window <= 0:
        return None
    return await _poll_until_back(
        runner_id=runner.id,
        after_generation=runner.generation,
        deadline=asyncio.get_running_loop().time() + window,
    )


async def _send_following_runner(
    *,
    runner: Runner,
    command: AnyCommand,
    before_each: Callable[[Runner], Awaitable[None]] | None = None,
    on_back: Callable[[], None] | None = None,
) -> TunnelReply:
    """Send ``command`` to ``runner``; when its tunnel is lost on the way, send it again
    on the runner's next tunnel, across up to ``_MAX_RESENDS`` tunnels (a flapping link).

    ``before_each``: awaited before every try with the runner of that try (a message's
    ``session.open`` on a tunnel that has not had it). ``on_back``: called when the
    runner is back and the command goes out again. Returns the runner's reply; raises
    the last :class:`RelayError` once the failure is final."""
    resends = 0
    while True:
        try:
            if before_each is not None:
                await before_each(runner)
            return await send_command(
                channel_name=runner.channel_name, command=command, still_there=_still_on(runner)
            )
        except RelayError as exc:
            back = await _runner_back_after(exc, runner) if resends < _MAX_RESENDS else None
            if back is None:
                raise
            if on_back is not None:
                on_back()
            runner, resends = back, resends + 1


def _still_on(runner: Runner) -> Callable[[], Awaitable[bool]]:
    """Whether ``runner``'s row still names the tunnel a command went to: asked only
    while an answer is late, so a command lost with a stopping process's tunnel is sent
    again on the next one instead of waiting out ``OMNIGENT_RELAY_TIMEOUT_S``."""

    async def still_there() -> bool:
        current = (
            await Runner.objects.filter(pk=runner.pk)
            .values_list("channel_name", flat=True)
            .afirst()
        )
        return current == runner.channel_name

    return still_there


def _runner_or_503(session: Session) -> Runner:
    """The session's runner if its tunnel is live.

    ``session`` was read with its runner by the permission check of this request,
    so no further query is needed on the relay's hot path.
    """
    runner = session.runner
    if runner is None:
        raise RunnerUnavailable("no runner is bound to this session")
    if not runner.online:
        raise RunnerUnavailable(f"runner '{runner.id}' is offline")
    return runner


async def _ensure_open(session: Session, runner: Runner, response_id: str) -> None:
    """Send ``session.open`` unless this tunnel connection already acknowledged it."""
    if session.runner_generation_opened == runner.generation:
        return
    try:
        command = await sync_to_async(runner_events.session_open_command)(session=session)
    except BundleMissing as exc:
        log.error("session %s: %s", session.id, exc)
        await sync_to_async(runner_events.fail_turn)(
            session_id=session.id,
            response_id=response_id,
            code="agent_load_failed",
            message=str(exc),
        )
        raise AgentUnavailable(str(exc)) from exc
    await send_command(
        channel_name=runner.channel_name, command=command, still_there=_still_on(runner)
    )


def _accept_with_command(
    *,
    session_id: str,
    created_by: str,
    data: dict[str, Any],
    tools: list[dict[str, Any]],
    budgets_now: Budgets | None = None,
    user_id: int | None = None,
    runner: Runner | None = None,
) -> tuple[Item, Turn, TurnStart, list[Publication]]:
    """Store the message and its turn, and build its ``turn.start``. What the write
    publishes comes back to be sent from the event loop."""
    with collecting_publications() as unit:
        item, response = runner_events.accept_message(
            session_id=session_id,
            created_by=created_by,
            data=data,
            tools=tools,
            unit=unit,
            user_id=user_id,
            runner=runner,
        )
    command = runner_events.turn_start_command(
        response=response, inputs=[item], budgets_now=budgets_now
    )
    return item, response, command, unit.publications


@dataclass(frozen=True, slots=True)
class AcceptedMessage:
    """A message stored with its turn: what :func:`deliver_message` hands to the runner.

    ``started``: the turn got a runner slot (usage.md, Fair share), so ``command`` goes
    out now; otherwise it waits ``queued``. ``other_starts``: turns that waited before
    this one and got a slot in the same claim, with what to send their runners."""

    runner: Runner
    item: Item
    response: Turn
    command: TurnStart
    publications: list[Publication]
    started: bool = True
    other_starts: list[tuple[str, list[AnyCommand]]] = field(default_factory=list)


def accept_message(
    *,
    session: Session,
    created_by: str,
    data: dict[str, Any],
    tools: list[dict[str, Any]],
    user_id: int | None = None,
) -> AcceptedMessage:
    """On the request's thread: the message's file blocks checked, its runner checked
    (503 before anything is stored), the message and its turn stored (``user_id``: whose
    turn it is for fair share; the session's creator when not given), then a runner
    slot asked for (``scheduler.claim``), in the same trip to the thread. A message the
    budgets refuse (usage.md, Budgets: 409 or 429) stores nothing."""
    budgets_now = budgets.check_message(session=session)
    if session_files.has_file_blocks(data):
        # 400 (not this session's file) or 413 (over a frame) before anything is stored.
        data = session_files.prepare_message_files(session_id=session.id, data=data)
    runner = _runner_or_503(session)
    item, response, command, publications = _accept_with_command(
        session_id=session.id,
        created_by=created_by,
        data=data,
        tools=tools,
        budgets_now=budgets_now,
        user_id=user_id,
        runner=runner,
    )
    if response.dispatched_at is not None:
        # Started at once (a free slot, nothing waiting): no claim to make.
        return AcceptedMessage(
            runner=runner, item=item, response=response, command=command, publications=publications
        )
    claimed = scheduler.claim(touched=[session.id], runners=[runner])
    mine = (session.id, response.id)
    others = [turn for turn in claimed if (turn.session_id, turn.response_id) != mine]
    return AcceptedMessage(
        runner=runner,
        item=item,
        response=response,
        command=command,
        publications=publications,
        started=len(others) < len(claimed),
        other_starts=runner_events.start_commands(others),
    )


async def deliver_message(*, session: Session, accepted: AcceptedMessage) -> dict[str, Any]:
    """Publish what storing the message produced; hand its turn to the runner if it got
    a slot and wait for the runner's acknowledgement (a turn that waits ``queued`` gets
    its ``202`` at once); return the 202 body (http-api.md)."""
    await send_publications(accepted.publications)
    for channel_name, commands in accepted.other_starts:
        # Slots this claim found free for turns that waited before this one.
        for command in commands:
            await post_command(channel_name=channel_name, command=command)
    runner, response = accepted.runner, accepted.response
    if not accepted.started:
        return {"queued": True, "item_id": accepted.item.id, "response_id": response.id}

    async def open_session(on: Runner) -> None:
        await _ensure_open(session, on, response.id)

    def note_back() -> None:
        log.info("turn %s of %s: the runner is back; sending it again", response.id, session.id)

    try:
        await _send_following_runner(
            runner=runner, command=accepted.command, before_each=open_session, on_back=note_back
        )
    except RelayError as exc:
        log.warning("turn %s of %s not delivered: %s", response.id, session.id, exc.message)
        await sync_to_async(runner_events.fail_turn)(
            session_id=session.id,
            response_id=response.id,
            code="runner_unreachable",
            message=f"the runner did not accept the turn: {exc.message}",
        )
        raise RunnerUnavailable(f"the runner did not accept the message: {exc.message}") from exc
    return {"queued": True, "item_id": accepted.item.id, "response_id": response.id}


async def forward_tool_result(*, session: Session, call_id: str, output: str) -> dict[str, Any]:
    """Relay a client tool's output as exactly ``tool_result`` (tunnel.md)."""
    await wait_for_reconnecting_runner(session=session)
    runner = _runner_or_503(session)
    command = ToolResult(session_id=session.id, call_id=call_id, output=output)
    try:
        await _send_following_runner(runner=runner, command=command)
    except RelayError as exc:
        raise RunnerUnavailable(
            f"the runner did not accept the tool result: {exc.message}"
        ) from exc
    return {"queued": True, "item_id": call_id}


async def interrupt_turn(*, session: Session, user: AuthUser | None = None) -> dict[str, Any]:
    """Best effort: ask the runner to cancel the running turn; never a 503.

    The session's open questions are cancelled too (approvals.md), and their
    ``cancel`` verdicts sent after the interrupt; an offline runner gets them with
    ``session.open``.
    """
    runner = session.runner
    delivered = False
    if runner is not None and runner.online:
        try:
            await send_command(
                channel_name=runner.channel_name,
                command=TurnInterrupt(session_id=session.id),
            )
            delivered = True
        except RelayError as exc:
            log.info("interrupt of %s not delivered: %s", session.id, exc.message)
    cancelled = await sync_to_async(approvals.cancel_pending)(
        session_id=session.id, reason="interrupted", user=user
    )
    if delivered:
        for approval in cancelled:
            await relay_verdict(session=session, approval=approval)
    return {"queued": False}
