from django.apps import AppConfig


class LabConfig(AppConfig):
    """Accounts, tenancy, API conventions and the dashboard."""

    name = "lab"
    default_auto_field = "django.db.models.BigAutoField"
