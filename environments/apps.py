from django.apps import AppConfig


class EnvironmentsConfig(AppConfig):
    """Organizations' environment packages (wheels)."""

    name = "environments"
    default_auto_field = "django.db.models.BigAutoField"
