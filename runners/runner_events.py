"""Turn and session state driven by the runner, and the commands that start turns.

``record`` stores each runner event once per ``(session_id, seq)`` and applies it with
the handler for its type (``HANDLERS``): items, turn status, session status (with
sticky ``failed``), file changes, and an entry in the session event log for watchers
(built by ``sessions.stream_events``). Views call ``accept_message`` and
``fail_turn``; the tunnel consumer calls ``record``. Nothing else writes these facts.
"""

from __future__ import annotations

import base64
import functools
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeAlias, TypeVar

from asgiref.sync import async_to_sync
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from msgspec import UnsetType

from omnigent_runner import protocol
from omnigent_site import metrics
from omnigent_site.ids import new_item_id
from omnigent_site.observability import current_request_id
from omnigent_site.rawsql import (
    first_row,
    insert_row,
    joined_columns,
    locking,
    quoted,
    row_by,
    update_row,
)
from omnigent_site.timeutil import unix
from sessions import approvals, blobs, budgets, policies, updates, webhook_events
from sessions import files as session_files
from sessions.eventlog import (
    WriteUnit,
    at_block_end,
    publishing_together,
    record_event,
    save_session_fields,
    writing_events,
)
from sessions.mcp_shapes import clean_states
from sessions.models import Agent, Item, Session, Turn
from sessions.selectors import response_output
from sessions.shapes import ResponseEventOut, response_event_body
from sessions.stream_events import (
    RESPONSE_END_EVENTS,
    changed_files_invalidated_event,
    input_consumed_event,
    mcp_status_event,
    output_item_done_event,
    output_text_delta_event,
    policy_denied_event,
    response_event,
    session_status_event,
    session_usage_event,
)
from usage import selectors as usage_selectors
from usage import services as usage_services
from usage.shapes import add_to_session_totals, add_to_turn, session_usage_from_totals
from workspaces.services import apply_workspace_changes

from . import scheduler
from .models import Runner
from .relay import post_command
from .verdicts import post_verdicts

log = logging.getLogger(__name__)

_T = TypeVar("_T")

ITEM_HEADER_KEYS = {"id", "type", "status", "response_id", "created_at", "created_by"}
TURN_END_STATUS: dict[type[protocol.TurnEnd], str] = {
    protocol.ResponseCompleted: Turn.Status.COMPLETED,
    protocol.ResponseFailed: Turn.Status.FAILED,
    protocol.ResponseCancelled: Turn.Status.CANCELLED,
}
# What the consumer hands to ``record``: session id, seq and the parsed payload.
ReceivedEvent: TypeAlias = tuple[str, int, protocol.AnyEvent | protocol.UnparsedEvent]


class MalformedEvent(ValueError):
    """A runner event that cannot be applied; it is logged, acknowledged and skipped."""


# --- commands ---------------------------------------------------------------------


def session_open_command(*, session: Session) -> protocol.SessionOpen:
    agent = session.agent
    bundle = blobs.read_bundle(agent.bundle_sha256)
    # A turn the runner has not started (waiting for a slot, or sent behind another)
    # brings its input with its own ``turn.start``: in the history, the model would
    # read it during the turns before it.
    not_started = scheduler.unstarted_turn_ids(session_id=session.id)
    history = [
        item.flat()
        for item in Item.objects.filter(session=session).order_by("seq")
        if not (item.response_id in not_started and item.data.get("role") == "user")
    ]
    return protocol.SessionOpen(
        session_id=session.id,
        # The runner numbers this session's events after what the server stored.
        last_acked_seq=session.last_runner_seq,
        agent=protocol.AgentRef(
            id=agent.id,
            version=agent.version,
            bundle_b64=base64.b64encode(bundle).decode("ascii"),
        ),
        history=history,
        policies=policies.effective(session=session)[0],
        verdicts=[
            approvals.verdict(approval)
            for approval in approvals.unacked_verdicts(session_id=session.id)
        ],
        budgets=budgets.budgets_for(session),
    )


def turn_start_command(
    *,
    response: Turn,
    inputs: Sequence[Item] | None = None,
    budgets_now: protocol.Budgets | None = None,
) -> protocol.TurnStart:
    """``inputs``: the turn's user items when the caller has them (a turn just accepted
    has exactly its message); read from the database otherwise. ``budgets_now``: the
    session's budgets when the caller has them (usage.md, Budgets); read otherwise.
    The command carries
    the id of the request this code runs for, if any (the message's ``X-Request-ID``),
    so the runner's log lines of the turn carry it too."""
    if inputs is None:
        inputs = list(
            Item.objects.filter(
                session_id=response.session_id, response_id=response.id, data__role="user"
            ).order_by("seq")
        )
    if budgets_now is None:
        session = Session.objects.select_related("agent").get(pk=response.session_id)
        budgets_now = budgets.budgets_for(session)
    return protocol.TurnStart(
        session_id=response.session_id,
        response_id=response.id,
        # File blocks carry the file's bytes here, and only here (files.md §1).
        input=[
            session_files.expand_file_blocks(session_id=response.session_id, item=item.flat())
            for item in inputs
        ],
        tools=response.tools or [],
        request_id=current_request_id(),
        budgets=budgets_now,
    )


# --- event payloads for watchers --------------------------------------------------


def response_payload(
    response: Turn, *, model: str, output: list[dict[str, Any]] | None = None
) -> ResponseEventOut:
    """The ``response`` of ``response.*`` stream events: the shape of ``sessions.shapes``.

    ``output``: the turn's output when the caller knows it; read otherwise."""
    if output is None:
        output = response_output(response=response)
    return response_event_body(response, output=output, model=model)


def _set_session_state(
    session: Session,
    *,
    status: str,
    response_id: str | None,
    error: dict | None = None,
    unit: WriteUnit | None = None,
) -> None:
    """The one writer of session status; records ``session.status`` when it changes."""
    if status == Session.Status.IDLE and session.status == Session.Status.FAILED:
        # Sticky: a failure stays visible until the next turn starts.
        status, error = Session.Status.FAILED, session.last_task_error
        response_id = None
    if status in (Session.Status.RUNNING, Session.Status.IDLE):
        error = None
    if (session.status, session.active_response_id, session.last_task_error) == (
        status,
        response_id,
        error,
    ):
        return
    session.status = status
    session.active_response_id = response_id
    session.last_task_error = error
    save_session_fields(
        session, ["status", "active_response_id", "last_task_error", "updated_at"], unit=unit
    )
    record_event(session_id=session.id, payload=session_status_event(session), unit=unit)
    updates.announce_session(session_id=session.id, unit=unit)


def _finish_turn(
    response: Turn,
    *,
    status: str,
    error: dict | None,
    model: str,
    agent: str,
    unit: WriteUnit | None = None,
    reported: protocol.ErrorInfo | None = None,
    also_write: Sequence[str] = (),
    session: Session | None = None,
) -> bool:
    """End an open turn (False: it had ended already, nothing written). ``reported``:
    the runner's own error, whose budget (a ``budget_exceeded`` failure's scope and
    amounts, when it names them) goes into the ``budget.exceeded`` webhook event.
    ``also_write``: fields of ``response`` changed in memory that the end's UPDATE
    writes too. ``session``: the turn's session row as the caller holds it (locked),
    whose ``usage_totals`` ``session.usage`` shows; read otherwise."""
    if not response.is_open:
        return False
    response.status = status
    response.error = error
    response.completed_at = timezone.now()
    update_row(response, ["status", "error", "completed_at", *also_write])
    webhook_events.turn_ended(response)
    if status == Turn.Status.FAILED and (error or {}).get("code") == "budget_exceeded":
        # An older runner's error names no budget: those fields stay null.
        named = reported or protocol.ErrorInfo()
        webhook_events.budget_exceeded(
            session_id=response.session_id,
            response_id=response.id,
            scope=_set_or_none(named.scope),
            budget_usd=_set_or_none(named.budget_usd),
            spent_usd=_set_or_none(named.spent_usd),
            error=error,
            status=status,
        )
    seconds = (
        (response.completed_at - response.created_at).total_seconds()
        if response.created_at
        else None
    )
    # Counted once the end is stored: a run that rolls back (and is applied again event
    # by event) counts nothing.
    transaction.on_commit(lambda: metrics.turn_ended(agent=agent, status=status, seconds=seconds))
    # Its slot is free (or its place in the queue is): the next waiting turn may start.
    if response.dispatched_at is None:
        session_id = response.session_id
        transaction.on_commit(lambda: start_waiting_turns(touched=[session_id]))
    else:
        transaction.on_commit(start_waiting_turns_if_any)
    # A question about a call of a finished turn can no longer be acted on.
    approvals.cancel_pending(
        session_id=response.session_id, turn_ids=[response.id], reason="the turn ended", unit=unit
    )
    if response.usage:
        # The session's new totals reach watchers before the turn's end (docs/usage.md).
        totals = (
            session_usage_from_totals(session.usage_totals)
            if session is not None
            else usage_selectors.session_usage(session_id=response.session_id)
        )
        if totals is not None:
            record_event(
                session_id=response.session_id,
                payload=session_usage_event(session_id=response.session_id, usage=totals),
                unit=unit,
            )
    record_event(
        session_id=response.session_id,
        payload=response_event(
            RESPONSE_END_EVENTS[status], response_payload(response, model=model)
        ),
        unit=unit,
    )
    return True


# --- views: accepting a user message ------------------------------------------------


def accept_message(
    *,
    session_id: str,
    created_by: str,
    data: dict[str, Any],
    tools: list[dict[str, Any]],
    unit: WriteUnit | None = None,
    user_id: int | None = None,
    runner: Runner | None = None,
) -> tuple[Item, Turn]:
    """Store the user item and its queued turn, and tell watchers the input was consumed.

    ``user_id``: whose turn it is for fair share (``runners.scheduler``); the session's
    creator when not given. The turn waits for a slot until ``scheduler.claim`` starts it,
    unless ``runner`` (the session's, as the caller read it) has a slot for it now and
    nothing waits (``scheduler.starts_at_once``): then it is stored dispatched
    (``dispatched_at`` set) and no claim is needed.

    The stream events and the list row it announces go to the channel layer together,
    in one trip to the event loop, which the ``202`` waits for (or with what ``unit``
    publishes: ``dispatch`` collects them for the event loop to send).
    """
    with publishing_together(unit) as publishing, transaction.atomic():
        session = row_by(Session, "id", session_id, for_update=True)
        if session is None:
            raise Session.DoesNotExist(f"session {session_id} does not exist")
        with writing_events(session=session, unit=publishing) as writing:
            item, response = _store_message(
                session,
                created_by=created_by,
                data=data,
                tools=tools,
                unit=writing,
                user_id=user_id if user_id is not None else session.created_by_id,
                runner=runner,
            )
    return item, response


def _store_message(
    session: Session,
    *,
    created_by: str,
    data: dict[str, Any],
    tools: list[dict[str, Any]],
    unit: WriteUnit,
    user_id: int | None,
    runner: Runner | None = None,
) -> tuple[Item, Turn]:
    """Inside ``accept_message``'s transaction, with the session row locked."""
    at_once = runner is not None and scheduler.starts_at_once(
        session=session, runner=runner, user_id=user_id
    )
    response = Turn(
        session=session,
        tools=tools,
        user_id=user_id,
        dispatched_at=timezone.now() if at_once else None,
        start_acked_at=None,
    )
    insert_row(response)
    item = Item(
        session=session,
        id=new_item_id(),
        response_id=response.id,
        type="message",
        status="completed",
        data=data,
        created_by=created_by,
    )
    insert_row(item)
    record_event(
        session_id=session.id,
        payload=input_consumed_event(item_id=item.id, item_type=item.type, data=item.data),
        unit=unit,
    )
    if session.archived_at is not None:
        # A message brings an archived session back (lifecycle.md, Retention).
        session.archived_at = None
        save_session_fields(session, ["archived_at", "updated_at"], unit=unit)
        updates.announce_session(session_id=session.id, unit=unit)
    if session.status in (Session.Status.IDLE, Session.Status.FAILED):
        _set_session_state(
            session, status=Session.Status.RUNNING, response_id=response.id, unit=unit
        )
    return item, response


def fail_turn(*, session_id: str, response_id: str, code: str, message: str) -> None:
    """End one turn as failed and make the session show the error."""
    _fail_turns(session_id=session_id, error={"code": code, "message": message}, only=response_id)


def fail_open_turns(*, session_id: str, code: str, message: str) -> None:
    _fail_turns(session_id=session_id, error={"code": code, "message": message})


def _fail_turns(*, session_id: str, error: dict[str, str], only: str | None = None) -> None:
    """End the session's open turns (or just ``only``) as failed; the session shows
    ``error``."""
    with transaction.atomic():
        session = Session.objects.select_for_update().select_related("agent").get(pk=session_id)
        turns = Turn.objects.filter(session=session, status__in=Turn.OPEN_STATUSES)
        if only is not None:
            turns = turns.filter(id=only)
        for response in turns:
            _finish_turn(
                response,
                status=Turn.Status.FAILED,
                error=error,
                model=session.agent.model,
                agent=session.agent.name,
                session=session,
            )
        _set_session_state(session, status=Session.Status.FAILED, response_id=None, error=error)


def mark_session_opened(*, session_id: str, generation: int) -> None:
    Session.objects.filter(pk=session_id).update(runner_generation_opened=generation)


def mark_starts_acked(*, starts: Collection[tuple[str, str]]) -> int:
    """Record that the runner acknowledged the ``turn.start`` of each ``(session_id,
    response_id)``: one UPDATE for all of them. A turn without this mark is sent its
    ``turn.start`` again on the runner's next tunnel (``services.sessions_to_resume``),
    so a command lost with a closing tunnel is not lost for good. Returns the rows
    changed (a mark already there, or a turn gone, changes none)."""
    if not starts:
        return 0
    named = Q()
    for session_id, response_id in starts:
        named |= Q(session_id=session_id, id=response_id)
    return Turn.objects.filter(named, start_acked_at__isnull=True).update(
        start_acked_at=timezone.now()
    )


# --- the consumer: runner events ------------------------------------------------------


def record(
    *,
    runner_id: str,
    session_id: str,
    events: Sequence[tuple[int, protocol.AnyEvent | protocol.UnparsedEvent]],
    unit: WriteUnit | None = None,
) -> int:
    """Apply a run of ``session_id``'s runner events, each once; returns the seq to acknowledge.

    The run is one transaction: the session row is read and locked once, its events
    are numbered in memory and stored together (``eventlog.writing_events``), and
    ``last_runner_seq`` is written once. If the run fails as a whole (an error other
    than a malformed event), each event is applied again in a transaction of its own,
    so one bad event cannot hold the others back.

    A duplicate (``seq`` already stored) changes nothing. Events for a session that
    is gone or bound to another runner are acknowledged and dropped, so the runner
    does not hold them forever. A payload the protocol module could not parse
    arrives as ``UnparsedEvent`` and is skipped. ``unit``: the caller's publishing unit
    (``services.record_runner_events``), which then publishes what the run produced.
    """
    try:
        return _record_run(runner_id=runner_id, session_id=session_id, events=events, unit=unit)
    except Exception:
        if len(events) == 1:
            raise
        log.exception(
            "session %s: storing %d runner events together failed; storing them one by one",
            session_id,
            len(events),
        )
    acked = 0
    for event in events:
        acked = _record_run(runner_id=runner_id, session_id=session_id, events=[event], unit=unit)
    return acked


def _record_run(
    *,
    runner_id: str,
    session_id: str,
    events: Sequence[tuple[int, protocol.AnyEvent | protocol.UnparsedEvent]],
    unit: WriteUnit | None,
) -> int:
    with transaction.atomic():
        session = _locked_session_with_agent(session_id)
        if session is None or session.runner_id != runner_id:
            log.info(
                "dropped %d events for session %s not bound to %s",
                len(events),
                session_id,
                runner_id,
            )
            return max(seq for seq, _event in events)
        stored = session.last_runner_seq
        with writing_events(session=session, unit=unit) as writing:
            run = _Run(session, unit=writing)
            for seq, event in events:
                if seq <= session.last_runner_seq:
                    continue
                if seq > session.last_runner_seq + 1:
                    log.warning(
                        "session %s: runner events jumped from %s to %s",
                        session_id,
                        session.last_runner_seq,
                        seq,
                    )
                try:
                    _apply(run, event)
                except MalformedEvent as exc:
                    log.warning(
                        "session %s: skipped malformed runner event %s: %s", session_id, seq, exc
                    )
                session.last_runner_seq = seq
            if session.last_runner_seq != stored:
                save_session_fields(session, ["last_runner_seq"], unit=writing)
        return session.last_runner_seq


def _error(error: protocol.ErrorInfo | None) -> dict[str, str] | None:
    """A runner-reported error as stored on turns and sessions (a code is never empty)."""
    if error is None:
        return None
    return {"code": error.code or "error", "message": error.message}


def _set_or_none(value: _T | UnsetType) -> _T | None:
    """An optional protocol field as stored: None when the runner left it out."""
    return None if isinstance(value, UnsetType) else value


@functools.cache
def _session_with_agent_sql() -> str:
    return (
        f"SELECT s.*, {joined_columns(Agent, 'a', 'agent')} FROM {quoted(Session)} s "
        f"JOIN {quoted(Agent)} a ON a.{quoted(Agent, 'id')} = s.{quoted(Session, 'agent')} "
        f"WHERE s.{quoted(Session, 'id')} = %s"
    )


def _locked_session_with_agent(session_id: str) -> Session | None:
    """The session row, locked until the transaction ends, with its agent (whose model
    the ``response`` payloads name): one plain query (rawsql.py) instead of two ORM ones."""
    # Only the session row: the agent is read, not written.
    sql = locking(_session_with_agent_sql(), of="s")
    return first_row(Session, sql, [session_id], joined={"agent": Agent})


@functools.cache
def _session_turn_sql() -> str:
    """The session's turn with the given id (response ids are unique per session)."""
    return (
        f"SELECT * FROM {quoted(Turn)} "
        f"WHERE {quoted(Turn, 'session')} = %s AND {quoted(Turn, 'id')} = %s"
    )


class _Run:
    """One run of a session's runner events: the locked session, and each turn its
    events name, read once (a turn that ends in the same run as its last item is
    named twice), and the unit of work its writes go to."""

    def __init__(self, session: Session, *, unit: WriteUnit) -> None:
        self.session = session
        self.unit = unit
        self._turns: dict[str, Turn | None] = {}
        # LLM calls recorded in the run and not yet stored (``_apply_usage``).
        self.calls: list[usage_services.PricedCall] = []
        # Turns whose ``usage`` changed in memory and is not written yet: a turn that
        # ends in the run writes it with its end, in the same UPDATE.
        self.usage_unwritten: set[str] = set()

    def store_calls(self) -> None:
        """Store the run's pending LLM calls and add them to the totals (one statement
        on PostgreSQL); the totals are read at a turn's end, so it stores them first."""
        calls, self.calls = self.calls, []
        usage_services.record_calls(
            session_id=self.session.id,
            user_id=self.session.created_by_id,
            agent_name=self.session.agent.name,
            calls=calls,
        )

    def turn(self, response_id: str | None) -> Turn | None:
        if not response_id:
            return None
        if response_id not in self._turns:
            self._turns[response_id] = first_row(
                Turn, _session_turn_sql(), [self.session.id, response_id]
            )
        return self._turns[response_id]

    @property
    def model(self) -> str:
        """The session's model name for ``response`` payloads (its agent came with it)."""
        return self.session.agent.model


def _apply(run: _Run, event: protocol.AnyEvent | protocol.UnparsedEvent) -> None:
    """Apply one runner event with the handler for its type (``HANDLERS``), as Channels
    dispatches a message by its type. An event the protocol module could not parse, or
    one no handler takes, is malformed: logged, acknowledged and skipped by ``record``."""
    if isinstance(event, protocol.UnparsedEvent):
        raise MalformedEvent(event.error)
    handler = HANDLERS.get(type(event))
    if handler is None:
        raise MalformedEvent(f"{protocol.frame_type(event)} is not handled by this server")
    handler(run, event)


def _apply_text_delta(run: _Run, event: protocol.OutputTextDelta) -> None:
    record_event(
        unit=run.unit,
        session_id=run.session.id,
        payload=output_text_delta_event(
            response_id=event.response_id, item_id=event.item_id, delta=event.delta
        ),
    )


def _apply_response_created(run: _Run, event: protocol.ResponseCreated) -> None:
    """A turn starts: ``queued`` becomes ``in_progress``; watchers get both events."""
    response = run.turn(event.response_id)
    if response is None:
        raise MalformedEvent("response.created for an unknown response")
    output: list[dict[str, Any]] | None = None
    if response.status == Turn.Status.QUEUED:
        response.status = Turn.Status.IN_PROGRESS
        # A turn that runs was handed over: its ``turn.start`` needs no resend, even
        # if its ``ack`` is lost with the tunnel (``mark_starts_acked``).
        fields = ["status"]
        if response.start_acked_at is None:
            response.start_acked_at = timezone.now()
            fields.append("start_acked_at")
        update_row(response, fields)
        agent = run.session.agent.name
        transaction.on_commit(lambda: metrics.turn_started(agent=agent))
        output = []  # nothing of a turn that only now starts (its input is not output)
    body = response_payload(response, model=run.model, output=output)
    for event_type in ("response.created", "response.in_progress"):
        record_event(
            unit=run.unit, session_id=run.session.id, payload=response_event(event_type, body)
        )


def _apply_turn_end(run: _Run, event: protocol.TurnEnd) -> None:
    response = run.turn(event.response_id)
    if response is None:
        raise MalformedEvent(f"{protocol.frame_type(event)} for an unknown response")
    run.store_calls()  # the session's totals are read for ``session.usage``
    usage_pending = response.id in run.usage_unwritten
    if _finish_turn(
        response,
        status=TURN_END_STATUS[type(event)],
        error=_error(event.error),
        model=run.model,
        agent=run.session.agent.name,
        unit=run.unit,
        reported=event.error,
        also_write=("usage",) if usage_pending else (),
        session=run.session,
    ):
        run.usage_unwritten.discard(response.id)


def _apply_workspace_changes(run: _Run, event: protocol.WorkspaceChanges) -> None:
    session = run.session
    try:
        environment_id = apply_workspace_changes(
            session=session, payload=protocol.to_builtins(event)
        )
    except ValueError as exc:
        raise MalformedEvent(str(exc)) from exc
    record_event(
        unit=run.unit,
        session_id=session.id,
        payload=changed_files_invalidated_event(
            session_id=session.id, environment_id=environment_id
        ),
    )


def _apply_policy_denied(run: _Run, event: protocol.PolicyDenied) -> None:
    if run.turn(event.response_id) is None:
        raise MalformedEvent("policy.denied for an unknown response")
    record_event(
        unit=run.unit,
        session_id=run.session.id,
        payload=policy_denied_event(
            session_id=run.session.id,
            response_id=event.response_id,
            call_id=event.call_id,
            tool=event.tool,
            policy_name=event.policy_name,
            reason=event.reason,
        ),
    )


def _apply_approval_requested(run: _Run, event: protocol.ApprovalRequested) -> None:
    """Store the question once; a call asked about again that already has a verdict
    (the runner restarted and re-ran the turn) gets that verdict, not a second question."""
    session = run.session
    response = run.turn(event.response_id)
    if response is None:
        raise MalformedEvent("approval.requested for an unknown response")
    asked = approvals.record_requested(session=session, turn=response, event=event, unit=run.unit)
    answered = [asked.approval]
    if asked.created and not response.is_open:
        # The server already ended this turn (a runner back after the grace): nobody
        # will answer, so the runner is told at once.
        answered = approvals.cancel_pending(
            session_id=session.id,
            turn_ids=[response.id],
            reason="the turn ended",
            unit=run.unit,
        )
    elif asked.created or answered[0].status == answered[0].Status.PENDING:
        return
    runner = session.runner
    channel = runner.channel_name if runner is not None else ""
    transaction.on_commit(lambda: post_verdicts(channel_name=channel, approvals=answered))


def _apply_status(run: _Run, event: protocol.SessionStatus) -> None:
    session = run.session
    status = event.status
    response_id = event.response_id
    error = _error(event.error)
    if status == Session.Status.FAILED and error is None:
        error = {"code": "failed", "message": "the turn failed"}
    if status == Session.Status.IDLE:
        response_id = None
    if status == Session.Status.FAILED and response_id:
        # A runner-side failure (backlog full, event too large) ends its turn too,
        # so no turn is left open behind a failed session.
        response = run.turn(response_id)
        if response is not None:
            _finish_turn(
                response,
                status=Turn.Status.FAILED,
                error=error,
                model=run.model,
                agent=run.session.agent.name,
                unit=run.unit,
                reported=event.error,
                session=run.session,
            )
        response_id = None
    _set_session_state(session, status=status, response_id=response_id, error=error, unit=run.unit)


def _item_header(item: dict[str, Any], key: str) -> str:
    """``id`` and ``type`` of a runner item: the item's shape is the HTTP API's, so it is
    checked here rather than in the protocol, which keeps items free-form."""
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise MalformedEvent(f"an item's '{key}' must be a non-empty string")
    return value


@functools.cache
def _session_item_sql() -> str:
    return (
        f"SELECT * FROM {quoted(Item)} "
        f"WHERE {quoted(Item, 'session')} = %s AND {quoted(Item, 'id')} = %s"
    )


def _apply_item(run: _Run, event: protocol.OutputItemDone) -> None:
    """Store a finished item (idempotent by id) and show it to watchers.

    A client-side call waiting for its result (``action_required``) is only shown:
    it is stored once it completes (tunnel.md), so the transcript never keeps a call
    that was abandoned.
    """
    session = run.session
    response = run.turn(event.response_id)
    raw = event.item
    item_id = _item_header(raw, "id")
    item_type = _item_header(raw, "type")
    raw_status = raw.get("status")
    status = raw_status if isinstance(raw_status, str) else "completed"
    data = {key: value for key, value in raw.items() if key not in ITEM_HEADER_KEYS}
    response_id = response.id if response else event.response_id
    if status == "action_required":
        shown = {
            **data,
            "id": item_id,
            "type": item_type,
            "status": status,
            "response_id": response_id,
            "created_at": unix(timezone.now()),
            "created_by": None,
        }
    else:
        # Read, then write: no savepoint. A concurrent insert of the same id (not
        # possible while the session row is locked) would fail the batch, which is then
        # stored event by event.
        item = first_row(Item, _session_item_sql(), [session.id, item_id])
        if item is None:
            item = Item(
                session=session,
                id=item_id,
                type=item_type,
                status=status,
                data=data,
                response_id=response.id if response else None,
            )
            insert_row(item)
        else:
            item.status, item.data = status, data
            update_row(item, ["status", "data"])
        shown = item.flat()
    record_event(
        unit=run.unit,
        session_id=session.id,
        payload=output_item_done_event(response_id=response_id, item=shown),
    )


# The handler of each runner event type (the members of ``protocol.AnyEvent``; a test
# holds the two to the same list).
def _apply_mcp_status(run: _Run, event: protocol.McpStatus) -> None:
    """The MCP servers' latest state: kept on the session (the snapshot and
    ``GET …/agent`` show it) and sent to watchers; stored with an event, so the
    snapshot's ETag (``last_event_seq``) changes with it."""
    session = run.session
    servers = clean_states(event.servers)
    session.mcp_servers = servers
    update_row(session, ["mcp_servers"])
    record_event(
        unit=run.unit,
        session_id=session.id,
        payload=mcp_status_event(session_id=session.id, servers=servers),
    )


def _apply_usage(run: _Run, event: protocol.UsageRecorded) -> None:
    """One LLM call: priced now and added to the turn's sums on its row and to the
    session's cost on the locked session row; its row and the user's and session's totals
    (``usage``) are written with the run's other calls, in one statement at the run's end
    or before a turn's end reads them (``_Run.store_calls``). No log entry of its own:
    ``session.usage`` goes out once, at the turn's end."""
    session = run.session
    response = run.turn(event.response_id)
    if response is None:
        raise MalformedEvent("usage.recorded for an unknown response")
    usage = usage_services.CallUsage(
        model=event.model or run.model,
        input_tokens=event.input_tokens,
        output_tokens=event.output_tokens,
        cache_read_input_tokens=event.cache_read_input_tokens,
        cache_creation_input_tokens=event.cache_creation_input_tokens,
        reasoning_tokens=event.reasoning_tokens,
        reported=event.reported,
    )
    call = usage_services.price_call(response_id=response.id, usage=usage)
    run.calls.append(call)
    if not at_block_end(
        session_id=session.id, key="usage-calls", action=run.store_calls, unit=run.unit
    ):
        run.store_calls()
    response.usage = add_to_turn(response.usage, usage, call.cost_nano)
    run.usage_unwritten.add(response.id)

    # The turn's row is written once per run of events, with its latest sums: with its
    # end when it ends in the run (``_apply_turn_end``), else at the run's end.
    def write_turn_usage() -> None:
        if response.id in run.usage_unwritten:
            run.usage_unwritten.discard(response.id)
            update_row(response, ["usage"])

    if not at_block_end(
        session_id=session.id,
        key=("turn-usage", response.id),
        action=write_turn_usage,
        unit=run.unit,
    ):
        write_turn_usage()
    if call.cost_nano is not None:
        session.total_cost_nano = (session.total_cost_nano or 0) + call.cost_nano
    session.usage_totals = add_to_session_totals(session.usage_totals, usage, call.cost_nano)
    # ``updated_at`` moves the snapshot's ETag: its ``usage`` changed without an event.
    save_session_fields(session, ["total_cost_nano", "usage_totals", "updated_at"], unit=run.unit)

    # The runner's budgets after the run's calls: one ``policy.update`` per run.
    def send_budgets() -> None:
        _send_budgets_after_commit(session)

    if not at_block_end(
        session_id=session.id, key=("budgets", session.id), action=send_budgets, unit=run.unit
    ):
        send_budgets()


def _send_budgets_after_commit(session: Session) -> None:
    """After recorded calls: the session's new budgets to its runner, once the calls
    commit (fire and forget: the next update or ``turn.start`` carries newer numbers).
    Nothing is read or sent for a session without any budget."""
    if not budgets.has_budget(session):
        return
    command = protocol.PolicyUpdate(
        session_id=session.id, rules=None, budgets=budgets.budgets_for(session)
    )
    channel = (
        Runner.objects.filter(pk=session.runner_id).values_list("channel_name", flat=True).first()
    )
    if channel:
        transaction.on_commit(
            lambda: async_to_sync(post_command)(channel_name=channel, command=command)
        )


HANDLERS: dict[type[protocol.Event], Callable[[_Run, Any], None]] = {
    protocol.SessionStatus: _apply_status,
    protocol.ResponseCreated: _apply_response_created,
    protocol.OutputTextDelta: _apply_text_delta,
    protocol.OutputItemDone: _apply_item,
    protocol.ResponseCompleted: _apply_turn_end,
    protocol.ResponseFailed: _apply_turn_end,
    protocol.ResponseCancelled: _apply_turn_end,
    protocol.ApprovalRequested: _apply_approval_requested,
    protocol.PolicyDenied: _apply_policy_denied,
    protocol.WorkspaceChanges: _apply_workspace_changes,
    protocol.McpStatus: _apply_mcp_status,
    protocol.UsageRecorded: _apply_usage,
}


# --- starting waiting turns (runners.scheduler) -----------------------------------------


def start_commands(
    claimed: Collection[scheduler.Claimed], *, opened: Collection[str] = ()
) -> list[tuple[str, list[protocol.AnyCommand]]]:
    """For each claimed turn: its runner's channel and what to send it, ``session.open``
    first unless the runner's connection has the session open (or ``opened`` names it,
    sent just now) and then ``turn.start``. A turn whose bundle is gone fails
    (``agent_load_failed``), as a message's does."""
    if not claimed:
        return []
    sessions = {
        session.id: session
        for session in Session.objects.filter(
            pk__in={turn.session_id for turn in claimed}
        ).select_related("agent")
    }
    runners = {
        runner.id: runner for runner in Runner.objects.filter(pk__in={t.runner_id for t in claimed})
    }
    sends: list[tuple[str, list[protocol.AnyCommand]]] = []
    for turn in claimed:
        session, runner = sessions.get(turn.session_id), runners.get(turn.runner_id)
        response = Turn.objects.filter(session_id=turn.session_id, id=turn.response_id).first()
        if session is None or runner is None or response is None or not runner.channel_name:
            continue  # gone since; its end (or the runner's return) frees the slot
        commands: list[protocol.AnyCommand] = []
        if session.runner_generation_opened != runner.generation and session.id not in opened:
            try:
                commands.append(session_open_command(session=session))
            except blobs.BundleMissing as exc:
                log.error("session %s: %s", session.id, exc)
                fail_turn(
                    session_id=session.id,
                    response_id=response.id,
                    code="agent_load_failed",
                    message=str(exc),
                )
                continue
        commands.append(
            turn_start_command(response=response, budgets_now=budgets.budgets_for(session))
        )
        sends.append((runner.channel_name, commands))
    return sends


def start_waiting_turns_if_any() -> int:
    """After a turn that held a slot ended: the claim, if any turn waits at all (one
    read of a small index; most turn ends find none)."""
    if not scheduler.any_waiting():
        return 0
    return start_waiting_turns()


def start_waiting_turns(*, touched: Collection[str] = (), opened: Collection[str] = ()) -> int:
    """From sync code, after a commit that may have freed a slot: claim what can start
    and send it (fire and forget: a runner that lost it gets it again on its return,
    and a runner that does not return has its turns failed after the grace). Never
    raises: the caller's write is done. Returns how many turns were started."""
    try:
        claimed = scheduler.claim(touched=touched)
        for channel_name, commands in start_commands(claimed, opened=opened):
            for command in commands:
                async_to_sync(post_command)(channel_name=channel_name, command=command)
        return len(claimed)
    except Exception:
        log.exception("starting waiting turns failed")
        return 0
