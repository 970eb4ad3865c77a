"""Usage in the admin: the price table (editable), and usage by user and day (read-only:
the totals are written by recorded calls only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest

from .models import DailyUsage, LlmCall, Price
from .services import prices


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = [
        "model",
        "input_per_million",
        "output_per_million",
        "cache_read_per_million",
        "cache_write_per_million",
        "updated_at",
    ]
    search_fields = ["model"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        # This process prices with the new row at once; others within the cache's TTL.
        transaction.on_commit(prices.clear)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        super().delete_model(request, obj)
        transaction.on_commit(prices.clear)


class ReadOnlyAdmin(admin.ModelAdmin):
    actions = None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(DailyUsage)
class DailyUsageAdmin(ReadOnlyAdmin):
    list_display = [
        "day",
        "user_name",
        "model",
        "agent_name",
        "llm_calls",
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cost_usd",
    ]
    list_filter = ["day", "model"]
    search_fields = ["user_name", "model", "agent_name"]
    date_hierarchy = "day"
    ordering = ["-day", "user_id", "model"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[DailyUsage]:
        """Each row with its user's name (no foreign key: spend outlives the user)."""
        User = get_user_model()
        name = User.objects.filter(pk=OuterRef("user_id")).values(User.USERNAME_FIELD)[:1]
        return super().get_queryset(request).annotate(user_name=Subquery(name))

    @admin.display(description="user", ordering="user_name")
    def user_name(self, obj: DailyUsage) -> str:
        return getattr(obj, "user_name", None) or f"(user {obj.user_id})"

    @admin.display(description="cost (USD)")
    def cost_usd(self, obj: DailyUsage) -> str:
        return f"{obj.cost_nano / 1e9:.6f}" if obj.priced_calls else "—"


@admin.register(LlmCall)
class LlmCallAdmin(ReadOnlyAdmin):
    list_display = [
        "created_at",
        "session_id",
        "response_id",
        "user_id",
        "model",
        "input_tokens",
        "output_tokens",
        "reported",
        "cost_nano",
    ]
    list_filter = ["reported", "model"]
    search_fields = ["=session_id", "=response_id"]
    date_hierarchy = "created_at"
