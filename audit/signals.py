"""Acts that Django and DRF perform themselves, recorded from their signals: password
sign-ins (successful and failed) and API tokens (``rest_framework.authtoken``) created
or deleted. Each handler runs inside the write it reports (a token's save or delete),
so a record that fails fails that write too."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db.models.signals import post_delete, post_save

from . import actions, services


def _address(request: Any) -> str | None:
    meta = getattr(request, "META", None)
    return str(meta.get("REMOTE_ADDR") or "") or None if meta is not None else None


def _signed_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    name = user.get_username()
    services.record(
        actor=name,
        action=actions.SIGNIN,
        target_type="user",
        target_id=name,
        details={"address": _address(request)},
    )


def _sign_in_failed(
    sender: Any, credentials: dict[str, Any], request: Any = None, **_: Any
) -> None:
    # ``credentials`` is Django's cleansed copy: the password is masked; only the name is kept.
    name = str(credentials.get("username") or "")[:254]
    services.record(
        actor=None,
        action=actions.SIGNIN_FAILED,
        target_type="user",
        target_id=name,
        details={"address": _address(request)},
    )


def _token_saved(sender: Any, instance: Any, created: bool, **_: Any) -> None:
    if created:
        name = instance.user.get_username()
        services.record(
            actor=None,
            action=actions.TOKEN_CREATE,
            target_type="token",
            target_id=name,
            details={"user": name},
        )


def _token_deleted(sender: Any, instance: Any, **_: Any) -> None:
    name = instance.user.get_username()
    services.record(
        actor=None,
        action=actions.TOKEN_REVOKE,
        target_type="token",
        target_id=name,
        details={"user": name},
    )


def connect() -> None:
    from rest_framework.authtoken.models import Token

    user_logged_in.connect(_signed_in, dispatch_uid="audit.signin")
    user_login_failed.connect(_sign_in_failed, dispatch_uid="audit.signin_failed")
    post_save.connect(_token_saved, sender=Token, dispatch_uid="audit.token_saved")
    post_delete.connect(_token_deleted, sender=Token, dispatch_uid="audit.token_deleted")
