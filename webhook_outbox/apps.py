from django.apps import AppConfig


class WebhookOutboxConfig(AppConfig):
    """The outbox of webhook events, written with the facts they report."""

    name = "webhook_outbox"
    verbose_name = "Webhook outbox"
    default_auto_field = "django.db.models.BigAutoField"
