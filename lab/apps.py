from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate

from lab.celery import declare_queues
from lab.lib.process import make_private


def declare_embedded_broker_queues(**kwargs) -> None:
    """``post_migrate`` receiver: on the embedded broker (``sqla+``: kombu's SQLAlchemy transport),
    declare every queue once (``lab.celery.declare_queues``), before any process starts."""
    if settings.CELERY_BROKER_URL.startswith("sqla+"):
        declare_queues()


class LabConfig(AppConfig):
    """Accounts, tenancy, audit and API conventions."""

    name = "lab"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Make this process private (``lab.lib.process``: non-dumpable, umask 077) and register
        Lab's system checks and what ``migrate`` does after migrating. Every Lab process (web,
        worker, beat, commands) sets Django up first."""
        from lab import checks  # noqa: F401  (registers them on import)

        make_private()
        post_migrate.connect(declare_embedded_broker_queues, sender=self, dispatch_uid="lab.broker_queues")
