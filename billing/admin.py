"""Django admin for prices (a change keeps the old price for usage already run), billing accounts,
the ledger (read only) and meter events (where an operator resolves the unconfirmed ones)."""

from django.contrib import admin, messages

from billing.metering import meter_event_resolve
from billing.models import BillingAccount, MeterEvent, MeterEventState, Price, UsageInterval
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


@admin.register(MeterEvent)
class MeterEventAdmin(admin.ModelAdmin):
    """Meter events by state; an ``unconfirmed`` one is resolved after checking Stripe's meter
    event summaries (docs/billing.md)."""

    list_display = ["identifier", "state", "value", "attempts", "requested_at", "sent_at"]
    list_filter = ["state"]
    list_select_related = ["interval"]
    readonly_fields = ["interval", "state", "value", "attempts", "created_at", "requested_at", "claimed_until", "sent_at"]
    actions = ["stripe_has_it", "stripe_does_not_have_it"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="identifier")
    def identifier(self, marker: MeterEvent) -> str:
        """The meter event's ``identifier`` at Stripe: the interval's public id."""
        return marker.interval.public_id

    def _resolve(self, request, queryset, *, stripe_has_it: bool) -> None:
        markers = list(queryset.filter(state=MeterEventState.UNCONFIRMED).select_related("interval"))
        for marker in markers:
            meter_event_resolve(interval_public_id=marker.interval.public_id, stripe_has_it=stripe_has_it)
        self.message_user(request, f"{len(markers)} unconfirmed meter event(s) resolved.", messages.SUCCESS)

    @admin.action(description="Stripe has it: mark sent")
    def stripe_has_it(self, request, queryset) -> None:
        self._resolve(request, queryset, stripe_has_it=True)

    @admin.action(description="Stripe does not have it: send again")
    def stripe_does_not_have_it(self, request, queryset) -> None:
        self._resolve(request, queryset, stripe_has_it=False)
