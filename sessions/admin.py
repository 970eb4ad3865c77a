"""The admin: look around and manage (sessions with their transcript, turns and grants;
agents; permissions). Everything a runner reports is read-only here: one writer per
fact (the tunnel's services), and an admin edit would race the runner."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from omnigent_runner.policies import nano_as_usd, rules_as_json
from usage.models import UserBudget

from . import budgets, policies, retention, services
from .blobs import BundleMissing
from .models import Agent, Item, Permission, PolicyChange, Session, Turn

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

# A transcript longer than this shows its most recent items (with a note).
TRANSCRIPT_ITEMS = 500
# Text of one transcript entry past this many characters is cut (with an ellipsis).
TRANSCRIPT_TEXT = 2000


class PermissionInline(admin.TabularInline):
    model = Permission
    extra = 0
    autocomplete_fields = ["user"]


class TurnInline(admin.TabularInline):
    """A session's turns, oldest first, with their status and error."""

    model = Turn
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ["id", "status", "user", "created_at", "dispatched_at", "completed_at", "error"]
    readonly_fields = [
        "id",
        "status",
        "user",
        "created_at",
        "dispatched_at",
        "completed_at",
        "error",
    ]
    ordering = ["created_at", "id"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _clip(text: str) -> str:
    return text if len(text) <= TRANSCRIPT_TEXT else text[:TRANSCRIPT_TEXT] + "…"


def _message_text(data: dict[str, Any]) -> str:
    content = data.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def transcript_entry(item: Item) -> tuple[str, str, str]:
    """(who, what, text) for one item: the transcript as a person reads it."""
    data = item.data if isinstance(item.data, dict) else {}
    if item.type == "message":
        return str(data.get("role") or "message"), "message", _clip(_message_text(data))
    if item.type == "function_call":
        arguments = data.get("arguments")
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return "assistant", f"tool call {data.get('name', '')}", _clip(shown or "")
    if item.type == "function_call_output":
        output = data.get("output")
        shown = output if isinstance(output, str) else json.dumps(output)
        return "tool", f"output of {data.get('call_id', '')}", _clip(shown or "")
    return item.type, item.status, _clip(json.dumps(data))


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "short_title",
        "agent_name",
        "status",
        "runner_online",
        "updated_at",
        "archived_at",
    ]
    list_filter = ["status", ("archived_at", admin.EmptyFieldListFilter)]
    list_select_related = ["agent", "runner"]
    # The storage of all sessions above the list (lifecycle.md, Retention).
    change_list_template = "admin/agent_sessions/session/storage_change_list.html"
    search_fields = ["id", "title", "agent__name"]
    readonly_fields = [
        "id",
        "created_at",
        "updated_at",
        "last_runner_seq",
        "last_event_seq",
        "runner_generation_opened",
        "active_response_id",
        "last_task_error",
        "policy_rules",
        "effective_rules",
        "storage",
        "transcript",
    ]
    raw_id_fields = ["agent", "runner", "created_by"]
    inlines = [PermissionInline, TurnInline]

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        """The grants inline saves through the services, so each change is audited."""
        if formset.model is not Permission:
            super().save_formset(request, form, formset, change)
            return
        actor = cast("AuthUser", request.user)
        grants = formset.save(commit=False)
        with transaction.atomic():
            services.delete_permissions_from_admin(
                grants=list(formset.deleted_objects), actor=actor
            )
            for grant in grants:
                before = Permission.objects.filter(pk=grant.pk).first() if grant.pk else None
                services.save_permission_from_admin(permission=grant, actor=actor, before=before)
        formset.save_m2m()

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        # Through the service: watchers are told, files collected, the act audited.
        services.delete_session(session=obj, actor=cast("AuthUser", request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for session in queryset.select_related("agent"):
            services.delete_session(session=session, actor=cast("AuthUser", request.user))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        context = {**(extra_context or {}), "storage_totals": retention.storage_totals()}
        return super().changelist_view(request, extra_context=context)

    @admin.display(description="storage")
    def storage(self, session: Session) -> SafeString:
        """Rows and bytes this session holds (JSON text for items and events)."""
        if session.pk is None:
            return format_html("{}", "—")
        figures = retention.session_storage(session_id=session.pk)
        return format_html(
            "{} items ({} bytes), {} events ({} bytes), {} files ({} bytes)",
            figures["items"],
            figures["item_bytes"],
            figures["events"],
            figures["event_bytes"],
            figures["files"],
            figures["file_bytes"],
        )

    @admin.display(description="title", ordering="title")
    def short_title(self, session: Session) -> str:
        title = session.title or "—"
        return title if len(title) <= 60 else title[:59] + "…"

    @admin.display(description="agent", ordering="agent__name")
    def agent_name(self, session: Session) -> str:
        return session.agent.name

    @admin.display(description="runner online", boolean=True)
    def runner_online(self, session: Session) -> bool | None:
        """None (no icon) when no runner is bound."""
        return None if session.runner is None else session.runner.online

    @admin.display(description="effective policy rules")
    def effective_rules(self, session: Session) -> SafeString:
        """What the runner evaluates: the session's rules (``policy_rules``, changed only
        through ``PUT .../policies``, which audits it), then the bundle's."""
        if session.pk is None:
            return format_html("{}", "—")
        try:
            rules, own = policies.effective(session=session)
        except BundleMissing as exc:
            return format_html("{}", f"unknown: {exc}")
        if not rules:
            return format_html("{}", "No rules: every tool call is allowed.")
        rows = format_html_join(
            "",
            '<tr><td>{}</td><td>{}</td><td style="white-space: pre-wrap">{}</td></tr>',
            (
                ("session" if index < own else "bundle", rule["name"], json.dumps(rule))
                for index, rule in enumerate(rules_as_json(rules))
            ),
        )
        return format_html(
            "<table><thead><tr><th>source</th><th>name</th><th>rule</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            rows,
        )

    @admin.display(description="transcript")
    def transcript(self, session: Session) -> SafeString:
        """Messages, tool calls and outputs in order, escaped (model output is untrusted)."""
        if session.pk is None:
            return format_html("{}", "—")
        total = session.items.count()
        items = list(session.items.order_by("-seq")[:TRANSCRIPT_ITEMS])[::-1]
        rows = format_html_join(
            "",
            '<tr><td>{}</td><td>{}</td><td style="white-space: pre-wrap">{}</td></tr>',
            (transcript_entry(item) for item in items),
        )
        note = (
            format_html("<p>The {} most recent of {} items.</p>", len(items), total)
            if total > len(items)
            else ""
        )
        return format_html(
            "{}<table><thead><tr><th>who</th><th>what</th><th>text</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            note,
            rows or format_html('<tr><td colspan="3">{}</td></tr>', "No items yet."),
        )


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "kind", "model", "created_at", "deleted_at"]
    list_filter = ["kind"]
    search_fields = ["id", "name"]
    readonly_fields = ["id", "bundle_sha256", "bundle_size", "spec", "created_at"]


class TouchesSessionAdmin(admin.ModelAdmin):
    """Rows the session snapshot shows, changed here behind the event log: the session's
    ``updated_at`` moves with them, so its ETag changes (``selectors.snapshot_etag``)
    and pollers and the per-process body cache (``sessions/snapshot_cache.py``) see the
    edit. A turn counts: deleting one removes its questions and unlinks its items."""

    def save_model(self, request: HttpRequest, obj: Any, form: ModelForm, change: bool) -> None:
        super().save_model(request, obj, form, change)
        _touch_sessions(session_ids={obj.session_id, form.initial.get("session")})

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        session_id = obj.session_id
        super().delete_model(request, obj)
        _touch_sessions(session_ids={session_id})

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        session_ids = set(queryset.values_list("session_id", flat=True))
        super().delete_queryset(request, queryset)
        _touch_sessions(session_ids=session_ids)


def _touch_sessions(*, session_ids: set[Any]) -> None:
    Session.objects.filter(pk__in=session_ids - {None}).update(updated_at=timezone.now())


@admin.register(Turn)
class TurnAdmin(TouchesSessionAdmin):
    list_display = [
        "id",
        "session",
        "user",
        "status",
        "created_at",
        "dispatched_at",
        "completed_at",
    ]
    list_filter = ["status"]
    search_fields = ["id", "session__id"]
    raw_id_fields = ["session"]
    # The scheduler's facts (fair share): who the turn counts for, when it got its slot,
    # and when the runner acknowledged its ``turn.start`` (unset: sent again on its
    # next tunnel).
    readonly_fields = ["user", "dispatched_at", "start_acked_at"]


@admin.register(Item)
class ItemAdmin(TouchesSessionAdmin):
    list_display = ["id", "session", "type", "status", "created_at"]
    list_filter = ["type"]
    search_fields = ["id", "session__id"]
    raw_id_fields = ["session"]


@admin.register(Permission)
class PermissionAdmin(admin.ModelAdmin):
    """Who holds which level on which session."""

    list_display = ["user", "session", "level", "created_at"]
    list_filter = [
        "level",
        ("user", admin.RelatedOnlyFieldListFilter),
        ("session", admin.RelatedOnlyFieldListFilter),
    ]
    list_select_related = ["user", "session"]
    search_fields = ["user__username", "user__email", "session__id", "session__title"]
    raw_id_fields = ["session"]
    autocomplete_fields = ["user"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Permission]:
        return super().get_queryset(request).order_by("session_id", "-level")

    # Grants changed here are audited and announced as the API's are (lifecycle.md).
    def save_model(self, request: HttpRequest, obj: Any, form: ModelForm, change: bool) -> None:
        before = Permission.objects.filter(pk=obj.pk).first() if change else None
        services.save_permission_from_admin(
            permission=obj, actor=cast("AuthUser", request.user), before=before
        )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        services.delete_permissions_from_admin(grants=[obj], actor=cast("AuthUser", request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        services.delete_permissions_from_admin(
            grants=list(queryset.select_related("user")), actor=cast("AuthUser", request.user)
        )


@admin.register(PolicyChange)
class PolicyChangeAdmin(admin.ModelAdmin):
    """The audit of ``PUT .../policies``: who replaced a session's rules, when, from what."""

    list_display = ["session", "user", "at"]
    list_filter = [("user", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["session", "user"]
    search_fields = ["session__id", "user__username"]
    readonly_fields = ["session", "user", "at", "old_rules", "new_rules"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(UserBudget)
class UserBudgetAdmin(admin.ModelAdmin):
    """Users' own daily budgets (usage.md, Budgets); blank: the server default. Here,
    not in ``usage``, because each change is audited (``budgets.set_user_budget``)."""

    list_display = ["user", "daily_usd", "updated_at"]
    search_fields = ["user__username"]
    autocomplete_fields = ["user"]
    readonly_fields = ["updated_at"]

    def get_form(
        self, request: HttpRequest, obj: Any | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        # Removing the user's own budget is deleting the row (the default applies).
        form.base_fields["daily_nano"].required = True
        return form

    @admin.display(description="daily budget (USD)", ordering="daily_nano")
    def daily_usd(self, obj: UserBudget) -> str:
        return "default" if obj.daily_nano is None else f"{nano_as_usd(obj.daily_nano):,.2f}"

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        budgets.set_user_budget(
            user=obj.user, actor=cast("AuthUser", request.user), daily_nano=obj.daily_nano
        )
        # The admin's messages and redirect name the stored row.
        obj.pk = UserBudget.objects.filter(user=obj.user).values_list("pk", flat=True).first()

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        budgets.set_user_budget(
            user=obj.user, actor=cast("AuthUser", request.user), daily_nano=None
        )

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[UserBudget]) -> None:
        for obj in queryset.select_related("user"):
            self.delete_model(request, obj)
