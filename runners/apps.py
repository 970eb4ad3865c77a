from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"
    verbose_name = "Runners"
    default_auto_field = "django.db.models.BigAutoField"
