from django.contrib import admin

from .models import Agent, Item, Permission, Session, Turn


class PermissionInline(admin.TabularInline):
    model = Permission
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "agent", "status", "runner", "created_at", "updated_at"]
    list_filter = ["status"]
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
    ]
    raw_id_fields = ["agent", "runner", "created_by"]
    inlines = [PermissionInline]


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "kind", "model", "created_at", "deleted_at"]
    list_filter = ["kind"]
    search_fields = ["id", "name"]
    readonly_fields = ["id", "bundle_sha256", "bundle_size", "spec", "created_at"]


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):
    list_display = ["id", "session", "status", "created_at", "completed_at"]
    list_filter = ["status"]
    search_fields = ["id", "session__id"]
    raw_id_fields = ["session"]


@admin.register(Item)
class ItemAdmin(admin.ModelAdmin):
    list_display = ["id", "session", "type", "status", "created_at"]
    list_filter = ["type"]
    search_fields = ["id", "session__id"]
    raw_id_fields = ["session", "response"]
