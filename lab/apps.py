from django.apps import AppConfig

from lab.lib.process import make_private


class LabConfig(AppConfig):
    """Accounts, tenancy, audit and API conventions."""

    name = "lab"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Make this process private (``lab.lib.process``: non-dumpable, umask 077) and register
        Lab's system checks. Every Lab process (web, worker, beat, commands) sets Django up first."""
        from lab import checks  # noqa: F401  (registers them on import)

        make_private()
