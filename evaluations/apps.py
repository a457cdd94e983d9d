from django.apps import AppConfig


class EvaluationsConfig(AppConfig):
    """Evaluations of models and checkpoints on environments, run as evaluation jobs."""

    name = "evaluations"
    default_auto_field = "django.db.models.BigAutoField"
