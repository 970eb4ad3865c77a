"""Reads that decide what a user may see (http-api.md, Permission levels)."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as AuthUser
from django.db.models import Count, IntegerField, Model, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from omnigent_site.domain_errors import Forbidden, NotFound
from omnigent_site.rawsql import first_row, joined_columns, quoted, rows
from omnigent_site.users import is_admin
from usage.models import UserBudget

from .models import Agent, Approval, Item, Permission, Session, Turn
from .shapes import session_row
from .turn_queue import places

LEVEL_NAMES = {1: "read", 2: "edit", 3: "manage", 4: "owner"}
# Sessions per statement of ``user_session_list_rows`` (fixed sizes: cached SQL).
LIST_ROWS_BATCH = 100

User = AuthUser | AnonymousUser


def _runner_model() -> type[Model]:
    # The runner model is reached through the foreign key: ``sessions`` sits below
    # ``runners`` and does not import it (docs/architecture.md, Layers).
    return Session._meta.get_field("runner").related_model  # type: ignore[return-value]


@functools.cache
def _relations(*, agent: bool) -> dict[str, type[Model]]:
    """What a session row is read with (``rows(joined=...)``): its runner and, if
    ``agent``, its agent."""
    related: dict[str, type[Model]] = {"runner": _runner_model()}
    if agent:
        related["agent"] = Agent
    return related


@functools.cache
def _relations_sql(*, agent: bool) -> tuple[str, str]:
    """The select list and joins of ``_relations`` for a session row ``s``: one query
    instead of three. The runner is a LEFT JOIN (a session may have none)."""
    runner = _runner_model()
    columns = f", {joined_columns(runner, 'r', 'runner')}"
    joins = (
        f" LEFT JOIN {quoted(runner)} r ON r.{quoted(runner, 'id')} = s.{quoted(Session, 'runner')}"
    )
    if agent:
        columns += f", {joined_columns(Agent, 'a', 'agent')}"
        joins += (
            f" JOIN {quoted(Agent)} a ON a.{quoted(Agent, 'id')} = s.{quoted(Session, 'agent')}"
        )
    return columns, joins


@functools.cache
def _session_with_grant_sql(*, with_agent: bool = False, with_owner_budget: bool = False) -> str:
    """One session row plus the caller's grant level and pin (NULL without a grant), its
    runner and, if ``with_agent``, its agent; if ``with_owner_budget``, its owner's own
    daily budget as ``owner_daily_nano`` (NULL: none of their own)."""
    session_id, grant_session = quoted(Session, "id"), quoted(Permission, "session")
    columns, joins = _relations_sql(agent=with_agent)
    if with_owner_budget:
        columns += f", ub.{quoted(UserBudget, 'daily_nano')} AS owner_daily_nano"
        joins += (
            f" LEFT JOIN {quoted(UserBudget)} ub ON ub.{quoted(UserBudget, 'user')} "
            f"= s.{quoted(Session, 'created_by')}"
        )
    return (
        f"SELECT s.*, g.{quoted(Permission, 'level')} AS caller_level, "
        f"g.{quoted(Permission, 'pinned_at')} AS grant_pinned_at{columns} "
        f"FROM {quoted(Session)} s LEFT JOIN {quoted(Permission)} g "
        f"ON g.{grant_session} = s.{session_id} AND g.{quoted(Permission, 'user')} = %s"
        f"{joins} WHERE s.{session_id} = %s"
    )


def session_for(
    *,
    session_id: str,
    user: User,
    level: int,
    with_agent: bool = True,
    with_owner_budget: bool = False,
) -> tuple[Session, int]:
    """The session, with its runner (and agent), if ``user`` holds at least ``level`` on it.
    ``with_owner_budget``: also its owner's own daily budget (``owner_daily_nano``), which
    a message's budget check reads (``budgets.check_message``), in the same query.

    No access at all is a 404 (existence is not revealed); some access but too
    little is a 403 that names the level needed.

    Every session-scoped request starts here, the relay's hot path included, and
    building an ORM query with joins costs several times more than running it
    (about 1 ms against 0.1 ms on a small machine). So this is one plain SQL query
    through ``rawsql.first_row``: the session with the caller's grant, its runner and
    its agent joined.
    """
    if not user.is_authenticated:
        raise NotFound(f"session {session_id!r} not found")
    session = first_row(
        Session,
        _session_with_grant_sql(with_agent=with_agent, with_owner_budget=with_owner_budget),
        [user.pk, session_id],
        joined=_relations(agent=with_agent),
    )
    held = 0
    if session is not None:
        held = 4 if is_admin(user) else int(getattr(session, "caller_level", None) or 0)
    if session is None or held == 0:
        raise NotFound(f"session {session_id!r} not found")
    if held < level:
        raise Forbidden(f"this action needs {LEVEL_NAMES[level]} access to the session")
    return session, held


@functools.cache
def _session_list_rows_sql(*, one_user: bool, of_runner: bool = False, ids: int = 1) -> str:
    """One session row per direct grant (of one user's only): the grantee, level and pin,
    how many of the session's questions are open, its runner and agent. The session is the
    one whose id is given (or each of ``ids`` given), or (``of_runner``) every session
    bound to the runner given."""
    session_id, approval_session = quoted(Session, "id"), quoted(Approval, "session")
    if of_runner:
        where = f"s.{quoted(Session, 'runner')} = %s"
    elif ids == 1:
        where = f"s.{session_id} = %s"
    else:
        where = f"s.{session_id} IN ({', '.join(['%s'] * ids)})"
    columns, joins = _relations_sql(agent=True)
    sql = (
        f"SELECT s.*, (SELECT COUNT(*) FROM {quoted(Approval)} a2 "
        f"WHERE a2.{approval_session} = s.{session_id} "
        f"AND a2.{quoted(Approval, 'status')} = %s) AS pending_elicitations_count, "
        f"g.{quoted(Permission, 'user')} AS grantee_pk, g.{quoted(Permission, 'level')} "
        f"AS grantee_level, g.{quoted(Permission, 'pinned_at')} AS grant_pinned_at"
        f"{columns} FROM {quoted(Session)} s "
        f"JOIN {quoted(Permission)} g ON g.{quoted(Permission, 'session')} = s.{session_id}"
        f"{joins} WHERE {where}"
    )
    return sql + f" AND g.{quoted(Permission, 'user')} = %s" if one_user else sql


def session_list_rows(
    *, session_id: str, user_pk: int | None = None
) -> list[tuple[int, int, Session]]:
    """``(user pk, level, row)`` for each direct grant on the session (of user
    ``user_pk`` only): the session as a row of ``GET /v1/sessions`` shows it, with its
    runner, its agent and ``pending_elicitations_count``, as ``sessions_granted_to``
    annotates them. Empty when nobody holds a grant (or the session is gone): nobody
    has it in a list.

    Read after every status change to tell open lists (``updates``), twice a turn, so
    it is one plain SQL query like ``session_for``: the annotated ORM query cost about
    1 ms to build, and the grants were a second statement.
    """
    params: list[str | int] = [Approval.Status.PENDING, session_id]
    if user_pk is not None:
        params.append(user_pk)
    found = rows(
        Session,
        _session_list_rows_sql(one_user=user_pk is not None),
        params,
        joined=_relations(agent=True),
    )
    return _with_grantees(found)


def user_session_list_rows(
    *, user_pk: int, session_ids: list[str]
) -> dict[str, tuple[int, Session]]:
    """``session_list_rows`` of these sessions for one user, by session id: (level, row)
    of each the user holds a grant on. A resumed session list renders what it missed
    with it (``updates.py``), one statement per batch of sessions."""
    found: dict[str, tuple[int, Session]] = {}
    for start in range(0, len(session_ids), LIST_ROWS_BATCH):
        batch = session_ids[start : start + LIST_ROWS_BATCH]
        params: list[str | int] = [Approval.Status.PENDING, *batch, user_pk]
        sql = _session_list_rows_sql(one_user=True, ids=len(batch))
        for _user, level, row in _with_grantees(
            rows(Session, sql, params, joined=_relations(agent=True))
        ):
            found[row.id] = (level, row)
    return found


def runner_session_list_rows(*, runner_id: str) -> list[tuple[int, int, Session]]:
    """``session_list_rows`` of every session bound to the runner, in one statement: a
    runner that goes on- or offline changes the row of each of its sessions, and one
    read per session would hold its tunnel (and the one thread that serves every
    tunnel's database calls) for as many reads as the runner has sessions."""
    found = rows(
        Session,
        _session_list_rows_sql(one_user=False, of_runner=True),
        [Approval.Status.PENDING, runner_id],
        joined=_relations(agent=True),
    )
    return _with_grantees(found)


def _with_grantees(found: list[Session]) -> list[tuple[int, int, Session]]:
    return [
        (int(getattr(row, "grantee_pk")), int(getattr(row, "grantee_level")), row)  # noqa: B009
        for row in found
    ]


# Part of every snapshot ETag: bump it when the snapshot's JSON bytes change, so a
# validator a client got from an older server never matches what this one renders
# (2: every JSON body ends with a newline, omnigent_site/renderers.py).
SNAPSHOT_FORMAT = 2


def snapshot_etag(
    *, session: Session, level: int, include_items: bool, representation: str = ""
) -> str:
    """A strong ETag for ``GET /v1/sessions/{id}``, from the rows ``session_for`` loaded.

    It costs no query, so a poller whose session did not change is answered before the
    items and open questions are read. Its input is the session's row shape
    (``shapes.session_row``, every field of the snapshot but the transcript), so a field
    added there is covered; the items and open questions (and their count) change only
    through ``eventlog.record_event``, which advances ``last_event_seq`` in the same
    transaction, so the sequence stands for them. The row is rendered now, not read
    from ``updated_at``: some writers change it without (a deleted runner unbinds with
    an UPDATE of ``runner_id`` only), and ``runner_online`` turns false when
    heartbeats stop, with no write. While a turn of the session waits for a runner
    slot, its place (``turn_queue.places``, three reads) is part of the input too.
    ``include_items`` shapes the body;
    ``representation`` is the negotiated media type (``application/json; indent=2``
    renders other bytes). ``tests/api/test_snapshot_etag.py`` pins what it covers.
    """
    parts = [
        SNAPSHOT_FORMAT,
        session.last_event_seq,
        session.updated_at.isoformat(),
        session_row(session, level=level, pending_count=0),
        # Places in a runner's queue move with no write to this session (a turn ahead
        # started): computed here, while any of its turns waits (no query otherwise).
        places(session),
        include_items,
        representation,
    ]
    text = json.dumps(parts, separators=(",", ":"), default=str)
    return '"' + hashlib.blake2b(text.encode(), digest_size=16).hexdigest() + '"'


def sessions_granted_to(*, user: AuthUser) -> QuerySet[Session]:
    """Sessions where the user holds a direct grant (admins too: the list is personal),
    each with ``pending_elicitations_count`` (one subquery, not a query per row) and
    ``grant_pinned_at``, when the user pinned it (``shapes.session_row``'s ``pinned``)."""
    pinned = Permission.objects.filter(session=OuterRef("pk"), user=user).values("pinned_at")
    return (
        Session.objects.filter(grants__user=user)
        .select_related("agent", "runner")
        .annotate(
            pending_elicitations_count=pending_approval_count(),
            grant_pinned_at=Subquery(pinned[:1]),
        )
    )


def pinned_filter(
    sessions: QuerySet[Session], *, user: AuthUser, pinned: bool
) -> QuerySet[Session]:
    """``sessions`` narrowed to those the user pinned (or, ``pinned=False``, did not)."""
    ids = Permission.objects.filter(user=user, pinned_at__isnull=False).values("session_id")
    return sessions.filter(pk__in=ids) if pinned else sessions.exclude(pk__in=ids)


def managed_session_ids(*, user: AuthUser) -> QuerySet[Permission, Any]:
    """A query of the ids of the sessions the user manages (a manage or owner grant)."""
    return Permission.objects.filter(user=user, level__gte=Permission.Level.MANAGE).values(
        "session_id"
    )


def pending_approval_count() -> Coalesce:
    """Annotation: how many questions of the session (``OuterRef("pk")``) are open."""
    pending = (
        Approval.objects.filter(session=OuterRef("pk"), status=Approval.Status.PENDING)
        .order_by()
        .values("session")
        .annotate(count=Count("pk"))
        .values("count")
    )
    return Coalesce(Subquery(pending, output_field=IntegerField()), 0)


@functools.cache
def _pending_approvals_sql() -> str:
    return (
        f"SELECT * FROM {quoted(Approval)} WHERE {quoted(Approval, 'session')} = %s "
        f"AND {quoted(Approval, 'status')} = %s "
        f"ORDER BY {quoted(Approval, 'created_at')}, {quoted(Approval, 'id')}"
    )


def pending_approvals(*, session_id: str) -> list[Approval]:
    """The session's open questions, oldest first.

    Part of every snapshot a poller gets when the session changed (the items below
    too), so plain SQL like ``session_for``.
    """
    return rows(Approval, _pending_approvals_sql(), [session_id, Approval.Status.PENDING])


def session_approvals(*, session: Session, status: str | None = None) -> QuerySet[Approval]:
    """The session's approvals; ``status`` is ``pending``, ``resolved`` or None (all)."""
    approvals = Approval.objects.filter(session=session).select_related("resolved_by")
    if status == "pending":
        return approvals.filter(status=Approval.Status.PENDING)
    if status == "resolved":
        return approvals.exclude(status=Approval.Status.PENDING)
    return approvals


def grant_levels(*, user: AuthUser, session_ids: list[str]) -> dict[str, int]:
    rows = Permission.objects.filter(user=user, session_id__in=session_ids)
    return {row.session_id: row.level for row in rows}


def session_items(*, session: Session) -> QuerySet[Item]:
    return Item.objects.filter(session=session)


@functools.cache
def _snapshot_items_sql() -> str:
    return (
        f"SELECT * FROM {quoted(Item)} WHERE {quoted(Item, 'session')} = %s "
        f"ORDER BY {quoted(Item, 'seq')}"
    )


def snapshot_items(*, session_id: str) -> list[Item]:
    """All of the session's items in order, as ``session_items`` reads them, in plain SQL
    (the snapshot reads them whenever a poller finds the session changed)."""
    return rows(Item, _snapshot_items_sql(), [session_id])


def session_responses(*, session: Session) -> QuerySet[Turn]:
    return Turn.objects.filter(session=session)


@functools.cache
def _response_items_sql() -> str:
    return (
        f"SELECT * FROM {quoted(Item)} WHERE {quoted(Item, 'session')} = %s "
        f"AND {quoted(Item, 'response_id')} = %s ORDER BY {quoted(Item, 'seq')}"
    )


def response_output(*, response: Turn) -> list[dict]:
    """What the turn produced: its items except the user input that started it.

    Every turn's end renders it (``response.completed``), so plain SQL like
    ``snapshot_items``."""
    # Filtered here, not in SQL: ``exclude(data__role="user")`` would also drop every
    # item without a ``role`` key (NULL never compares unequal).
    items = rows(Item, _response_items_sql(), [response.session_id, response.id])
    return [item.flat() for item in items if item.data.get("role") != "user"]


def template_agents() -> QuerySet[Agent]:
    return Agent.objects.filter(kind=Agent.Kind.TEMPLATE, deleted_at__isnull=True)


def agent_for(*, agent_id: str, user: AuthUser) -> Agent:
    """A template agent, or a session agent whose session the user can read."""
    agent = Agent.objects.filter(pk=agent_id, deleted_at__isnull=True).first()
    if agent is None:
        raise NotFound(f"agent {agent_id!r} not found")
    if agent.kind == Agent.Kind.TEMPLATE or is_admin(user):
        return agent
    readable = Permission.objects.filter(session__agent=agent, user=user).exists()
    if not readable:
        raise NotFound(f"agent {agent_id!r} not found")
    return agent


# --- the inbox: what waits for the user across sessions ---------------------------------

INBOX_LIMIT = 200


def inbox_for(*, user: AuthUser) -> tuple[list[Approval], list[Session]]:
    """What waits for ``user``: the open questions of the sessions they may answer in
    (a direct grant of edit or more), oldest first, and their sessions whose last turn
    failed (any grant), newest first; at most ``INBOX_LIMIT`` of each. Two queries."""
    approvals = list(
        Approval.objects.filter(
            status=Approval.Status.PENDING,
            session__grants__user=user,
            session__grants__level__gte=Permission.Level.EDIT,
        )
        .select_related("session")
        .order_by("created_at", "id")[:INBOX_LIMIT]
    )
    failed = list(
        Session.objects.filter(grants__user=user, status=Session.Status.FAILED).order_by(
            "-updated_at", "id"
        )[:INBOX_LIMIT]
    )
    return approvals, failed
