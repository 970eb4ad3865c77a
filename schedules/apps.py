from django.apps import AppConfig

from omnigent_site.runtime import on_serve


class SchedulesConfig(AppConfig):
    """Scheduled tasks that start agents (automation.md, Schedules)."""

    name = "schedules"
    verbose_name = "Schedules"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every server process looks for due occurrences; a claimed row decides which
        # process fires each one (schedules/upkeep.py). Imported here: it needs the models.
        from .upkeep import fire_due_forever

        on_serve(fire_due_forever)
