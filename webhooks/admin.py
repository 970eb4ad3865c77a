from django.contrib import admin

from .models import Delivery, DeliveryAttempt, Webhook


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ["id", "url", "owner", "enabled", "disabled_reason", "created_at"]
    list_filter = ["enabled"]
    search_fields = ["id", "url", "owner__username", "description"]
    raw_id_fields = ["owner"]
    # The secrets sign deliveries; the admin never shows them.
    exclude = ["secret", "previous_secret"]
    readonly_fields = [
        "id",
        "previous_secret_expires_at",
        "consecutive_failures",
        "created_at",
        "updated_at",
    ]

    def has_add_permission(self, request: object) -> bool:
        return False


class AttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    fields = ["number", "started_at", "status_code", "error", "latency_ms"]
    readonly_fields = ["number", "started_at", "status_code", "error", "latency_ms"]

    def has_add_permission(self, request: object, obj: object = None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "webhook",
        "event",
        "status",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "created_at",
    ]
    list_filter = ["status"]
    search_fields = ["id", "webhook__id", "event__id"]
    raw_id_fields = ["webhook", "event"]
    readonly_fields = ["id", "created_at", "updated_at", "claimed_until"]
    inlines = [AttemptInline]
