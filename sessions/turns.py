"""Relay user input to the session's runner (http-api.md, Events; architecture.md, Data flow).

These coroutines run in async views: they wait for the runner's acknowledgement
with a deadline without holding Django's shared sync thread.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import sync_to_async
from rest_framework.exceptions import APIException

from omnigent_site.errors import RunnerUnavailable
from runners.models import Runner
from runners.relay import RelayError, send_command

from . import runner_events
from .blobs import BundleMissing
from .models import Session

log = logging.getLogger(__name__)


def _live_runner(session_id: str) -> tuple[Session, Runner | None]:
    session = Session.objects.select_related("runner", "agent").get(pk=session_id)
    runner = session.runner
    return session, runner if runner is not None and runner.online else None


async def _runner_or_503(session_id: str) -> tuple[Session, Runner]:
    session, runner = await sync_to_async(_live_runner)(session_id)
    if runner is None:
        if session.runner_id is None:
            raise RunnerUnavailable("no runner is bound to this session")
        raise RunnerUnavailable(f"runner '{session.runner_id}' is offline")
    return session, runner


class AgentUnavailable(APIException):
    status_code = 500
    default_code = "internal_error"
    default_detail = "the session's agent bundle is not available on this server"


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
    await send_command(channel_name=runner.channel_name, command=command)


async def submit_message(
    *, session_id: str, created_by: str, data: dict[str, Any], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    """Store the message and its turn, hand the turn to the runner, return the 202 body."""
    session, runner = await _runner_or_503(session_id)
    item, response = await sync_to_async(runner_events.accept_message)(
        session_id=session_id, created_by=created_by, data=data, tools=tools
    )
    try:
        await _ensure_open(session, runner, response.id)
        command = await sync_to_async(runner_events.turn_start_command)(response=response)
        await send_command(channel_name=runner.channel_name, command=command)
    except RelayError as exc:
        log.warning("turn %s of %s not delivered: %s", response.id, session_id, exc.message)
        await sync_to_async(runner_events.fail_turn)(
            session_id=session_id,
            response_id=response.id,
            code="runner_unreachable",
            message=f"the runner did not accept the turn: {exc.message}",
        )
        raise RunnerUnavailable(f"the runner did not accept the message: {exc.message}") from exc
    return {"queued": True, "item_id": item.id, "response_id": response.id}


async def forward_tool_result(*, session_id: str, call_id: str, output: str) -> dict[str, Any]:
    """Relay a client tool's output as exactly ``tool_result`` (tunnel.md)."""
    _session, runner = await _runner_or_503(session_id)
    command = {
        "type": "tool_result",
        "session_id": session_id,
        "call_id": call_id,
        "output": output,
    }
    try:
        await send_command(channel_name=runner.channel_name, command=command)
    except RelayError as exc:
        raise RunnerUnavailable(
            f"the runner did not accept the tool result: {exc.message}"
        ) from exc
    return {"queued": True, "item_id": call_id}


async def interrupt_turn(*, session_id: str) -> dict[str, Any]:
    """Best effort: ask the runner to cancel the running turn; never a 503."""
    _session, runner = await sync_to_async(_live_runner)(session_id)
    if runner is not None:
        try:
            await send_command(
                channel_name=runner.channel_name,
                command={"type": "turn.interrupt", "session_id": session_id},
            )
        except RelayError as exc:
            log.info("interrupt of %s not delivered: %s", session_id, exc.message)
    return {"queued": False}
