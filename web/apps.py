from django.apps import AppConfig


class WebConfig(AppConfig):
    """The web page (shared/spec/web.md): templates and static modules over the public API.

    The top layer: it may import every other app, and none imports it.
    """

    name = "web"
    label = "web"
    verbose_name = "Web page"
