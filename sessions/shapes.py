"""The JSON shapes of agents, sessions, items, responses and grants (http-api.md).

Each shape is a ``TypedDict`` that lists its fields once, next to the function that
renders it; views render with these functions and document with the classes
(``omnigent_site/schema.py`` maps a class to its OpenAPI component). No DRF here: the
runner-event service (``runners.runner_events``, DRF-free by the import contracts)
renders the ``response`` object of stream events with ``response_event_body``.

Key order in the dicts is the order clients have always seen; keep it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any, Literal, NotRequired, cast

from typing_extensions import Doc, TypedDict

from omnigent_site.shapes import CursorPage, ErrorInfo, allows_extra_keys
from omnigent_site.timeutil import unix
from usage.shapes import SessionUsageOut, TurnUsageOut, turn_usage_body, usd

from .approval_shapes import ElicitationRequestEvent, pending_elicitations
from .mcp_shapes import McpServerOut, McpServerState, mcp_servers_body, mcp_states
from .models import Agent, Approval, Item, Permission, Session, SessionFile, Turn
from .turn_queue import QueuedTurnOut, places

UnixTime = Annotated[int, Doc("Unix seconds")]
OptionalUnixTime = Annotated[int | None, Doc("Unix seconds")]


def unix_seconds(value: datetime) -> int:
    """``unix`` of a timestamp that is never null (``auto_now_add``), typed as such."""
    seconds = unix(value)
    assert seconds is not None
    return seconds


# --- agents -----------------------------------------------------------------------------


class AgentOut(TypedDict):
    """An agent: a validated bundle (template or a session's private copy)."""

    id: str
    object: Literal["agent"]
    name: str
    description: str
    created_at: UnixTime
    model: str | None
    version: int


def agent_body(agent: Agent) -> AgentOut:
    return {
        "id": agent.id,
        "object": "agent",
        "name": agent.name,
        "description": agent.description,
        "created_at": unix_seconds(agent.created_at),
        "model": agent.model or None,
        "version": agent.version,
    }


class SessionAgentOut(AgentOut):
    """A session's agent, with its MCP servers and their latest state (mcp.md)."""

    mcp_servers: list[McpServerOut]


def session_agent_body(session: Session) -> SessionAgentOut:
    return {**agent_body(session.agent), "mcp_servers": mcp_servers_body(session)}


class AgentPage(CursorPage[AgentOut]):
    """A page of template agents."""


class AgentDeletedOut(TypedDict):
    id: str
    object: Literal["agent.deleted"]
    deleted: bool


def agent_deleted_body(agent_id: str) -> AgentDeletedOut:
    return {"id": agent_id, "object": "agent.deleted", "deleted": True}


# --- items ------------------------------------------------------------------------------
# Items are rendered by ``Item.header``/``nested``/``flat`` (sessions/models.py), which
# the tunnel frames use as well; these classes type and document what they return
# (tests/unit pins ``ItemHeader`` to ``Item.header()``).


class ItemHeader(TypedDict):
    id: str
    type: str
    status: str
    response_id: str | None
    created_at: UnixTime
    created_by: str | None


class ItemOut(ItemHeader):
    """A transcript item in the snapshot's nested shape: type fields under ``data``."""

    data: dict[str, Any]


@allows_extra_keys
class FlatItemOut(ItemHeader):
    """A transcript item in the flat shape of ``/items``, responses and the stream:
    the type-specific fields (``role``, ``content``, ``call_id``...) sit at the top level."""


def nested_items(items: Iterable[Item]) -> list[ItemOut]:
    return cast("list[ItemOut]", [item.nested() for item in items])


def flat_item(item: Item) -> FlatItemOut:
    return cast(FlatItemOut, item.flat())


class ItemPage(CursorPage[FlatItemOut]):
    """A page of a session's items (flat shape)."""


# --- sessions ---------------------------------------------------------------------------


class SessionRowOut(TypedDict):
    """A session as listed: the session object without ``items``."""

    id: str
    object: Literal["session"]
    agent_id: str
    agent_name: str
    status: Annotated[str, Session.Status]
    created_at: UnixTime
    updated_at: UnixTime
    title: str | None
    labels: dict[str, str]
    runner_id: str | None
    runner_name: Annotated[
        str | None, Doc("the bound runner's name (its id when it has none); null when none")
    ]
    runner_online: Annotated[
        bool, Doc("whether the bound runner's tunnel is live; true when none is bound")
    ]
    last_task_error: Annotated[
        ErrorInfo | None, Doc("why the last turn failed; cleared when a new turn starts")
    ]
    active_response_id: str | None
    permission_level: Annotated[int, Doc("the caller's level: 1 read, 2 edit, 3 manage, 4 owner")]
    pending_elicitations_count: Annotated[int, Doc("questions waiting for a person's verdict")]
    share_workspace_files: Annotated[
        bool, Doc("read users may browse and search the workspace (else reads need edit)")
    ]
    archived: Annotated[
        bool, Doc("hidden from the default list (`?archived=1` lists these); a message clears it")
    ]
    pinned: Annotated[
        bool,
        Doc("the caller pinned it (`PUT /v1/sessions/{id}/pin`): their own choice, per user"),
    ]
    total_cost_usd: Annotated[
        float | None, Doc("the cost of its priced LLM calls (docs/usage.md); null: none priced")
    ]
    budget_usd: Annotated[
        float | None,
        Doc("its own budget (`PATCH budget_usd`, usage.md); null: none (a bundle's may apply)"),
    ]


class SessionOut(SessionRowOut):
    """The session snapshot (``GET``/``PATCH /v1/sessions/{id}``, JSON create)."""

    items: list[ItemOut]
    pending_elicitations: Annotated[
        list[ElicitationRequestEvent],
        Doc("the open questions' request payloads, oldest first (approvals.md)"),
    ]
    mcp_servers: Annotated[
        dict[str, McpServerState],
        Doc("the MCP servers' latest state as the runner reported it (mcp.md)"),
    ]
    queued_turns: Annotated[
        list[QueuedTurnOut],
        Doc("turns waiting for a runner slot, with their place in its queue (usage.md)"),
    ]
    usage: Annotated[
        SessionUsageOut | None,
        Doc("its LLM calls' tokens and cost, in all and by model (docs/usage.md); null: none"),
    ]


def session_row(session: Session, *, level: int, pending_count: int | None = None) -> SessionRowOut:
    """``pending_count`` defaults to the ``pending_elicitations_count`` annotation of
    ``selectors.sessions_granted_to`` (0 without it); ``pinned`` is read from the
    ``grant_pinned_at`` column the selectors join from the reader's grant (not pinned
    without it: a session just created, imported or forked)."""
    if pending_count is None:
        pending_count = int(getattr(session, "pending_elicitations_count", 0) or 0)
    runner = session.runner
    return {
        "id": session.id,
        "object": "session",
        "agent_id": session.agent_id,
        "agent_name": session.agent.name,
        "status": session.status,
        "created_at": unix_seconds(session.created_at),
        "updated_at": unix_seconds(session.updated_at),
        "title": session.title,
        "labels": session.labels or {},
        "runner_id": session.runner_id,
        "runner_name": (runner.name or runner.id) if runner is not None else None,
        "runner_online": runner.online if runner is not None else True,
        "last_task_error": session.last_task_error,
        "active_response_id": session.active_response_id,
        "permission_level": level,
        "pending_elicitations_count": pending_count,
        "share_workspace_files": session.share_workspace_files,
        "archived": session.archived_at is not None,
        "pinned": getattr(session, "grant_pinned_at", None) is not None,
        "total_cost_usd": (
            usd(session.total_cost_nano) if session.total_cost_nano is not None else None
        ),
        "budget_usd": usd(session.budget_nano) if session.budget_nano is not None else None,
    }


def session_body(
    session: Session,
    *,
    level: int,
    items: Iterable[Item],
    pending: Iterable[Approval] = (),
    usage: SessionUsageOut | None = None,
) -> SessionOut:
    """``pending``: the session's open questions, oldest first; ``usage``: its totals
    (``usage.selectors.session_usage``)."""
    requests = pending_elicitations(pending)
    return {
        **session_row(session, level=level, pending_count=len(requests)),
        "items": nested_items(items),
        "pending_elicitations": requests,
        "mcp_servers": mcp_states(session),
        "queued_turns": places(session),
        "usage": usage,
    }


class SessionListRowOut(SessionRowOut):
    """A row of ``GET /v1/sessions``: with ``search_query``, where the search matched."""

    search_snippet: NotRequired[
        Annotated[
            str | None,
            Doc(
                "with search_query: up to 200 characters of the first matching item around "
                "the match, matched words between « and »; null for a title-only match"
            ),
        ]
    ]
    search_item_id: NotRequired[
        Annotated[
            str | None,
            Doc("with search_query: the first matching item; null for a title-only match"),
        ]
    ]


def session_list_row(
    session: Session, *, level: int, search_hit: tuple[str, str] | None | bool = False
) -> SessionListRowOut:
    """``search_hit``: ``(item id, snippet)`` of a search's first matching item, None for
    a title-only match, False when the list was not searched (no search fields)."""
    row: SessionListRowOut = {**session_row(session, level=level)}  # type: ignore[typeddict-item]
    if search_hit is not False:
        item_id, snippet = search_hit if isinstance(search_hit, tuple) else (None, None)
        row["search_snippet"] = snippet
        row["search_item_id"] = item_id
    return row


class SessionPage(CursorPage[SessionListRowOut]):
    """A page of the sessions where the caller holds a grant."""


class SessionCreatedOut(TypedDict):
    """The reply to a multipart create."""

    session_id: str
    agent_id: str
    agent_name: str


def session_created_body(session: Session) -> SessionCreatedOut:
    return {
        "session_id": session.id,
        "agent_id": session.agent_id,
        "agent_name": session.agent.name,
    }


class SessionDeletedOut(TypedDict):
    id: str
    object: Literal["conversation.deleted"]
    deleted: bool


def session_deleted_body(session_id: str) -> SessionDeletedOut:
    return {"id": session_id, "object": "conversation.deleted", "deleted": True}


class SessionPinOut(TypedDict):
    """``PUT``/``DELETE /v1/sessions/{id}/pin``: whether the session is now pinned in the
    caller's list."""

    object: Literal["session.pin"]
    session_id: str
    pinned: bool


def session_pin_body(session_id: str, *, pinned: bool) -> SessionPinOut:
    return {"object": "session.pin", "session_id": session_id, "pinned": pinned}


# --- responses (turns) ------------------------------------------------------------------


class ResponseCommon(TypedDict):
    id: str
    object: Literal["response"]
    status: Annotated[str, Turn.Status]
    error: ErrorInfo | None
    output: Annotated[
        list[FlatItemOut], Doc("what the turn produced, without the input that started it")
    ]
    created_at: UnixTime
    usage: Annotated[
        TurnUsageOut | None,
        Doc("its LLM calls' tokens and cost (docs/usage.md); null before the first call"),
    ]


class ResponseOut(ResponseCommon):
    """A turn, as ``GET .../responses[/{id}]`` return it."""

    completed_at: OptionalUnixTime


class ResponseEventOut(ResponseCommon):
    """The ``response`` of the stream's ``response.*`` events."""

    model: Annotated[str, Doc("the agent's model")]


def _response_common(turn: Turn, output: list[dict[str, Any]]) -> ResponseCommon:
    return {
        "id": turn.id,
        "object": "response",
        "status": turn.status,
        "error": turn.error,
        "output": cast("list[FlatItemOut]", output),
        "created_at": unix_seconds(turn.created_at),
        "usage": turn_usage_body(turn.usage),
    }


def response_body(turn: Turn, *, output: list[dict[str, Any]]) -> ResponseOut:
    return {**_response_common(turn, output), "completed_at": unix(turn.completed_at)}


def response_event_body(
    turn: Turn, *, output: list[dict[str, Any]], model: str
) -> ResponseEventOut:
    return {**_response_common(turn, output), "model": model}


class ResponsePage(CursorPage[ResponseOut]):
    """A page of a session's turns."""


# --- permissions ------------------------------------------------------------------------


class GrantOut(TypedDict):
    """One user's grant on a session."""

    user_id: str
    conversation_id: Annotated[str, Doc("the session's id")]
    level: Annotated[int, Doc("1 read, 2 edit, 3 manage, 4 owner")]


class GrantSetOut(GrantOut):
    """The reply to ``PUT .../permissions``: the grant with both session ids (equal)."""

    session_id: str


class GrantListOut(TypedDict):
    """Grants ordered by user id; ``next_cursor`` is the ``after`` of the next page."""

    permissions: list[GrantOut]
    next_cursor: str | None


def grant_body(grant: Permission) -> GrantOut:
    return {
        "user_id": grant.user.get_username(),
        "conversation_id": grant.session_id,
        "level": grant.level,
    }


def grant_set_body(grant: Permission) -> GrantSetOut:
    return {**grant_body(grant), "session_id": grant.session_id}


def grant_list_body(grants: list[Permission], *, next_cursor: str | None) -> GrantListOut:
    return {"permissions": [grant_body(grant) for grant in grants], "next_cursor": next_cursor}


# --- identity ---------------------------------------------------------------------------


class MeOut(TypedDict):
    user_id: str
    is_admin: bool


def me_body(*, user_id: str, is_admin: bool) -> MeOut:
    return {"user_id": user_id, "is_admin": is_admin}


# --- session files (files.md §1) --------------------------------------------------------


class SessionFileMetadata(TypedDict):
    filename: str
    bytes: int
    content_type: Annotated[str, Doc("decided by the server from the bytes and the name")]
    sha256: Annotated[str, Doc("hex SHA-256 of the bytes (also the download's ETag)")]
    created_at: UnixTime


class SessionFileOut(TypedDict):
    """A file a person gave the session; the agent reads it through message blocks."""

    id: str
    object: Literal["session.resource"]
    type: Literal["file"]
    session_id: str
    name: str
    metadata: SessionFileMetadata


def session_file_body(file: SessionFile) -> SessionFileOut:
    return {
        "id": file.id,
        "object": "session.resource",
        "type": "file",
        "session_id": file.session_id,
        "name": file.name,
        "metadata": {
            "filename": file.name,
            "bytes": file.bytes,
            "content_type": file.content_type,
            "sha256": file.sha256,
            "created_at": unix_seconds(file.created_at),
        },
    }


class SessionFilePage(CursorPage[SessionFileOut]):
    """A page of a session's files."""


class SessionFileDeletedOut(TypedDict):
    id: str
    object: Literal["session.resource.deleted"]
    deleted: bool


def session_file_deleted_body(file_id: str) -> SessionFileDeletedOut:
    return {"id": file_id, "object": "session.resource.deleted", "deleted": True}


# --- the inbox (GET /v1/inbox) -----------------------------------------------------------


class InboxApprovalOut(TypedDict):
    """An open question the user may answer."""

    session_id: str
    session_title: str | None
    elicitation_id: str
    tool: str
    message: str
    created_at: UnixTime


class InboxFailureOut(TypedDict):
    """A session of the user's whose last turn failed."""

    session_id: str
    session_title: str | None
    error: ErrorInfo | None
    updated_at: UnixTime


class InboxOut(TypedDict):
    """What waits for the user across their sessions (docs/web.md, Inbox)."""

    object: Literal["inbox"]
    approvals: Annotated[
        list[InboxApprovalOut],
        Doc("open questions in sessions where the user holds edit or more, oldest first"),
    ]
    failed: Annotated[
        list[InboxFailureOut], Doc("the user's sessions whose last turn failed, newest first")
    ]
    count: Annotated[int, Doc("len(approvals) + len(failed)")]


def inbox_body(approvals: Iterable[Approval], failed: Iterable[Session]) -> InboxOut:
    questions: list[InboxApprovalOut] = [
        {
            "session_id": approval.session_id,
            "session_title": approval.session.title,
            "elicitation_id": approval.id,
            "tool": approval.tool,
            "message": approval.message,
            "created_at": unix_seconds(approval.created_at),
        }
        for approval in approvals
    ]
    failures: list[InboxFailureOut] = [
        {
            "session_id": session.id,
            "session_title": session.title,
            "error": session.last_task_error,
            "updated_at": unix_seconds(session.updated_at),
        }
        for session in failed
    ]
    return {
        "object": "inbox",
        "approvals": questions,
        "failed": failures,
        "count": len(questions) + len(failures),
    }
