from django.apps import AppConfig

from omnigent_site.runtime import on_serve


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runners"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every server process sweeps stale runners, whether or not it holds a tunnel
        # (runners/upkeep.py). The server runtime starts the loop once the reactor
        # runs, however daphne was started. Imported here: upkeep needs the models.
        from .upkeep import sweep_stale_runners_forever
        from .verdicts import sweep_expired_approvals_forever

        on_serve(sweep_stale_runners_forever)
        # Questions past their deadline are expired by the server (approvals.md).
        on_serve(sweep_expired_approvals_forever)
