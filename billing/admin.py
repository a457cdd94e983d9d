"""Django admin for prices."""

from django.contrib import admin

from billing.models import Price


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ["resource_type", "usd_per_hour", "description", "updated_at"]
