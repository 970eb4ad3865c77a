from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from sessions.models import Session

from . import services
from .models import Runner


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
            services.revoke_runner(runner=runner)
            count += 1
        self.message_user(request, f"Revoked {count} runner(s).", messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A runner's id derives from a token that must be shown once: use POST /v1/runners.
        return False
