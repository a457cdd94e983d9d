"""Django admin for prices (a change keeps the old price for usage already run) and billing accounts."""

from django.contrib import admin

from billing.models import BillingAccount, Price, UsageInterval
from billing.pricing import price_set


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ["resource_type", "usd_per_hour", "description", "updated_at"]
    fields = ["resource_type", "usd_per_hour", "description"]

    def save_model(self, request, obj, form, change) -> None:
        """Save through ``price_set`` so the price history keeps the old price."""
        saved = price_set(resource_type=obj.resource_type, usd_per_hour=obj.usd_per_hour, description=obj.description)
        obj.pk, obj.updated_at = saved.pk, saved.updated_at


@admin.register(BillingAccount)
class BillingAccountAdmin(admin.ModelAdmin):
    list_display = ["organization", "plan", "balance_micro_usd", "monthly_spend_limit_micro_usd", "payment_failed"]
    readonly_fields = ["balance_micro_usd"]


@admin.register(UsageInterval)
class UsageIntervalAdmin(admin.ModelAdmin):
    list_display = ["public_id", "job_public_id", "attempt_number", "index", "resource_type", "cost_micro_usd", "ended_at"]

    def get_queryset(self, request):
        return UsageInterval.objects.unscoped()

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # the ledger is append-only

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
