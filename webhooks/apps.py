from django.apps import AppConfig

from omnigent_site import metrics
from omnigent_site.runtime import on_serve


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every server process delivers (a claim decides which one sends each attempt),
        # woken by the outbox after each commit that wrote an event, or by its poll; or
        # with OMNIGENT_WEBHOOK_DELIVERY=worker it wakes the worker processes.
        from webhook_outbox.events import on_enqueued

        from . import delivery
        from .metrics import WebhookBacklog

        on_enqueued(delivery.wake)
        on_serve(delivery.deliver_forever)
        metrics.on_scrape(WebhookBacklog())
