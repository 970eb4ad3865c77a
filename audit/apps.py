from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit log (lifecycle.md, Audit log): append-only records of security acts."""

    name = "audit"
    verbose_name = "Audit log"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Sign-ins and API tokens are Django's and DRF's own acts: recorded from their
        # signals (audit/signals.py), in the transaction that writes them.
        from . import signals

        signals.connect()
