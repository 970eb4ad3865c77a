"""``POST /v1/sessions/{id}/fork`` (files.md §3): a new session from another's history.

Copy rules, all in one transaction (the source row is locked, so a runner event
cannot land half-way through the copy):

- the caller owns the fork; no grant of the source is copied; no runner is bound;
  status ``idle``; title ``Fork of <source title or id>`` unless given;
- labels are copied, plus ``omnigent.fork.source_id``;
- turns are copied with **their ids** (a response id is unique per session, see
  ``Turn``) and their original status, error, tools and times, so ``…/responses`` of
  the fork answers for the ids a client read from the source;
- items are copied in order with new ids and their original ``created_at``,
  ``created_by``, ``response_id`` and type fields. A turn still queued or running is not copied, nor
  are its items. ``up_to_response_id`` stops after the last item of that turn;
- session files are copied by reference (new rows on the same stored bytes), and the
  file blocks of copied messages point at the fork's copies;
- the change set starts empty; the event log starts empty;
- the agent: a template agent the caller can use (not deleted) is shared; otherwise
  (a session's private agent, or a deleted template) the fork gets its own private
  copy, which shares the stored bundle bytes (they are content-addressed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import transaction

from omnigent_site.domain_errors import InvalidInput
from omnigent_site.ids import new_item_id

from . import files, updates
from .models import Agent, Item, Permission, Session, Turn

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

FORK_SOURCE_LABEL = "omnigent.fork.source_id"
TITLE_MAX = 512


def default_title(source: Session) -> str:
    return f"Fork of {source.title or source.id}"[:TITLE_MAX]


def _agent_for_fork(*, source: Session, user: AuthUser) -> Agent:
    agent = source.agent
    if agent.kind == Agent.Kind.TEMPLATE and agent.deleted_at is None:
        return agent
    return Agent.objects.create(
        kind=Agent.Kind.SESSION,
        name=agent.name,
        description=agent.description,
        model=agent.model,
        spec=agent.spec,
        bundle_sha256=agent.bundle_sha256,
        bundle_size=agent.bundle_size,
        version=agent.version,
        created_by=user,
    )


def _turns_to_copy(turns: list[Turn], up_to_response_id: str | None) -> list[Turn]:
    if up_to_response_id is None:
        return [turn for turn in turns if not turn.is_open]
    target = next((turn for turn in turns if turn.id == up_to_response_id), None)
    if target is None:
        raise InvalidInput(
            f"response {up_to_response_id!r} is not a response of this session",
            field="up_to_response_id",
        )
    if target.is_open:
        raise InvalidInput(
            f"response {up_to_response_id!r} is still running", field="up_to_response_id"
        )
    cut = turns.index(target)
    return [turn for turn in turns[: cut + 1] if not turn.is_open]


def _items_to_copy(
    items: list[Item], *, kept: set[str], open_turns: set[str], up_to: str | None
) -> list[Item]:
    if up_to is not None:
        last = max((i for i, item in enumerate(items) if item.response_id == up_to), default=-1)
        items = items[: last + 1]
    return [
        item
        for item in items
        if item.response_id not in open_turns
        and (item.response_id is None or item.response_id in kept)
    ]


def fork_session(
    *,
    source: Session,
    user: AuthUser,
    title: str | None = None,
    up_to_response_id: str | None = None,
) -> Session:
    with transaction.atomic():
        locked = Session.objects.select_for_update().select_related("agent").get(pk=source.pk)
        turns = list(Turn.objects.filter(session=locked).order_by("created_at", "id"))
        kept_turns = _turns_to_copy(turns, up_to_response_id)
        kept_ids = {turn.id for turn in kept_turns}
        open_ids = {turn.id for turn in turns if turn.is_open}
        items = _items_to_copy(
            list(Item.objects.filter(session=locked).order_by("seq")),
            kept=kept_ids,
            open_turns=open_ids,
            up_to=up_to_response_id,
        )
        fork = Session.objects.create(
            agent=_agent_for_fork(source=locked, user=user),
            title=title if title is not None else default_title(locked),
            labels={**(locked.labels or {}), FORK_SOURCE_LABEL: locked.id},
            created_by=user,
        )
        Permission.objects.create(session=fork, user=user, level=Permission.Level.OWNER)
        turn_copies = [
            Turn(
                session=fork,
                id=turn.id,
                status=turn.status,
                error=turn.error,
                tools=turn.tools,
                completed_at=turn.completed_at,
            )
            for turn in kept_turns
        ]
        Turn.objects.bulk_create(turn_copies)
        for turn_copy, turn in zip(turn_copies, kept_turns, strict=True):
            turn_copy.created_at = turn.created_at
        Turn.objects.bulk_update(turn_copies, ["created_at"])
        file_ids = files.copy_files(source=locked, target=fork, user=user)
        item_copies = [
            Item(
                session=fork,
                id=new_item_id(),
                response_id=item.response_id,
                type=item.type,
                status=item.status,
                data=files.remap_file_ids(item.data, file_ids),
                created_by=item.created_by,
            )
            for item in items
        ]
        Item.objects.bulk_create(item_copies)
        for item_copy, item in zip(item_copies, items, strict=True):
            item_copy.created_at = item.created_at
        Item.objects.bulk_update(item_copies, ["created_at"])
        updates.announce_session(session_id=fork.id, kind=updates.ADDED)
    fork.refresh_from_db()
    return fork
