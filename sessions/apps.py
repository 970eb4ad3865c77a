from django.apps import AppConfig


class AgentSessionsConfig(AppConfig):
    """Agents, sessions, items, turns and grants.

    The label is not ``sessions``: ``django.contrib.sessions`` owns that label.
    """

    name = "sessions"
    label = "agent_sessions"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.models.signals import post_migrate

        from . import search_index

        # A migration that rebuilds a table on SQLite drops its triggers: put them back.
        post_migrate.connect(search_index.ensure_installed, sender=self)

        # Registers the OpenAPI descriptions of the authentication classes.
        from omnigent_site import (
            metrics,
            schema,  # noqa: F401
        )
        from omnigent_site.runtime import limit_request_body

        from .metrics import QueuedTurns

        metrics.on_scrape(QueuedTurns())

        # An upload of a session file is cut off at the socket once it passes the cap
        # plus room for the multipart framing (files.md §1: never buffered whole).
        limit_request_body(
            r"^/v1/sessions/[^/]+/resources/files/?$",
            lambda: settings.OMNIGENT_MAX_UPLOAD_BYTES + settings.OMNIGENT_UPLOAD_OVERHEAD_BYTES,
        )
