"""Answering approvals and changing policy rules, telling the runner about both, and
the expiry sweep every server process runs.

A verdict is stored first (``sessions.approvals``) and relayed after, so a runner that
is offline, or a relay that fails, loses nothing: the verdict stays unacknowledged
and the next ``session.open`` carries it (``runner_events.session_open_command``).
The consumer marks a verdict acknowledged when the runner acks the command that
carried it, whichever way it was sent.

Expiry is decided here, on the server, from each question's stored deadline: every
server process sweeps (``sweep_expired_approvals_forever``, registered with
``omnigent_site.runtime.on_serve`` in ``RunnersConfig.ready``), and the conditional
UPDATE in ``approvals.expire_due`` lets exactly one of them expire each question.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import User as AuthUser

from omnigent_runner.protocol import ApprovalVerdict, PolicyRule, PolicyUpdate
from omnigent_site.domain_errors import AgentUnavailable, Conflict
from sessions import approvals, policies
from sessions.blobs import BundleMissing
from sessions.models import Approval, Session

from .budget_updates import push_session_budgets
from .relay import RelayError, post_command, send_command

log = logging.getLogger(__name__)


def verdict_command(approval: Approval) -> ApprovalVerdict:
    stored = approvals.verdict(approval)
    return ApprovalVerdict(
        session_id=approval.session_id,
        elicitation_id=stored.elicitation_id,
        response_id=stored.response_id,
        call_id=stored.call_id,
        action=stored.action,
        reason=stored.reason,
        resolved_by=stored.resolved_by,
        content=stored.content or None,
    )


async def relay_verdict(*, session: Session, approval: Approval) -> bool:
    """Send the verdict and wait for the runner's ack, within the relay's deadline.

    False when the runner is offline or did not take it: the verdict is stored
    anyway and reaches the runner with ``session.open`` when it reconnects.
    ``session.runner`` was loaded by the request's permission check.
    """
    runner = session.runner
    if runner is None or not runner.online:
        return False
    try:
        await send_command(channel_name=runner.channel_name, command=verdict_command(approval))
    except RelayError as exc:
        log.info("verdict %s for %s not delivered: %s", approval.id, session.id, exc.message)
        return False
    return True


async def answer_elicitation(
    *,
    session: Session,
    approval_id: str,
    action: object,
    reason: str | None,
    user: AuthUser,
    content: dict[str, Any] | None = None,
) -> None:
    """Store the verdict, then relay it (approvals.md, Answering).

    Stored first: a runner that is offline, or does not answer within the relay's
    deadline, gets it with ``session.open`` when it reconnects, so this never
    answers 503. The same action again changes nothing; another one is a 409.
    """
    resolution = await sync_to_async(approvals.resolve)(
        session_id=session.id,
        approval_id=approval_id,
        action=approvals.check_action(action),
        user=user,
        reason=reason,
        content=content,
    )
    approval = resolution.approval
    if resolution.stored:
        await relay_verdict(session=session, approval=approval)
    if resolution.budget_raised:
        # After the verdict, which the runner applies first: the stored numbers then
        # replace its own (usage.md, Budgets).
        await sync_to_async(_push_budgets)(session_id=session.id)
    if resolution.conflict:
        raise Conflict(
            f"elicitation {approval.id!r} is already {approval.status}: the first verdict stands"
        )


def _push_budgets(*, session_id: str) -> None:
    session = Session.objects.select_related("agent", "runner").get(pk=session_id)
    push_session_budgets(sessions=[session])


def effective_policies(*, session: Session) -> tuple[list[PolicyRule], int]:
    """``policies.effective``, with a bundle this server cannot see as a 503 (logged)."""
    try:
        return policies.effective(session=session)
    except BundleMissing as exc:
        log.error("session %s: %s", session.id, exc)
        raise AgentUnavailable(str(exc)) from exc


async def replace_policies(
    *, session: Session, user: AuthUser, raw: object
) -> tuple[list[PolicyRule], int]:
    """Store the session's own rules, then send the effective ones to a runner running
    the session; returns them and how many are the session's.

    Best effort, like a verdict: the runner applies them from its next tool call, and
    an offline runner, or one that does not answer, gets them with ``session.open``.
    """
    session = await sync_to_async(policies.replace_session_rules)(
        session=session, user=user, raw=raw
    )
    rules, own = await sync_to_async(effective_policies)(session=session)
    runner = session.runner
    if runner is not None and runner.online:
        try:
            await send_command(
                channel_name=runner.channel_name,
                command=PolicyUpdate(session_id=session.id, rules=rules),
            )
        except RelayError as exc:
            log.info("policy.update for %s not delivered: %s", session.id, exc.message)
    return rules, own


def post_verdicts(*, channel_name: str, approvals: Iterable[Approval]) -> None:
    """Fire-and-forget the verdicts to a runner's tunnel (from sync code).

    Nobody waits for the answer; the consumer still marks each verdict acknowledged
    when the runner acks it, and an unacknowledged one goes out with ``session.open``.
    """
    if not channel_name:
        return
    for approval in approvals:
        async_to_sync(post_command)(channel_name=channel_name, command=verdict_command(approval))


def _expire_and_notify() -> int:
    expired = approvals.expire_due()
    if not expired:
        return 0
    sessions = Session.objects.filter(pk__in={approval.session_id for approval in expired})
    channels = {
        session.id: session.runner.channel_name if session.runner is not None else ""
        for session in sessions.select_related("runner")
    }
    for approval in expired:
        post_verdicts(channel_name=channels.get(approval.session_id, ""), approvals=[approval])
    return len(expired)


async def sweep_expired_approvals() -> int:
    """Expire the questions past their deadline and tell their runners (``cancel``,
    ``unanswered``); returns how many this process expired."""
    try:
        count: int = await database_sync_to_async(_expire_and_notify)()
    except Exception:
        log.exception("could not sweep expired approvals")
        return 0
    if count:
        log.info("expired %d unanswered approval(s)", count)
    return count


def sweep_interval_s() -> float:
    return max(float(settings.OMNIGENT_APPROVAL_SWEEP_S), 0.05)


async def sweep_expired_approvals_forever() -> None:
    """The process-wide loop: a sweep every ``OMNIGENT_APPROVAL_SWEEP_S``, until cancelled."""
    while True:
        await asyncio.sleep(sweep_interval_s())
        await sweep_expired_approvals()
