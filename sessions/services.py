"""Every write to agents, sessions, items and grants goes through these functions."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import actions as audit_actions
from audit import services as audit
from omnigent_runner.bundles import Bundle, BundleError, parse_bundle
from omnigent_site.domain_errors import Conflict, Forbidden, InvalidInput, NotFound
from omnigent_site.ids import new_item_id
from omnigent_site.json_input import UNSTORABLE_TEXT, has_unstorable_text
from omnigent_site.users import get_or_create_user

from . import blobs, files, updates, webhook_events
from .eventlog import publish_session_end
from .models import Agent, Item, Permission, Session

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

log = logging.getLogger(__name__)

UNSET: Any = object()


# --- agents ---------------------------------------------------------------------


def parse_uploaded_bundle(*, data: bytes) -> Bundle:
    """Validate bundle bytes; a bad bundle is a 400 that says why."""
    try:
        return parse_bundle(data, max_yaml_bytes=settings.OMNIGENT_MAX_AGENT_YAML_BYTES)
    except BundleError as exc:
        # A spec field at fault (an MCP declaration's ``tools.git.args``) is named too.
        fields = {"bundle": str(exc), exc.field: str(exc)} if exc.field else None
        raise InvalidInput(str(exc), field="bundle", fields=fields) from exc


def _agent_from_bundle(*, bundle: Bundle, kind: str, user: AuthUser | None) -> Agent:
    spec = bundle.spec
    return Agent.objects.create(
        kind=kind,
        name=spec.name,
        description=spec.description,
        model=spec.model or "",
        spec=spec.public_dict(),
        bundle_sha256=bundle.sha256,
        bundle_size=bundle.size,
        created_by=user,
    )


def _forget_blob_unless_used(sha256: str) -> None:
    if not Agent.objects.filter(bundle_sha256=sha256).exists():
        blobs.remove_bundle(sha256)


def create_template_agent(*, data: bytes, user: AuthUser) -> Agent:
    bundle = parse_uploaded_bundle(data=data)
    name = bundle.spec.name
    if Agent.objects.filter(kind=Agent.Kind.TEMPLATE, name=name, deleted_at__isnull=True).exists():
        raise Conflict(f"an agent named {name!r} already exists")
    created_blob = blobs.store_bundle(sha256=bundle.sha256, data=data)
    try:
        with transaction.atomic():
            return _agent_from_bundle(bundle=bundle, kind=Agent.Kind.TEMPLATE, user=user)
    except IntegrityError as exc:
        if created_blob:
            _forget_blob_unless_used(bundle.sha256)
        raise Conflict(f"an agent named {name!r} already exists") from exc
    except BaseException:
        if created_blob:
            _forget_blob_unless_used(bundle.sha256)
        raise


def delete_template_agent(*, agent: Agent, user: AuthUser, is_admin: bool) -> None:
    """Hide a template. Sessions created from it keep it, so it is not removed."""
    if agent.kind != Agent.Kind.TEMPLATE:
        raise NotFound(f"agent {agent.id!r} not found")
    if not is_admin and agent.created_by_id != user.pk:
        raise Forbidden("only the agent's creator or an admin can delete it")
    with transaction.atomic():
        removed = not agent.sessions.exists()
        if removed:
            agent.delete()
        else:
            agent.deleted_at = timezone.now()
            agent.save(update_fields=["deleted_at"])
        audit.record(
            actor=user,
            action=audit_actions.AGENT_DELETE,
            target_type="agent",
            target_id=agent.id,
            details={"name": agent.name, "bundle_sha256": agent.bundle_sha256},
        )
    if removed:
        _forget_blob_unless_used(agent.bundle_sha256)


# --- sessions -------------------------------------------------------------------


def _grant_owner(*, session: Session, user: AuthUser) -> None:
    Permission.objects.create(session=session, user=user, level=Permission.Level.OWNER)


def normalise_initial_item(raw: dict[str, Any]) -> dict[str, Any]:
    """Split a flat item into its header and type fields; reject what cannot be stored."""
    if not isinstance(raw, dict):
        raise InvalidInput("each item must be an object", field="initial_items")
    if has_unstorable_text(raw):
        raise InvalidInput(UNSTORABLE_TEXT, field="initial_items")
    item_type = raw.get("type")
    if not isinstance(item_type, str) or not item_type:
        raise InvalidInput("each item needs a string 'type'", field="initial_items")
    data = {
        key: value
        for key, value in raw.items()
        if key not in {"id", "type", "status", "response_id", "created_at", "created_by"}
    }
    if item_type == "message":
        data = normalise_message(data, field="initial_items")
    item_id = raw.get("id") or new_item_id()
    if not isinstance(item_id, str) or len(item_id) > 128:
        raise InvalidInput(
            "an item 'id' must be a string of 128 characters or fewer", field="initial_items"
        )
    status = raw.get("status") or "completed"
    if not isinstance(status, str):
        raise InvalidInput("an item 'status' must be a string", field="initial_items")
    return {"id": item_id, "type": item_type, "status": status, "data": data}


def normalise_message(data: dict[str, Any], *, field: str) -> dict[str, Any]:
    """A message's ``role`` and ``content`` in the list-of-parts form."""
    if has_unstorable_text(data):
        raise InvalidInput(UNSTORABLE_TEXT, field=field)
    role = data.get("role", "user")
    if role not in {"user", "assistant", "system", "developer"}:
        raise InvalidInput(f"unknown message role {role!r}", field=field)
    content = data.get("content")
    if isinstance(content, str):
        part_type = "output_text" if role == "assistant" else "input_text"
        content = [{"type": part_type, "text": content}]
    if not isinstance(content, list) or not content:
        raise InvalidInput("a message needs 'content': a string or a list of parts", field=field)
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidInput("each content part must be an object with a 'type'", field=field)
        if part["type"] in {"input_text", "output_text", "text"} and not isinstance(
            part.get("text"), str
        ):
            raise InvalidInput(f"a {part['type']} part needs a string 'text'", field=field)
    return {**data, "role": role, "content": content}


def create_session(
    *,
    user: AuthUser,
    agent: Agent,
    title: str | None = None,
    labels: dict[str, str] | None = None,
    initial_items: list[dict[str, Any]] | None = None,
) -> Session:
    username = user.get_username()
    prepared = [normalise_initial_item(raw) for raw in initial_items or []]
    if len({item["id"] for item in prepared}) != len(prepared):
        raise InvalidInput("item ids must be unique", field="initial_items")
    with transaction.atomic():
        session = Session.objects.create(
            agent=agent, title=title, labels=labels or {}, created_by=user
        )
        _grant_owner(session=session, user=user)
        Item.objects.bulk_create(
            [
                Item(
                    session=session,
                    id=item["id"],
                    type=item["type"],
                    status=item["status"],
                    data=item["data"],
                    created_by=username if item["data"].get("role", "user") == "user" else None,
                )
                for item in prepared
            ]
        )
        updates.announce_session(session_id=session.id, kind=updates.ADDED)
        webhook_events.session_created(session)
    return session


def create_session_from_bundle(
    *,
    user: AuthUser,
    data: bytes,
    title: str | None = None,
    labels: dict[str, str] | None = None,
) -> Session:
    """The session and its private agent in one transaction; a bad bundle writes nothing."""
    bundle = parse_uploaded_bundle(data=data)
    created_blob = blobs.store_bundle(sha256=bundle.sha256, data=data)
    try:
        with transaction.atomic():
            agent = _agent_from_bundle(bundle=bundle, kind=Agent.Kind.SESSION, user=user)
            return create_session(user=user, agent=agent, title=title, labels=labels)
    except BaseException:
        if created_blob:
            _forget_blob_unless_used(bundle.sha256)
        raise


def update_session(
    *,
    session: Session,
    title: Any = UNSET,
    labels: Any = UNSET,
    share_workspace_files: Any = UNSET,
    archived: Any = UNSET,
) -> Session:
    fields = ["updated_at"]
    if archived is not UNSET and bool(archived) != (session.archived_at is not None):
        # Archived by hand keeps its own date; unarchiving makes it a fresh session again.
        session.archived_at = timezone.now() if archived else None
        fields.append("archived_at")
    if share_workspace_files is not UNSET:
        session.share_workspace_files = bool(share_workspace_files)
        fields.append("share_workspace_files")
    if title is not UNSET:
        session.title = title
        fields.append("title")
    if labels is not UNSET:
        session.labels = labels
        fields.append("labels")
    with transaction.atomic():
        session.save(update_fields=fields)
        updates.announce_session(session_id=session.id)
    return session


def delete_session(
    *, session: Session, actor: AuthUser | None = None, reason: str = "deleted"
) -> None:
    """Delete the session and everything it owns; watchers' streams end.

    ``actor``: who deleted it (None: the retention job, ``reason`` says why).
    """
    session_id = session.id
    agent = session.agent
    file_hashes = files.session_blob_hashes(session=session)
    with transaction.atomic():
        watchers = updates.grantees(session_id=session_id)
        audit.record(
            actor=actor,
            action=audit_actions.SESSION_DELETE,
            target_type="session",
            target_id=session_id,
            session_id=session_id,
            details={"title": session.title, "agent_id": agent.id, "reason": reason},
        )
        session.delete()
        updates.announce_removed(session_id=session_id, user_pks=watchers)
        webhook_events.session_deleted(session_id=session_id, readers=watchers)
        if agent.kind == Agent.Kind.SESSION and not agent.sessions.exists():
            agent.delete()
        elif agent.deleted_at is not None and not agent.sessions.exists():
            agent.delete()
        transaction.on_commit(
            lambda: publish_session_end(session_id=session_id, reason="session deleted")
        )
    if not Agent.objects.filter(pk=agent.pk).exists():
        _forget_blob_unless_used(agent.bundle_sha256)
    # The session's files went with it; their bytes go unless another session uses them.
    files.collect_blobs(file_hashes)


def set_pinned(*, session: Session, user: AuthUser, pinned: bool) -> bool:
    """Pin or unpin the session in the user's own list; returns ``pinned``.

    The pin is on the user's grant (nobody else's list changes) and does not move
    ``updated_at`` (pinning is no activity). Pinning twice changes nothing and announces
    nothing. A caller without a grant of their own (an admin reading another's session)
    has no list row to pin.
    """
    with transaction.atomic():
        grant = Permission.objects.select_for_update().filter(session=session, user=user).first()
        if grant is None:
            raise Forbidden(
                "only a session in your own list (one you hold a grant on) can be pinned"
            )
        if (grant.pinned_at is not None) != pinned:
            grant.pinned_at = timezone.now() if pinned else None
            grant.save(update_fields=["pinned_at"])
            updates.announce_session(session_id=session.id, only=user.pk)
    return pinned


# --- grants ---------------------------------------------------------------------


def grant_permission(*, session: Session, actor: AuthUser, user_id: str, level: int) -> Permission:
    """Upsert another user's grant (levels 1–3); the owner's grant is fixed."""
    if user_id == actor.get_username():
        raise Forbidden("you cannot change your own permission")
    if not 1 <= level <= 3:
        raise InvalidInput("must be 1 (read), 2 (edit) or 3 (manage)", field="level")
    target = get_or_create_user(user_id)
    with transaction.atomic():
        grant = Permission.objects.select_for_update().filter(session=session, user=target).first()
        if grant is not None and grant.level == Permission.Level.OWNER:
            raise Forbidden("the owner's permission cannot be changed")
        previous = grant.level if grant is not None else None
        if grant is None:
            grant = Permission.objects.create(session=session, user=target, level=level)
            updates.announce_session(session_id=session.id, kind=updates.ADDED, only=target.pk)
        else:
            grant.level = level
            grant.save(update_fields=["level"])
            updates.announce_session(session_id=session.id, only=target.pk)
        audit.record(
            actor=actor,
            action=audit_actions.PERMISSION_GRANT,
            target_type="user",
            target_id=target.get_username(),
            session_id=session.id,
            details={"level": level, "previous_level": previous},
        )
    return grant


def save_permission_from_admin(
    *, permission: Permission, actor: AuthUser, before: Permission | None
) -> None:
    """Save a grant edited in the admin with its audit record, as the API's grants are.

    ``before``: the row as stored before the edit (None when the admin adds one). A
    grant moved to another user or session is the old one's revocation and a new grant.
    """
    moved = before is not None and (before.session_id, before.user_id) != (
        permission.session_id,
        permission.user_id,
    )
    with transaction.atomic():
        permission.save()
        if before is not None and moved:
            _audit_admin_revoke(grant=before, actor=actor)
        previous = before.level if before is not None and not moved else None
        audit.record(
            actor=actor,
            action=audit_actions.PERMISSION_GRANT,
            target_type="user",
            target_id=permission.user.get_username(),
            session_id=permission.session_id,
            details={"level": permission.level, "previous_level": previous, "via": "admin"},
        )
        kind = updates.UPDATED if previous is not None else updates.ADDED
        updates.announce_session(
            session_id=permission.session_id, kind=kind, only=permission.user_id
        )


def delete_permissions_from_admin(*, grants: list[Permission], actor: AuthUser) -> None:
    """Delete grants in the admin, each with its audit record, all or none."""
    with transaction.atomic():
        for grant in grants:
            grant.delete()
            _audit_admin_revoke(grant=grant, actor=actor)


def _audit_admin_revoke(*, grant: Permission, actor: AuthUser) -> None:
    audit.record(
        actor=actor,
        action=audit_actions.PERMISSION_REVOKE,
        target_type="user",
        target_id=grant.user.get_username(),
        session_id=grant.session_id,
        details={"level": grant.level, "via": "admin"},
    )
    updates.announce_removed(session_id=grant.session_id, user_pks=[grant.user_id])


def revoke_permission(*, session: Session, user_id: str, actor: AuthUser | None = None) -> None:
    grant = Permission.objects.filter(session=session, user__username=user_id).first()
    if grant is None:
        raise NotFound(f"user {user_id!r} has no permission on this session")
    if grant.level == Permission.Level.OWNER:
        raise Forbidden("the owner cannot be revoked or leave the session")
    with transaction.atomic():
        grant.delete()
        audit.record(
            actor=actor,
            action=audit_actions.PERMISSION_REVOKE,
            target_type="user",
            target_id=user_id,
            session_id=session.id,
            details={"level": grant.level},
        )
        updates.announce_removed(session_id=session.id, user_pks=[grant.user_id])
