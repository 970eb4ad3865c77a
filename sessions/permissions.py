"""Session permission levels as a DRF permission class (http-api.md, Permission levels)."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from . import selectors
from .models import Permission, Session

READ = Permission.Level.READ
EDIT = Permission.Level.EDIT
MANAGE = Permission.Level.MANAGE
OWNER = Permission.Level.OWNER


class SessionAccess(BasePermission):
    """Loads the session of the URL and checks the level the view needs for the method.

    The view declares ``session_levels = {"GET": READ, ...}`` (or overrides
    ``required_session_level``). On success it finds ``view.session`` and
    ``view.session_level``; a stranger gets 404 and too little access 403.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        level = view.required_session_level(request)
        for_budgets = request.method in getattr(view, "session_with_budgets", ())
        session, held = selectors.session_for(
            session_id=view.kwargs["session_id"],
            user=request.user,
            level=level,
            with_agent=view.session_with_agent or for_budgets,
            with_owner_budget=for_budgets,
        )
        view.session = session
        view.session_level = held
        return True


class SessionScopedMixin:
    session_levels: dict[str, int] = {}
    # Views that never read ``session.agent`` skip loading it (one query less).
    session_with_agent = True
    # Methods that may send a message, whose budget check (``budgets.check_message``)
    # reads the agent and the owner's own budget: read with the session, in its query.
    session_with_budgets: tuple[str, ...] = ()
    # Set by SessionAccess before the handler runs.
    session: Session
    session_level: int

    def required_session_level(self, request: Request) -> int:
        return self.session_levels.get(request.method or "GET", READ)
