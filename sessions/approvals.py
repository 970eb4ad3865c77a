"""Every write to approvals (approvals.md): asked, answered, expired, cancelled, acknowledged.

An approval is asked once per ``(turn, call_id)``, however often the runner's event
arrives (a duplicate delivery, or a restarted runner re-running the turn). A verdict
is set by one conditional ``UPDATE … WHERE status = 'pending'``, so of two server
processes answering (or one answering while another expires the question) exactly one
wins, and only the winner publishes ``response.elicitation_resolved``. Relaying a
verdict to the runner is the caller's part (``runners.verdicts``): this module stays
below ``runners``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit import actions as audit_actions
from audit import services as audit
from omnigent_runner import protocol
from omnigent_site.domain_errors import InvalidInput, NotFound

from . import budgets, selectors, updates, webhook_events
from .approval_shapes import approval_message, budget_message
from .eventlog import WriteUnit, record_event
from .models import Approval, Session, Turn
from .stream_events import elicitation_request_event, elicitation_resolved_event

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

log = logging.getLogger(__name__)

ACTIONS = ("accept", "decline", "cancel")
STATUS_OF_ACTION = {
    "accept": Approval.Status.ACCEPTED,
    "decline": Approval.Status.DECLINED,
    "cancel": Approval.Status.CANCELLED,
}
UNANSWERED = "unanswered"
MAX_REASON_CHARS = 2000
MAX_MESSAGE = 4000
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


# --- asking -----------------------------------------------------------------------------


def ask_timeout_cap() -> float:
    """``OMNIGENT_ASK_TIMEOUT_S``: no question waits longer (a bad value means the default)."""
    cap = float(settings.OMNIGENT_ASK_TIMEOUT_S)
    return cap if cap > 0 else 3600.0


def _storable(value: Any) -> Any:
    """``value`` with NUL and lone surrogates replaced: PostgreSQL refuses to store them,
    and a question that cannot be stored would leave the call waiting for nothing."""
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_storable(key): _storable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_storable(item) for item in value]
    return value


@dataclass(frozen=True)
class Asked:
    approval: Approval
    # False: the call was asked about before (a redelivery or a re-run turn).
    created: bool


def record_requested(
    *,
    session: Session,
    turn: Turn,
    event: protocol.ApprovalRequested,
    unit: WriteUnit | None = None,
) -> Asked:
    """Store the question (once per turn and call) and show it to watchers.

    Runs inside ``runners.runner_events.record``, which holds the session row lock and
    passes its unit of work.
    When the call was asked about before, nothing new is shown; if it already has a
    verdict, that verdict is marked unacknowledged, so the caller relays it again and
    a later ``session.open`` carries it until the runner acknowledges it.
    """
    existing = Approval.objects.filter(
        session=session, response_id=turn.id, call_id=event.call_id
    ).first()
    if existing is not None:
        return Asked(_asked_again(existing), created=False)
    arguments = _storable(event.arguments)
    tool = _storable(event.tool)
    seconds = min(event.ask_timeout if event.ask_timeout > 0 else 3600.0, ask_timeout_cap())
    now = timezone.now()
    question = event.elicitation
    message = approval_message(tool, arguments)
    if (
        question is None
        and event.phase == "budget"
        and isinstance(arguments, dict)
        and arguments.get("kind") == "budget"
    ):
        # No tool call: a spent budget before a model call (usage.md, Budgets).
        tool = ""
        message = budget_message(arguments)
    requested_schema: dict[str, Any] | None = None
    if question is not None:
        # An MCP server's own question (mcp.md): its sentence and its answer's schema.
        text = question.get("message")
        message = _storable(text if isinstance(text, str) and text else message)[:MAX_MESSAGE]
        schema = question.get("requestedSchema")
        requested_schema = _storable(schema) if isinstance(schema, dict) else {}
    try:
        with transaction.atomic():
            approval = Approval.objects.create(
                session=session,
                response_id=turn.id,
                call_id=event.call_id,
                tool=tool,
                arguments=arguments,
                policy_name=_storable(event.policy_name),
                policy_reason=_storable(event.reason or ""),
                message=message,
                expires_at=now + timedelta(seconds=seconds),
                requested_schema=requested_schema,
            )
    except IntegrityError:
        # Another writer stored it first (the session lock makes this rare).
        again = Approval.objects.get(session=session, response_id=turn.id, call_id=event.call_id)
        return Asked(_asked_again(again), False)
    record_event(session_id=session.id, payload=elicitation_request_event(approval), unit=unit)
    webhook_events.approval_requested(approval)
    # Its list row counts open questions.
    updates.announce_session(session_id=session.id, unit=unit)
    return Asked(approval, created=True)


def _asked_again(approval: Approval) -> Approval:
    if approval.status != Approval.Status.PENDING and approval.runner_acked:
        Approval.objects.filter(pk=approval.pk).update(runner_acked=False)
        approval.runner_acked = False
    return approval


# --- answering --------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolution:
    approval: Approval
    # This call stored a new verdict (an answer, or the expiry it found due): relay it.
    stored: bool
    # The question already had another verdict: the first one stands (409).
    conflict: bool
    # An accepted budget question raised a budget: the runner gets the new numbers.
    budget_raised: bool = False


def check_action(action: Any) -> str:
    if action not in ACTIONS:
        raise InvalidInput("must be 'accept', 'decline' or 'cancel'", field="action")
    return str(action)


def resolve(
    *,
    session_id: str,
    approval_id: str,
    action: str,
    user: AuthUser | None,
    reason: str | None = None,
    content: dict[str, Any] | None = None,
) -> Resolution:
    """Store a person's verdict unless the question already has one.

    The same action again is idempotent; a different one is a conflict. A question
    past its deadline is expired here (the server decides expiry from the stored
    deadline, whether or not a sweep ran yet), and then only ``cancel`` matches it.
    An MCP server's question (``requested_schema``) keeps an accepted ``content``
    that matches its schema; one that does not is stored, and reaches the server,
    as ``decline`` (mcp.md).
    """
    action = check_action(action)
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        raise InvalidInput(f"must be at most {MAX_REASON_CHARS} characters", field="reason")
    approval = Approval.objects.filter(pk=approval_id, session_id=session_id).first()
    if approval is None:
        raise NotFound(f"elicitation {approval_id!r} not found")
    now = timezone.now()
    if approval.status == Approval.Status.PENDING and approval.expires_at <= now:
        expired = _expire(approval.pk, now=now)
        if expired is not None:
            return Resolution(expired, stored=True, conflict=action != "cancel")
    budgets.check_may_accept(approval=approval, user=user, action=action)
    stored_action, answer = action, None
    if approval.requested_schema is not None and action == "accept":
        problem = schema_problem(approval.requested_schema, content or {})
        if problem is None:
            answer = _storable(content or {})
        else:
            stored_action = "decline"
            reason = f"the answer does not match the requested schema: {problem}"
    with transaction.atomic():
        won = Approval.objects.filter(
            pk=approval.pk, status=Approval.Status.PENDING, expires_at__gt=now
        ).update(
            status=STATUS_OF_ACTION[stored_action],
            resolved_at=now,
            resolved_by=user,
            reason=reason or None,
            runner_acked=False,
            content=answer,
        )
        approval = Approval.objects.select_related("resolved_by").get(pk=approval.pk)
        if won:
            _audit_verdict(approval, actor=user)
            # An accepted budget question raises that budget with the verdict.
            raised = budgets.raise_for_accepted(approval=approval, actor=user)
            _publish_resolved(approval)
            return Resolution(approval, stored=True, conflict=False, budget_raised=raised)
    return Resolution(approval, stored=False, conflict=approval.action != action)


def schema_problem(schema: dict[str, Any], content: Any) -> str | None:
    """Why ``content`` does not match ``schema`` (JSON Schema), or None when it does.
    A schema that is itself invalid accepts nothing."""
    import jsonschema

    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
        error = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(content))
    except jsonschema.exceptions.SchemaError as exc:
        return f"the requested schema is invalid: {exc.message}"
    if error is None:
        return None
    where = ".".join(str(part) for part in error.absolute_path)
    return f"{where}: {error.message}"[:500] if where else error.message[:500]


def _audit_verdict(approval: Approval, *, actor: AuthUser | None) -> None:
    """The verdict's audit record, in the transaction that stored the verdict."""
    audit.record(
        actor=actor,
        action=audit_actions.APPROVAL_VERDICT,
        target_type="elicitation",
        target_id=approval.id,
        session_id=approval.session_id,
        details={
            "tool": approval.tool,
            "arguments_sha256": audit.arguments_sha256(approval.arguments),
            "verdict": approval.status,
            "reason": approval.reason,
            "call_id": approval.call_id,
            "response_id": approval.response_id,
        },
    )


def _publish_resolved(approval: Approval, *, unit: WriteUnit | None = None) -> None:
    user = approval.resolved_by
    record_event(
        session_id=approval.session_id,
        payload=elicitation_resolved_event(
            approval, resolved_by=user.get_username() if user is not None else None
        ),
        unit=unit,
    )
    updates.announce_session(session_id=approval.session_id, unit=unit)
    webhook_events.approval_resolved(approval)


def _expire(pk: str, *, now: datetime) -> Approval | None:
    """Expire one question if it is still pending and due; None when another writer won."""
    with transaction.atomic():
        won = Approval.objects.filter(
            pk=pk, status=Approval.Status.PENDING, expires_at__lte=now
        ).update(status=Approval.Status.EXPIRED, resolved_at=now, reason=UNANSWERED)
        if not won:
            return None
        approval = Approval.objects.get(pk=pk)
        _audit_verdict(approval, actor=None)
        _publish_resolved(approval)
    return approval


def expire_due(*, limit: int = 200) -> list[Approval]:
    """Expire the questions past their deadline; returns those this call expired.

    Every server process calls this (``runners.verdicts``); the conditional UPDATE
    makes each question expire once, whichever process gets there first.
    """
    now = timezone.now()
    due = Approval.objects.filter(status=Approval.Status.PENDING, expires_at__lte=now)
    expired = []
    for pk in due.order_by("expires_at").values_list("pk", flat=True)[:limit]:
        approval = _expire(pk, now=now)
        if approval is not None:
            expired.append(approval)
    return expired


def cancel_pending(
    *,
    session_id: str,
    reason: str,
    user: AuthUser | None = None,
    turn_ids: list[str] | None = None,
    unit: WriteUnit | None = None,
) -> list[Approval]:
    """Cancel the open questions of a session (an interrupt) or of some of its turns
    (a turn that ended); returns those this call cancelled."""
    # Every turn's end comes here, and mostly nothing is open: the plain-SQL read the
    # snapshot makes, filtered here, instead of building an ORM query each time.
    pending = [
        approval.pk
        for approval in selectors.pending_approvals(session_id=session_id)
        if turn_ids is None or approval.response_id in turn_ids
    ]
    cancelled = []
    now = timezone.now()
    for pk in pending:
        with transaction.atomic():
            won = Approval.objects.filter(pk=pk, status=Approval.Status.PENDING).update(
                status=Approval.Status.CANCELLED, resolved_at=now, resolved_by=user, reason=reason
            )
            if not won:
                continue
            approval = Approval.objects.select_related("resolved_by").get(pk=pk)
            _audit_verdict(approval, actor=user)
            _publish_resolved(approval, unit=unit)
        cancelled.append(approval)
    return cancelled


# --- the runner's side ------------------------------------------------------------------


def mark_acked(*, approval_ids: list[str]) -> int:
    """The runner acknowledged these verdicts: ``session.open`` stops carrying them."""
    return (
        Approval.objects.filter(pk__in=approval_ids)
        .exclude(status=Approval.Status.PENDING)
        .update(runner_acked=True)
    )


def unacked_verdicts(*, session_id: str) -> QuerySet[Approval]:
    """Verdicts the runner has not acknowledged, for calls of turns still open."""
    return (
        Approval.objects.filter(
            session_id=session_id,
            runner_acked=False,
            response_id__in=Turn.objects.filter(
                session_id=session_id, status__in=Turn.OPEN_STATUSES
            ).values("id"),
        )
        .exclude(status=Approval.Status.PENDING)
        .select_related("resolved_by")
    )


def verdict(approval: Approval) -> protocol.Verdict:
    """The verdict as ``session.open`` carries it (``resolved_by`` loaded with the row)."""
    action = approval.action
    assert action is not None, "a pending approval has no verdict"
    user = approval.resolved_by
    return protocol.Verdict(
        elicitation_id=approval.id,
        response_id=approval.response_id,
        call_id=approval.call_id,
        action=action,  # type: ignore[arg-type]
        reason=approval.reason,
        resolved_by=user.get_username() if user is not None else None,
        content=approval.content
        if action == "accept" and approval.content is not None
        else msgspec.UNSET,
    )
