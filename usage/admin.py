"""Usage in the admin: the price table (editable), and usage by user and day (read-only:
the totals are written by recorded calls only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import transaction
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
        "user_id",
        "model",
        "agent_name",
        "llm_calls",
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cost_usd",
    ]
    list_filter = ["day", "model"]
    search_fields = ["=user_id", "model", "agent_name"]
    date_hierarchy = "day"
    ordering = ["-day", "user_id", "model"]

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
