"""Reads that decide which runners a user may see (http-api.md, Runners)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omnigent_site.domain_errors import NotFound
from omnigent_site.users import is_admin

from .models import Runner

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser
    from django.db.models import QuerySet


def runners_visible_to(*, user: AuthUser) -> QuerySet[Runner]:
    """Every runner for an admin; a user's own runners otherwise (revoked ones included)."""
    queryset = Runner.objects.select_related("owner")
    return queryset if is_admin(user) else queryset.filter(owner=user)


def active_runners_visible_to(*, user: AuthUser) -> QuerySet[Runner]:
    """The runners a user lists: visible and not revoked."""
    return runners_visible_to(user=user).filter(revoked_at__isnull=True)


def runner_for(*, user: AuthUser, runner_id: str) -> Runner:
    """A runner the user may see and that is not revoked; otherwise 404 (never 403).

    A runner of another user answers exactly like a missing one, so ids are not
    revealed.
    """
    runner = runners_visible_to(user=user).filter(pk=runner_id).first()
    if runner is None or runner.is_revoked:
        raise NotFound(f"runner {runner_id!r} not found")
    return runner


def runner_is_online(*, user: AuthUser, runner_id: str) -> bool:
    """``GET /v1/runners/{id}/status``: false for a runner the user may not see."""
    runner = runners_visible_to(user=user).filter(pk=runner_id).first()
    return bool(runner and runner.online)
