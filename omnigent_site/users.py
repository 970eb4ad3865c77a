"""Users as the whole project sees them: created on first sight, admins by flag.

Django-only (no DRF): services, selectors and the tunnel consumer use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser

from omnigent_site.rawsql import row_by

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser


def is_admin(user: AuthUser | AnonymousUser) -> bool:
    """Staff and superusers see and manage everything (http-api.md, Permission levels)."""
    return bool(getattr(user, "is_staff", False) or getattr(user, "is_superuser", False))


def get_or_create_user(username: str) -> AuthUser:
    """The user named ``username``, created (without a usable password) on first sight."""
    User = get_user_model()
    # Every request authenticated by the header comes here: a plain one-row read first.
    existing = row_by(User, User.USERNAME_FIELD, username)
    if existing is not None:
        return cast("AuthUser", existing)
    defaults: dict[str, Any] = {"email": username} if "@" in username else {}
    user, created = User.objects.get_or_create(username=username, defaults=defaults)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user
