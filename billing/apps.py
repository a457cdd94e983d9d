from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Prices, usage and Stripe billing."""

    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"
