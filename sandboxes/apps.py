from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    """Sandboxes for untrusted code: the control plane and the local runtime."""

    name = "sandboxes"
    default_auto_field = "django.db.models.BigAutoField"
