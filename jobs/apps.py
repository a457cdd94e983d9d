from django.apps import AppConfig


class JobsConfig(AppConfig):
    """RL training jobs and everything they produce."""

    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from prometheus_client import REGISTRY

        from jobs.metrics import JobsCollector

        REGISTRY.register(JobsCollector())
