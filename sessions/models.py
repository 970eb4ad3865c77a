"""Agents, sessions, their transcript (items), turns (responses), grants and event log.

Models hold data and invariants only; every write goes through ``services.py``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from omnigent_site.ids import (
    new_agent_id,
    new_elicitation_id,
    new_file_id,
    new_response_id,
    new_session_id,
)
from omnigent_site.timeutil import unix


class Agent(models.Model):
    """A validated bundle. Templates are shared by name; session agents are private copies."""

    class Kind(models.TextChoices):
        TEMPLATE = "template"
        SESSION = "session"

    id = models.CharField(primary_key=True, max_length=64, default=new_agent_id, editable=False)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=128)
    description = models.TextField(blank=True, default="")
    model = models.CharField(max_length=256, blank=True, default="")
    # The parsed spec without secrets (``AgentSpec.public_dict()``).
    spec = models.JSONField(default=dict)
    bundle_sha256 = models.CharField(max_length=64)
    bundle_size = models.PositiveBigIntegerField()
    version = models.PositiveIntegerField(default=1)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Deleting a template hides it; sessions created from it keep working.
    deleted_at = models.DateTimeField(null=True, blank=True)
    # Retention of this agent's sessions, set in the admin (lifecycle.md): null follows
    # ``OMNIGENT_ARCHIVE_AFTER_DAYS`` / ``OMNIGENT_DELETE_ARCHIVED_AFTER_DAYS``; 0 never.
    archive_after_days = models.PositiveIntegerField(null=True, blank=True)
    delete_archived_after_days = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(kind="template", deleted_at__isnull=True),
                name="unique_template_agent_name",
            )
        ]
        indexes = [
            models.Index(fields=["kind", "created_at"], name="agent_kind_created"),
            models.Index(fields=["bundle_sha256"], name="agent_bundle"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class Session(models.Model):
    class Status(models.TextChoices):
        IDLE = "idle"
        RUNNING = "running"
        WAITING = "waiting"
        FAILED = "failed"

    id = models.CharField(primary_key=True, max_length=64, default=new_session_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="sessions")
    title = models.CharField(max_length=512, null=True, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IDLE)
    last_task_error = models.JSONField(null=True, blank=True)
    active_response_id = models.CharField(max_length=64, null=True, blank=True)
    runner = models.ForeignKey(
        "runners.Runner",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="sessions",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Highest runner event ``seq`` stored (tunnel.md: cumulative ``event.ack``).
    last_runner_seq = models.BigIntegerField(default=0)
    # Highest sequence number in this session's event log (the stream's ``id:``).
    last_event_seq = models.BigIntegerField(default=0)
    # The runner connection generation that acknowledged ``session.open`` (0: none).
    runner_generation_opened = models.PositiveBigIntegerField(default=0)
    # Read users may browse and search the workspace (files.md §2); else reads need edit.
    share_workspace_files = models.BooleanField(default=False)
    # The session's own policy rules (approvals.md), validated, before the bundle's.
    policy_rules = models.JSONField(default=list, blank=True)
    # Archived (lifecycle.md, Retention): hidden from the default list; set by hand
    # (``PATCH``) or after ``OMNIGENT_ARCHIVE_AFTER_DAYS`` idle; a message clears it.
    archived_at = models.DateTimeField(null=True, blank=True)
    # The runner's latest ``session.mcp_status`` (mcp.md): server name -> state.
    mcp_servers = models.JSONField(default=dict, blank=True)
    # This session's turns waiting for a runner slot, with their place in the runner's
    # queue (usage.md, Fair share): ``[{response_id, position}]``, written only by
    # ``runners.scheduler`` with a ``session.queue`` event, so the snapshot's ETag moves.
    queued_turns = models.JSONField(default=list, blank=True)
    # The cost of its priced LLM calls in nano-dollars (docs/usage.md); null until one is
    # priced. Kept with the row, which every list row reads, under its lock.
    total_cost_nano = models.BigIntegerField(null=True, blank=True)
    # Its LLM calls' sums by model (``{model: {tokens…, llm_calls, priced_calls,
    # cost_nano}}``), as its ``usage.SessionUsage`` rows sum over their days; null before
    # its first call. Written with ``total_cost_nano`` in the same UPDATE, so the
    # snapshot's and ``session.usage``'s ``usage`` read no usage rows.
    usage_totals = models.JSONField(null=True, blank=True)
    # Its budget in nano-dollars (usage.md, Budgets: ``PATCH budget_usd``, a schedule's
    # ``max_cost_usd``); null: the bundle's ``guardrails.budget_usd``, if any.
    budget_nano = models.BigIntegerField(null=True, blank=True)
    # What happens when it is spent, when the server decides (a schedule's run: deny);
    # null: the bundle's ``guardrails.on_budget``.
    on_budget = models.CharField(
        max_length=8, null=True, blank=True, choices=[("ask", "ask"), ("deny", "deny")]
    )

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["created_at", "id"], name="session_created"),
            models.Index(fields=["updated_at", "id"], name="session_updated"),
            models.Index(fields=["runner", "status"], name="session_runner_status"),
            models.Index(fields=["archived_at"], name="session_archived"),
        ]

    def __str__(self) -> str:
        return self.id


class Turn(models.Model):
    """One turn: the runner's answer to one user message.

    Its ``id`` (the response id) is unique within its session, not across sessions: a
    fork copies its source's turns under the same ids (files.md, Fork), so items and
    clients keep naming them as in the source. ``seq`` is the row's own key.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    OPEN_STATUSES = (Status.QUEUED, Status.IN_PROGRESS)

    seq = models.BigAutoField(primary_key=True)
    id = models.CharField(max_length=64, default=new_response_id, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    error = models.JSONField(null=True, blank=True)
    # Client-side tools sent with the message, kept so the turn can be re-sent.
    tools = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # Whose turn it is for fair share (usage.md): the user who sent the message.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # When the turn got a runner slot and its ``turn.start`` went out; None while it
    # waits in the server's queue (``runners.scheduler``). A message's turn is stored
    # with None; any other turn (a fork's copy, a row made by hand) counts as sent.
    dispatched_at = models.DateTimeField(null=True, blank=True, default=timezone.now)
    # When the runner acknowledged the turn's ``turn.start``. A dispatched turn without
    # it may have lost its ``turn.start`` with a closing tunnel (a server process
    # stopping): the runner's next tunnel is sent it again (``runners.services``). Like
    # ``dispatched_at``, a message's turn is stored with None and any other row counts
    # as acknowledged.
    start_acked_at = models.DateTimeField(null=True, blank=True, default=timezone.now)
    # Its LLM calls' sums (usage.shapes.add_to_turn), null before the first (docs/usage.md).
    usage = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["session", "id"], name="unique_turn_per_session")
        ]
        indexes = [
            models.Index(fields=["session", "created_at"], name="turn_session_created"),
            models.Index(fields=["session", "status"], name="turn_session_status"),
            # The scheduler's two reads: the turns waiting for a slot, and the turns
            # holding one; both small, so each index stays small.
            models.Index(
                fields=["seq"],
                name="turn_waiting",
                condition=Q(status="queued", dispatched_at__isnull=True),
            ),
            # When each user last got a slot: round-robin between users.
            models.Index(fields=["user", "dispatched_at"], name="turn_user_dispatched"),
            models.Index(
                fields=["user"],
                name="turn_holding_slot",
                condition=Q(status__in=["queued", "in_progress"], dispatched_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN_STATUSES


class Item(models.Model):
    """One transcript entry. ``data`` holds the type-specific fields (the flat shape's rest)."""

    seq = models.BigAutoField(primary_key=True)
    id = models.CharField(max_length=128, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="items")
    # The id of the session's turn this item belongs to (``Turn.id``, unique per session).
    response_id = models.CharField(max_length=64, null=True, blank=True, db_index=True)
    type = models.CharField(max_length=64)
    status = models.CharField(max_length=32, default="completed")
    data = models.JSONField(default=dict)
    created_by = models.CharField(max_length=254, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "id"], name="unique_item_per_session")
        ]
        indexes = [models.Index(fields=["session", "seq"], name="item_session_seq")]

    def __str__(self) -> str:
        return self.id

    def header(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "status": self.status,
            "response_id": self.response_id,
            "created_at": unix(self.created_at),
            "created_by": self.created_by,
        }

    def flat(self) -> dict[str, Any]:
        """The flat shape of ``/items`` and the stream: type fields at the top level."""
        return {**self.data, **self.header()}

    def nested(self) -> dict[str, Any]:
        """The nested shape of the session snapshot: type fields under ``data``."""
        return {**self.header(), "data": self.data}


class Permission(models.Model):
    class Level(models.IntegerChoices):
        READ = 1
        EDIT = 2
        MANAGE = 3
        OWNER = 4

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="grants")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="session_grants"
    )
    level = models.PositiveSmallIntegerField(choices=Level.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    # Pinning is the grantee's own choice (their sidebar lists pinned sessions first), so
    # it lives on their grant, not on the session: nobody else's list moves.
    pinned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["session", "user"], name="unique_grant"),
            models.UniqueConstraint(
                fields=["session"], condition=Q(level=4), name="one_owner_per_session"
            ),
            models.CheckConstraint(
                condition=Q(level__gte=1) & Q(level__lte=4), name="grant_level_range"
            ),
        ]
        indexes = [models.Index(fields=["user", "session"], name="grant_user_session")]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.session_id}={self.level}"


class SessionEvent(models.Model):
    """The session's durable event log: what the stream replays on resume."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    type = models.CharField(max_length=64)
    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "seq"]
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="unique_event_seq")]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.type}"


class ListCursor(models.Model):
    """The number of one user's newest session-list event (``ListEvent.seq``).

    Each list event takes the next number by updating this row in the transaction of
    the write it reports, so a user's events are numbered in the order they commit:
    a list that resumes after ``n`` misses nothing numbered later (``sessions/updates.py``).
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE, related_name="+"
    )
    last_seq = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.user_id}: {self.last_seq}"


class ListEvent(models.Model):
    """One change of one user's session list, kept so a ``GET /v1/sessions/updates`` that
    reconnects gets what it missed: which session, and whether it was added, changed
    or removed (the row itself is read when the event is sent)."""

    class Kind(models.TextChoices):
        ADDED = "added"
        UPDATED = "updated"
        REMOVED = "removed"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    seq = models.BigIntegerField()
    # Not a foreign key: the event that a session was removed outlives the session.
    session_id = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["user", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["user", "seq"], name="unique_list_event_seq")
        ]

    def __str__(self) -> str:
        return f"{self.user_id}#{self.seq} {self.kind} {self.session_id}"


class Approval(models.Model):
    """A question to a person about one tool call, and its verdict (approvals.md).

    One row per ``(turn, call_id)``, however often the runner asks: a runner that
    re-runs a turn asks again with the same ids and gets the stored verdict. Written
    only by ``sessions.approvals``; a verdict is set once, by a conditional UPDATE.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        ACCEPTED = "accepted"
        DECLINED = "declined"
        CANCELLED = "cancelled"
        EXPIRED = "expired"

    id = models.CharField(
        primary_key=True, max_length=64, default=new_elicitation_id, editable=False
    )
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="approvals")
    # The session's turn that asked (``Turn.id``, unique per session).
    response_id = models.CharField(max_length=64)
    call_id = models.CharField(max_length=256)
    tool = models.CharField(max_length=256)
    arguments = models.JSONField(default=dict)
    policy_name = models.CharField(max_length=256)
    # The rule's reason for asking, as the runner sent it.
    policy_reason = models.TextField(blank=True, default="")
    message = models.TextField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    # Null for a verdict nobody gave (expiry) and after the user is deleted.
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # The verdict's reason (the person's, or ``unanswered`` on expiry).
    reason = models.TextField(null=True, blank=True)
    # The runner acknowledged the verdict; until then ``session.open`` carries it.
    runner_acked = models.BooleanField(default=False)
    # An MCP server's own question (mcp.md): the JSON schema its answer must match
    # (null: a policy rule asked), and the accepted answer.
    requested_schema = models.JSONField(null=True, blank=True)
    content = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "response_id", "call_id"], name="unique_approval_per_call"
            )
        ]
        indexes = [
            models.Index(fields=["session", "status", "created_at"], name="approval_session"),
            models.Index(fields=["status", "expires_at"], name="approval_due"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.tool} ({self.status})"

    @property
    def action(self) -> str | None:
        """What the runner is told: ``accept``, ``decline`` or ``cancel`` (None: pending)."""
        return VERDICT_ACTIONS.get(self.status)


# The action a stored status stands for; an expired question is a ``cancel``.
VERDICT_ACTIONS: dict[str, str] = {
    Approval.Status.ACCEPTED: "accept",
    Approval.Status.DECLINED: "decline",
    Approval.Status.CANCELLED: "cancel",
    Approval.Status.EXPIRED: "cancel",
}


class PolicyChange(models.Model):
    """Audit of ``PUT .../policies``: who replaced a session's rules, when, from what."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="policy_changes")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    at = models.DateTimeField(auto_now_add=True)
    old_rules = models.JSONField(default=list)
    new_rules = models.JSONField(default=list)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["session", "at"], name="policy_change_session")]

    def __str__(self) -> str:
        return f"{self.session_id} rules changed at {self.at:%Y-%m-%d %H:%M:%S}"


class FileBlob(models.Model):
    """The stored bytes of session files with this SHA-256 (``sessions/file_store.py``).

    Bytes are kept once per hash however many session files (uploads, forks) share
    them. The reference count is the number of ``SessionFile`` rows pointing here,
    derived rather than stored so it cannot drift. Uploading and collecting lock this
    row, so bytes are never removed while a new row comes to refer to them.
    """

    sha256 = models.CharField(primary_key=True, max_length=64)
    bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.sha256


class SessionFile(models.Model):
    """A file a person gave the session (files.md §1); its bytes are in ``blob``."""

    id = models.CharField(primary_key=True, max_length=64, default=new_file_id, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="files")
    # PROTECT: a blob row goes only once no file refers to it (``files.collect_blobs``).
    blob = models.ForeignKey(
        FileBlob, on_delete=models.PROTECT, related_name="session_files", db_column="sha256"
    )
    name = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField()
    content_type = models.CharField(max_length=128)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["session", "created_at"], name="session_file_created")]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    @property
    def sha256(self) -> str:
        return str(self.blob_id)


class RetentionRun(models.Model):
    """The claim of a periodic job (``sessions/retention.py``): one row per job.

    Each server process tries to claim the job when it is due with one conditional
    ``UPDATE … WHERE due_at <= now``; the one whose update changed the row runs it, so
    the job runs once per interval across processes.
    """

    name = models.CharField(primary_key=True, max_length=64)
    due_at = models.DateTimeField()
    claimed_by = models.CharField(max_length=64, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # What the last run did (``retention.Report``).
    report = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.name} (due {self.due_at:%Y-%m-%d %H:%M})"
