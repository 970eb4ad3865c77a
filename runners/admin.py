from typing import cast

from django.contrib import admin, messages
from django.contrib.auth.models import User as AuthUser
from django.db.models import QuerySet
from django.http import HttpRequest

from sessions import approvals
from sessions.models import Approval, Session

from . import services
from .models import Runner
from .verdicts import post_verdicts


class BoundSessionInline(admin.TabularInline):
    """The sessions bound to this runner (bind or unbind through the API)."""

    model = Session
    fk_name = "runner"
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ["id", "title", "status", "updated_at"]
    readonly_fields = ["id", "title", "status", "updated_at"]
    verbose_name = "bound session"
    verbose_name_plural = "bound sessions"

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Runner)
class RunnerAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "owner",
        "is_online",
        "last_seen_at",
        "runner_version",
        "max_turns",
        "revoked_at",
    ]
    list_filter = ["revoked_at"]
    search_fields = ["id", "name", "owner__username"]
    readonly_fields = [
        "id",
        "channel_name",
        "generation",
        "connected_at",
        "disconnected_at",
        "last_seen_at",
        "runner_version",
        "workspace",
        "max_turns",  # from the runner's hello (fair share)
        "created_at",
        "revoked_at",
    ]
    raw_id_fields = ["owner"]
    actions = ["revoke"]
    inlines = [BoundSessionInline]

    @admin.display(boolean=True, description="online")
    def is_online(self, runner: Runner) -> bool:
        return runner.online

    @admin.action(description="Revoke selected runners (close their tunnels)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[Runner]) -> None:
        count = 0
        for runner in queryset.filter(revoked_at__isnull=True):
            services.revoke_runner(runner=runner, actor=cast(AuthUser, request.user))
            count += 1
        self.message_user(request, f"Revoked {count} runner(s).", messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A runner's id derives from a token that must be shown once: use POST /v1/runners.
        return False


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    """Questions about tool calls and their verdicts (approvals.md, Audit).

    Read-only rows: a verdict is given with the actions, which go through the same
    service as the API (first verdict wins) and are then sent to the runner.
    """

    list_display = ["id", "session", "tool", "status", "created_at", "expires_at", "resolved_by"]
    list_filter = [
        "status",
        ("session", admin.RelatedOnlyFieldListFilter),
        "tool",
        ("resolved_by", admin.RelatedOnlyFieldListFilter),
    ]
    list_select_related = ["session", "resolved_by"]
    search_fields = ["id", "session__id", "tool", "call_id", "policy_name"]
    readonly_fields = [
        "id",
        "session",
        "response_id",
        "call_id",
        "tool",
        "arguments",
        "policy_name",
        "policy_reason",
        "message",
        "status",
        "created_at",
        "expires_at",
        "resolved_at",
        "resolved_by",
        "reason",
        "runner_acked",
    ]
    actions = ["accept", "decline", "cancel"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # The audit trail goes with its session, never on its own.
        return False

    def _resolve(self, request: HttpRequest, queryset: QuerySet[Approval], action: str) -> None:
        resolved = skipped = 0
        for approval in queryset.filter(status=Approval.Status.PENDING).select_related(
            "session__runner"
        ):
            resolution = approvals.resolve(
                session_id=approval.session_id,
                approval_id=approval.id,
                action=action,
                user=request.user,  # type: ignore[arg-type]
                reason=f"{action} in the admin",
            )
            if resolution.stored:
                runner = approval.session.runner
                post_verdicts(
                    channel_name=runner.channel_name if runner is not None else "",
                    approvals=[resolution.approval],
                )
            if resolution.stored and not resolution.conflict:
                resolved += 1
            else:
                skipped += 1
        level = messages.SUCCESS if resolved else messages.WARNING
        note = f" ({skipped} already had a verdict)" if skipped else ""
        self.message_user(request, f"{action}: {resolved} approval(s){note}.", level)

    @admin.action(description="Accept the selected pending approvals (the tool runs)")
    def accept(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._resolve(request, queryset, "accept")

    @admin.action(description="Decline the selected pending approvals")
    def decline(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._resolve(request, queryset, "decline")

    @admin.action(description="Cancel the selected pending approvals")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Approval]) -> None:
        self._resolve(request, queryset, "cancel")
