from django.contrib import admin

from .models import ScheduledRun, ScheduledTask


@admin.register(ScheduledTask)
class ScheduledTaskAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "rrule", "timezone", "enabled", "next_run_at", "created_at"]
    list_filter = ["enabled", "session_mode"]
    search_fields = ["id", "name", "owner__username", "agent_id"]
    readonly_fields = ["dtstart_local", "anchor_local", "rule_body", "next_run_at"]


@admin.register(ScheduledRun)
class ScheduledRunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "task",
        "scheduled_for",
        "trigger",
        "status",
        "session_id",
        "error",
        "claimed_by",
    ]
    list_filter = ["status", "trigger"]
    search_fields = ["id", "task__id", "task__name", "session_id"]
    raw_id_fields = ["task"]
