from django.apps import AppConfig

from omnigent_site.runtime import on_serve, on_start, on_stop


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runners"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every server process sweeps stale runners, whether or not it holds a tunnel
        # (runners/upkeep.py). The server runtime starts the loop once the reactor
        # runs, however daphne was started. Imported here: upkeep needs the models.
        from . import liveness
        from .consumers import close_tunnels_for_restart
        from .upkeep import resend_unacked_starts_forever, sweep_stale_runners_forever
        from .verdicts import sweep_expired_approvals_forever

        # A runner is online only while a tunnel is connected (runners/liveness.py):
        # a process marks the tunnels of dead processes offline before it serves,
        # its own as it stops, and looks for dead ones every beat.
        on_start(liveness.start)
        on_stop(liveness.stop)
        # Runners move to another process at once (a rolling restart).
        on_stop(close_tunnels_for_restart)
        on_serve(liveness.beat_forever)
        on_serve(sweep_stale_runners_forever)
        # A turn.start lost while its tunnel stayed up is sent again (runners/upkeep.py).
        on_serve(resend_unacked_starts_forever)
        # Questions past their deadline are expired by the server (approvals.md).
        on_serve(sweep_expired_approvals_forever)
