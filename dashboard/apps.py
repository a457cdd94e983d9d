from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The server-rendered dashboard over the services of the other apps."""

    name = "dashboard"
