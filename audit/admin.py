"""The audit log in the admin: read-only, to everyone (nothing can change a record)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import AuditRecord


@admin.register(AuditRecord)
class AuditRecordAdmin(admin.ModelAdmin):
    list_display = ["id", "at", "actor", "action", "target_type", "target_id", "session_id"]
    list_filter = ["action"]
    search_fields = ["actor", "target_id", "session_id"]
    date_hierarchy = "at"
    readonly_fields = [
        "id",
        "at",
        "actor",
        "action",
        "target_type",
        "target_id",
        "session_id",
        "details",
    ]
    actions = None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
