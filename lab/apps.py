from django.apps import AppConfig


class LabConfig(AppConfig):
    """Accounts, tenancy, audit and API conventions."""

    name = "lab"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register Lab's system checks."""
        from lab import checks  # noqa: F401  (registers them on import)
