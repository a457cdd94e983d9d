from django.apps import AppConfig
from django.db.models.signals import post_migrate

from jobs.registry import sync_models_after_migrate


class JobsConfig(AppConfig):
    """RL training jobs and everything they produce."""

    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from prometheus_client import REGISTRY

        from jobs.metrics import JobsCollector

        REGISTRY.register(JobsCollector())
        # after every migrate and every test flush: the registry holds the catalogue's models
        post_migrate.connect(sync_models_after_migrate, sender=self, dispatch_uid="jobs.registry")
