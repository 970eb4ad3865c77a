"""Reads that decide what a user may see (http-api.md, Permission levels)."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as AuthUser
from django.db.models import OuterRef, QuerySet, Subquery
from rest_framework.exceptions import NotFound, PermissionDenied

from .models import Agent, Item, Permission, Response, Session

LEVEL_NAMES = {1: "read", 2: "edit", 3: "manage", 4: "owner"}

User = AuthUser | AnonymousUser


def is_admin(user: User) -> bool:
    return bool(getattr(user, "is_staff", False) or getattr(user, "is_superuser", False))


def user_level(*, session: Session, user: User) -> int:
    """The caller's level on ``session``: its grant, 4 for admins, 0 for none."""
    if is_admin(user):
        return 4
    if not user.is_authenticated:
        return 0
    level = (
        Permission.objects.filter(session=session, user=user)
        .values_list("level", flat=True)
        .first()
    )
    return int(level or 0)


def session_for(*, session_id: str, user: User, level: int) -> tuple[Session, int]:
    """The session if ``user`` holds at least ``level`` on it.

    No access at all is a 404 (existence is not revealed); some access but too
    little is a 403 that names the level needed.
    """
    sessions = Session.objects.select_related("agent", "runner").filter(pk=session_id)
    if user.is_authenticated and not is_admin(user):
        # One query: the session, its agent and runner, and the caller's grant.
        grant = Permission.objects.filter(session=OuterRef("pk"), user=user).values("level")[:1]
        sessions = sessions.annotate(caller_level=Subquery(grant))
    session = sessions.first()
    if session is None:
        raise NotFound(f"session {session_id!r} not found")
    if hasattr(session, "caller_level"):
        held = int(session.caller_level or 0)
    else:
        held = user_level(session=session, user=user)
    if held == 0:
        raise NotFound(f"session {session_id!r} not found")
    if held < level:
        raise PermissionDenied(f"this action needs {LEVEL_NAMES[level]} access to the session")
    return session, held


def sessions_granted_to(*, user: AuthUser) -> QuerySet[Session]:
    """Sessions where the user holds a direct grant (admins too: the list is personal)."""
    return Session.objects.filter(grants__user=user).select_related("agent", "runner")


def grant_levels(*, user: AuthUser, session_ids: list[str]) -> dict[str, int]:
    rows = Permission.objects.filter(user=user, session_id__in=session_ids)
    return {row.session_id: row.level for row in rows}


def session_items(*, session: Session) -> QuerySet[Item]:
    return Item.objects.filter(session=session)


def session_responses(*, session: Session) -> QuerySet[Response]:
    return Response.objects.filter(session=session)


def response_output(*, response: Response) -> list[dict]:
    """What the turn produced: its items except the user input that started it."""
    # Filtered here, not in SQL: ``exclude(data__role="user")`` would also drop every
    # item without a ``role`` key (NULL never compares unequal).
    items = response.items.order_by("seq")
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
