from django.apps import AppConfig


class ServingConfig(AppConfig):
    """Deployments of checkpoints, adapters and models, their inference servers and the
    OpenAI-compatible API in front of them."""

    name = "serving"
    default_auto_field = "django.db.models.BigAutoField"
