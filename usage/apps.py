from django.apps import AppConfig


class UsageConfig(AppConfig):
    """What each LLM call used and cost (docs/usage.md): prices, calls, totals."""

    name = "usage"
    verbose_name = "Usage and cost"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A fresh database gets the price table from the YAML file at migrate time
        # (only the models it does not list yet: the admin's edits stay).
        from django.db.models.signals import post_migrate

        from . import services

        post_migrate.connect(services.load_missing_prices_after_migrate, sender=self)
