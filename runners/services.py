"""Runner registration, tunnel bookkeeping, binding, and storing what runners report.

The tunnel consumer and the views call these functions; nothing else writes Runner
rows or applies runner events.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from audit import actions as audit_actions
from audit import services as audit
from omnigent_runner.config import DEFAULT_MAX_TURNS
from omnigent_runner.identity import derive_runner_id, new_binding_token
from omnigent_runner.protocol import (
    AnyCommand,
    ApprovalVerdict,
    Budgets,
    ResponseCreated,
    SessionClose,
    SessionOpen,
    TunnelRevoked,
    TurnStart,
)
from omnigent_site.domain_errors import Forbidden, InvalidInput
from omnigent_site.runtime.write_priority import writing_ahead
from omnigent_site.users import get_or_create_user, is_admin
from sessions import approvals, budgets, runner_presence, updates
from sessions.blobs import BundleMissing
from sessions.eventlog import WriteUnit, publishing_together
from sessions.models import Session, Turn
from webhook_outbox.events import enqueue_webhook_event

from . import runner_events
from .models import Runner
from .relay import notify, post_command
from .verdicts import verdict_command

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

log = logging.getLogger(__name__)

# Refresh ``last_seen_at`` at most this often per tunnel: it bounds ``online``.
SEEN_WRITE_INTERVAL_S = 5.0
# The most ``turn.start`` commands one sweep sends again (``unacked_starts_to_resend``):
# the oldest first, the rest in the next sweeps.
START_RESEND_BATCH = 100


# --- webhook events (automation.md): written with the row change they report ------


def _runner_event(kind: str, *, runner_id: str, owner_id: int) -> None:
    """``runner.online`` / ``runner.offline`` for the runner owner's webhooks."""
    enqueue_webhook_event(type=kind, data={"runner_id": runner_id}, owner_id=owner_id)


# --- registration ---------------------------------------------------------------


def register_runner(*, owner: AuthUser, name: str = "") -> tuple[Runner, str]:
    """A new runner and its binding token (returned once, never stored)."""
    token = new_binding_token()
    with transaction.atomic():
        runner = Runner.objects.create(id=derive_runner_id(token), owner=owner, name=name)
        _audit_registered(runner=runner, actor=owner, how="api")
    return runner, token


def _audit_registered(*, runner: Runner, actor: AuthUser | None, how: str) -> None:
    # The binding token is the runner's credential: its creation is this record too.
    audit.record(
        actor=actor,
        action=audit_actions.RUNNER_REGISTER,
        target_type="runner",
        target_id=runner.id,
        details={"name": runner.name, "owner": runner.owner.get_username(), "how": how},
    )


def revoke_runner(*, runner: Runner, actor: AuthUser | None = None) -> None:
    """The token stops connecting and a live tunnel is closed."""
    channel = runner.channel_name
    runner.revoked_at = timezone.now()
    with transaction.atomic():
        runner.save(update_fields=["revoked_at"])
        audit.record(
            actor=actor,
            action=audit_actions.RUNNER_REVOKE,
            target_type="runner",
            target_id=runner.id,
            details={"name": runner.name, "owner": runner.owner.get_username()},
        )
        if channel:
            _runner_event("runner.offline", runner_id=runner.id, owner_id=runner.owner_id)
    if channel:
        async_to_sync(notify)(channel_name=channel, message=TunnelRevoked())


def _is_loopback(host: str | None) -> bool:
    try:
        return ipaddress.ip_address((host or "").strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TunnelAuthorization:
    runner: Runner | None
    reason: str


def authorize_tunnel(
    *, path_runner_id: str, token: str | None, peer_host: str | None
) -> TunnelAuthorization:
    """Decide whether a tunnel handshake may proceed (tunnel.md, Identity).

    The token itself is never logged or stored; only the id derived from it.
    """
    if not token or not token.strip():
        return TunnelAuthorization(None, "no binding token")
    derived = derive_runner_id(token)
    if derived != path_runner_id:
        return TunnelAuthorization(None, "the path id does not match the token")
    runner = Runner.objects.filter(pk=derived).first()
    if runner is not None:
        if runner.is_revoked:
            return TunnelAuthorization(None, "the runner is revoked")
        return TunnelAuthorization(runner, "registered runner")
    allow_list = {entry.strip() for entry in settings.OMNIGENT_RUNNER_TUNNEL_TOKEN if entry.strip()}
    if token.strip() in allow_list:
        owner = get_or_create_user(settings.OMNIGENT_RUNNER_OWNER)
        return TunnelAuthorization(_auto_register(derived, owner=owner), "allow-listed token")
    if settings.OMNIGENT_LOCAL_SINGLE_USER and _is_loopback(peer_host):
        owner = get_or_create_user(settings.OMNIGENT_LOCAL_USER)
        return TunnelAuthorization(_auto_register(derived, owner=owner), "local single-user mode")
    return TunnelAuthorization(None, "unknown runner")


def _auto_register(runner_id: str, *, owner: AuthUser) -> Runner:
    """The runner of an allow-listed token or of local mode, registered on first sight."""
    with transaction.atomic():
        runner, created = Runner.objects.get_or_create(id=runner_id, defaults={"owner": owner})
        if created:
            _audit_registered(runner=runner, actor=None, how="tunnel")
    return runner


# --- tunnel lifecycle -----------------------------------------------------------


@dataclass(frozen=True)
class Connection:
    generation: int
    replaced_channel: str


def mark_connected(
    *,
    runner_id: str,
    channel_name: str,
    runner_version: str,
    workspace: dict[str, Any],
    process_id: str = "",
    max_turns: int | None = None,
) -> Connection:
    """Record a new live tunnel, held by server process ``process_id``; the newest
    connection wins. ``max_turns``: the turns the runner runs at once, from its
    ``hello`` (an older runner's says nothing: ``DEFAULT_MAX_TURNS``)."""
    now = timezone.now()
    with transaction.atomic():
        runner = Runner.objects.select_for_update().get(pk=runner_id)
        replaced = runner.channel_name
        runner.generation = F("generation") + 1
        runner.channel_name = channel_name
        runner.tunnel_process = process_id
        runner.connected_at = now
        runner.last_seen_at = now
        runner.disconnected_at = None
        runner.runner_version = runner_version[:64]
        runner.workspace = workspace
        runner.max_turns = max_turns or DEFAULT_MAX_TURNS
        fields = [
            "max_turns",
            "generation",
            "channel_name",
            "tunnel_process",
            "connected_at",
            "last_seen_at",
            "disconnected_at",
            "runner_version",
            "workspace",
        ]
        # A runner registered without a name is named after its machine's host name.
        host = workspace.get("host")
        if not runner.name and isinstance(host, str) and host.strip():
            runner.name = host.strip()[: Runner._meta.get_field("name").max_length]
            fields.append("name")
        runner.save(update_fields=fields)
        runner.refresh_from_db(fields=["generation"])
        updates.announce_runner_sessions(runner_id=runner_id)
        runner_presence.announce_runner_state(runner_id=runner_id)
        if not replaced:
            _runner_event("runner.online", runner_id=runner_id, owner_id=runner.owner_id)
    return Connection(
        generation=runner.generation, replaced_channel=replaced if replaced != channel_name else ""
    )


def mark_seen(*, runner_id: str, generation: int) -> None:
    Runner.objects.filter(pk=runner_id, generation=generation).update(last_seen_at=timezone.now())


def mark_disconnected(*, runner_id: str, generation: int) -> bool:
    """Clear the live tunnel if it is still this connection's; False when superseded."""
    with transaction.atomic():
        updated = Runner.objects.filter(pk=runner_id, generation=generation).update(
            channel_name="", disconnected_at=timezone.now()
        )
        if updated:
            updates.announce_runner_sessions(runner_id=runner_id)
            runner_presence.announce_runner_state(runner_id=runner_id)
            owner_id = Runner.objects.filter(pk=runner_id).values_list("owner_id", flat=True)[0]
            _runner_event("runner.offline", runner_id=runner_id, owner_id=owner_id)
    return bool(updated)


def tunnel_holders() -> list[str]:
    """The server processes holding a connected tunnel (``liveness``)."""
    return list(
        Runner.objects.exclude(channel_name="")
        .order_by()
        .values_list("tunnel_process", flat=True)
        .distinct()
    )


def release_tunnels(*, process_id: str) -> list[str]:
    """Mark offline every tunnel server process ``process_id`` holds (it stopped or
    died); returns the runner ids. Their busy sessions then wait out the reconnect
    grace like after any drop (``fail_stale_runners``)."""
    held = Runner.objects.filter(tunnel_process=process_id).exclude(channel_name="")
    owners = dict(held.values_list("id", "owner_id"))
    runner_ids = list(owners)
    if not runner_ids:
        return []
    with transaction.atomic():
        # A runner that reconnected meanwhile names another process: left alone.
        released = list(
            held.filter(id__in=runner_ids).select_for_update().values_list("id", flat=True)
        )
        held.filter(id__in=released).update(channel_name="", disconnected_at=timezone.now())
        for runner_id in runner_ids:
            updates.announce_runner_sessions(runner_id=runner_id)
            runner_presence.announce_runner_state(runner_id=runner_id)
        for runner_id in released:
            _runner_event("runner.offline", runner_id=runner_id, owner_id=owners[runner_id])
    return runner_ids


def restore_tunnels(*, process_id: str, held: Sequence[tuple[str, str, int]]) -> None:
    """Set the tunnels this process still holds (channel, runner id, generation) online
    again where another process took them for dead; a newer connection is left alone."""
    for channel_name, runner_id, generation in held:
        with transaction.atomic():
            restored = Runner.objects.filter(
                pk=runner_id, generation=generation, channel_name=""
            ).update(
                channel_name=channel_name,
                tunnel_process=process_id,
                disconnected_at=None,
                last_seen_at=timezone.now(),
            )
            if restored:
                updates.announce_runner_sessions(runner_id=runner_id)
                runner_presence.announce_runner_state(runner_id=runner_id)
                owner_id = Runner.objects.filter(pk=runner_id).values_list("owner_id", flat=True)[0]
                _runner_event("runner.online", runner_id=runner_id, owner_id=owner_id)


def fail_sessions_after_grace(*, runner_id: str, generation: int) -> list[str]:
    """After the reconnect grace: fail the runner's busy sessions if it is still gone."""
    runner = Runner.objects.filter(pk=runner_id).first()
    if runner is None or runner.generation != generation or runner.channel_name:
        return []
    failed: list[str] = []
    busy = Session.objects.filter(
        runner_id=runner_id, status__in=[Session.Status.RUNNING, Session.Status.WAITING]
    ).values_list("id", flat=True)
    for session_id in busy:
        runner_events.fail_open_turns(
            session_id=session_id,
            code="runner_disconnected",
            message="the runner disconnected and did not come back within the grace period",
        )
        failed.append(session_id)
    return failed


def fail_stale_runners() -> list[str]:
    """Fail busy sessions of runners gone for longer than the grace, however they left.

    Covers a server process that died holding a tunnel (its row still names a
    channel but is not refreshed) and a grace timer that never ran.
    """
    now = timezone.now()
    grace = timedelta(seconds=settings.OMNIGENT_RECONNECT_GRACE_S)
    silent = timedelta(seconds=3 * settings.OMNIGENT_HEARTBEAT_S + 5) + grace
    stale = (
        Runner.objects.filter(sessions__status__in=[Session.Status.RUNNING, Session.Status.WAITING])
        .filter(
            Q(channel_name="", disconnected_at__lt=now - grace)
            | Q(channel_name="", disconnected_at__isnull=True)
            | (~Q(channel_name="") & Q(last_seen_at__lt=now - silent))
        )
        .distinct()
    )
    failed: list[str] = []
    for runner in stale:
        if runner.channel_name:
            mark_disconnected(runner_id=runner.id, generation=runner.generation)
        failed += fail_sessions_after_grace(runner_id=runner.id, generation=runner.generation)
    return failed


@dataclass(frozen=True)
class SessionResume:
    session_id: str
    last_acked_seq: int
    open_command: SessionOpen | None
    turn_commands: list[TurnStart]
    # For a session the runner still holds: stored verdicts it has not acknowledged
    # (the others get them inside ``session.open``).
    verdict_commands: list[ApprovalVerdict] = field(default_factory=list)


def sessions_to_resume(*, runner_id: str, open_sessions: set[str]) -> list[SessionResume]:
    """For ``welcome``: every bound session, and what to re-send for those the runner lacks.

    A runner that restarted holds no sessions: it gets ``session.open`` with the
    stored history and ``turn.start`` again for every open turn that held a slot. A
    session the runner still holds gets ``turn.start`` again only for the open turns
    whose ``turn.start`` it never acknowledged (``Turn.start_acked_at``): that command
    may have gone to a tunnel that closed before the runner read it (a server process
    stopping), or to the old tunnel's channel after this one replaced it. A runner that
    did read it acknowledges the copy and ignores it (same ``response_id``).
    """
    resumes: list[SessionResume] = []
    unacked = _unacked_starts(runner_id=runner_id, open_sessions=open_sessions)
    for session in Session.objects.filter(runner_id=runner_id).select_related("agent"):
        if session.id in open_sessions:
            verdicts = [
                verdict_command(approval)
                for approval in approvals.unacked_verdicts(session_id=session.id)
            ]
            again = [
                runner_events.turn_start_command(response=turn)
                for turn in unacked.get(session.id, [])
            ]
            resumes.append(
                SessionResume(session.id, session.last_runner_seq, None, again, verdicts)
            )
            continue
        # Only the turns that held a slot: those still waiting start when the
        # scheduler gives them one (``runner_events.start_waiting_turns``).
        open_turns = list(
            Turn.objects.filter(
                session=session, status__in=Turn.OPEN_STATUSES, dispatched_at__isnull=False
            ).order_by("created_at", "id")
        )
        try:
            open_command = runner_events.session_open_command(session=session)
        except BundleMissing as exc:
            # One broken session must not keep the runner from coming online.
            log.error("session %s cannot be opened on %s: %s", session.id, runner_id, exc)
            if open_turns:
                runner_events.fail_open_turns(
                    session_id=session.id, code="agent_load_failed", message=str(exc)
                )
            resumes.append(SessionResume(session.id, session.last_runner_seq, None, []))
            continue
        resumes.append(
            SessionResume(
                session_id=session.id,
                last_acked_seq=session.last_runner_seq,
                open_command=open_command,
                turn_commands=[
                    runner_events.turn_start_command(
                        response=turn, budgets_now=open_command.budgets
                    )
                    for turn in open_turns
                ],
            )
        )
    return resumes


def _unacked_starts(*, runner_id: str, open_sessions: set[str]) -> dict[str, list[Turn]]:
    """The open turns that held a slot but whose ``turn.start`` the runner never
    acknowledged, of the sessions the runner reports open, oldest first: one query
    for all of them (none when it reports none). Selected by the runner's id, not by
    the reported ids, so a runner holding thousands of sessions never meets a limit on
    a query's parameters."""
    if not open_sessions:
        return {}
    found: dict[str, list[Turn]] = {}
    for turn in Turn.objects.filter(
        session__runner_id=runner_id,
        status__in=Turn.OPEN_STATUSES,
        dispatched_at__isnull=False,
        start_acked_at__isnull=True,
    ).order_by("created_at", "id"):
        if turn.session_id in open_sessions:
            found.setdefault(turn.session_id, []).append(turn)
    return found


def start_resend_after_s() -> float:
    """How long a dispatched turn's ``turn.start`` may stay unacknowledged before it is
    sent again: ``OMNIGENT_START_RESEND_S``, but never less than a message's own request
    waits for the runner (``dispatch.deliver_message``: ``session.open`` and then
    ``turn.start``, each with ``OMNIGENT_RELAY_TIMEOUT_S``). A copy sent sooner could
    start a turn that request is about to fail for a missed deadline."""
    return max(settings.OMNIGENT_START_RESEND_S, 2 * settings.OMNIGENT_RELAY_TIMEOUT_S)


def unacked_starts_to_resend(
    *, process_id: str, now: datetime | None = None, limit: int = START_RESEND_BATCH
) -> list[tuple[str, list[AnyCommand]]]:
    """What to send again to the runners whose tunnels ``process_id`` holds: the
    ``turn.start`` of each open turn that went out more than ``start_resend_after_s``
    before ``now`` and that the runner never acknowledged, with the runner's channel.

    A ``turn.start`` sent fire and forget (a turn the fair-share queue started) can be
    lost while the tunnel stays up (a full or restarting channel layer, a message
    expired in Redis); nothing else would send it until the runner's next ``hello``. A
    runner that has the turn acknowledges the copy and ignores it (same
    ``response_id``). A session whose ``session.open`` this connection never
    acknowledged gets it first, as when the turn was started (``start_commands``).

    One query for the turns, oldest first, at most ``limit``. Only the tunnels of one
    process: each process sends for the tunnels it holds, so a copy goes once per
    sweep whatever the number of processes. ``now``: the clock, for tests."""
    now = timezone.now() if now is None else now
    heard_since = now - timedelta(seconds=3 * settings.OMNIGENT_HEARTBEAT_S + 5)
    turns = (
        Turn.objects.filter(
            status__in=Turn.OPEN_STATUSES,
            dispatched_at__lt=now - timedelta(seconds=start_resend_after_s()),
            start_acked_at__isnull=True,
            session__runner__tunnel_process=process_id,
            session__runner__revoked_at__isnull=True,
            session__runner__last_seen_at__gte=heard_since,
        )
        .exclude(session__runner__channel_name="")
        .select_related("session__agent", "session__runner")
        .order_by("dispatched_at", "seq")[:limit]
    )
    sends: dict[str, list[AnyCommand]] = {}
    opened: set[str] = set()
    budgets_now: dict[str, Budgets] = {}
    for turn in turns:
        session = turn.session
        runner = session.runner
        assert runner is not None  # selected by its runner
        commands = sends.setdefault(runner.channel_name, [])
        if session.runner_generation_opened != runner.generation and session.id not in opened:
            try:
                commands.append(runner_events.session_open_command(session=session))
            except BundleMissing as exc:
                log.error("session %s: %s", session.id, exc)
                runner_events.fail_turn(
                    session_id=session.id,
                    response_id=turn.id,
                    code="agent_load_failed",
                    message=str(exc),
                )
                continue
            opened.add(session.id)
        if session.id not in budgets_now:  # one read per session
            budgets_now[session.id] = budgets.budgets_for(session)
        commands.append(
            runner_events.turn_start_command(response=turn, budgets_now=budgets_now[session.id])
        )
    return [(channel_name, commands) for channel_name, commands in sends.items() if commands]


def record_runner_events(
    *,
    runner_id: str,
    events: Sequence[runner_events.ReceivedEvent],
    acked_starts: Collection[tuple[str, str]] = (),
) -> dict[str, int]:
    """Store runner events, each once; returns the cumulative seq to acknowledge per session.

    ``acked_starts``: the ``(session_id, response_id)`` of the ``turn.start`` commands
    the runner acknowledged since the last call, marked in the same trip to the
    database (``runner_events.mark_starts_acked``); a turn whose ``response.created``
    is among ``events`` is marked by that event's own write instead.

    Each session's events in the batch are stored in one transaction, in arrival
    order (``runner_events.record``), with the process's SQLite write lock taken ahead of
    waiting writers and kept for the batch (``write_priority.writing_ahead``); watchers
    get what the batch produced together, once the lock is let go.
    The publications are sent from this thread, before the tunnel consumer acknowledges
    the batch and takes the next one. Handing them to the consumer's event loop instead
    (``eventlog.collecting_publications``, as a message's ``POST`` does) was measured:
    less CPU per turn with one watcher per session, but a session with 200 watchers was
    fanned out about twice as late (``docs/performance-history.md``, stage 3).
    """
    with publishing_together() as unit, writing_ahead():
        acks = _record_runs(runner_id=runner_id, events=events, unit=unit)
        if acked_starts:
            created = {
                (session_id, event.response_id)
                for session_id, _seq, event in events
                if type(event) is ResponseCreated
            }
            runner_events.mark_starts_acked(starts=set(acked_starts) - created)
    return acks


def _record_runs(
    *, runner_id: str, events: Sequence[runner_events.ReceivedEvent], unit: WriteUnit
) -> dict[str, int]:
    runs: dict[str, list[tuple[int, Any]]] = {}
    for session_id, seq, event in events:
        runs.setdefault(session_id, []).append((seq, event))
    return {
        session_id: runner_events.record(
            runner_id=runner_id, session_id=session_id, events=run, unit=unit
        )
        for session_id, run in runs.items()
    }


# --- binding ----------------------------------------------------------------------


def bind_session_runner(*, session: Session, actor: AuthUser, runner_id: str) -> Session:
    """Bind (or with ``""`` unbind) the session's runner; last write wins."""
    previous = session.runner
    if runner_id == "":
        with transaction.atomic():
            Session.objects.filter(pk=session.pk).update(runner=None, updated_at=timezone.now())
            updates.announce_session(session_id=session.id)
            runner_presence.announce_session_runner(session_id=session.id)
        if previous is not None and previous.channel_name:
            close_session_on_runner(session=session)
        session.refresh_from_db()
        return session
    runner = Runner.objects.filter(pk=runner_id).first()
    if runner is None or not runner.online:
        raise InvalidInput(f"runner '{runner_id}' is not registered", field="runner_id")
    if runner.owner_id != actor.pk and not is_admin(actor):
        raise Forbidden("the runner belongs to another user")
    with transaction.atomic():
        Session.objects.filter(pk=session.pk).update(
            runner=runner, runner_generation_opened=0, updated_at=timezone.now()
        )
        updates.announce_session(session_id=session.id)
        runner_presence.announce_session_runner(session_id=session.id)
    if previous is not None and previous.pk != runner.pk and previous.channel_name:
        close_session_on_runner(session=session, runner=previous)
    session.refresh_from_db()
    try:
        command = runner_events.session_open_command(session=session)
    except BundleMissing as exc:
        # The binding stands; the first message reports the problem on its turn.
        log.error("session %s bound to %s but not opened: %s", session.id, runner.id, exc)
        return session
    async_to_sync(post_command)(channel_name=runner.channel_name, command=command)
    # Turns that waited (bound to no runner, or to one that is gone) may start here.
    runner_events.start_waiting_turns(touched=[session.id], opened=[session.id])
    return session


def close_session_on_runner(*, session: Session, runner: Runner | None = None) -> None:
    """Best effort ``session.close``: an offline runner never blocks a delete or unbind."""
    target = runner or session.runner
    if target is None or not target.channel_name:
        return
    async_to_sync(post_command)(
        channel_name=target.channel_name, command=SessionClose(session_id=session.id)
    )


def seen_is_due(last_write: float, now: float) -> bool:
    """Whether a tunnel's ``last_seen_at`` is due a write (times from ``time.monotonic``)."""
    return now - last_write >= SEEN_WRITE_INTERVAL_S
