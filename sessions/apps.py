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
        # Registers the OpenAPI descriptions of the authentication classes.
        from omnigent_site import schema  # noqa: F401
