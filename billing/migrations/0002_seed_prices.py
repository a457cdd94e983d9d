"""Seed the price table with Lab's default list prices (USD per hour).

Defaults, editable in the admin afterwards (existing rows are never overwritten):

| resource | USD/hour | unit |
|---|---|---|
| cpu  | 0.10 | one CPU-only job (local launcher) |
| A100 | 1.60 | one A100 80 GB GPU |
| H100 | 2.50 | one H100 80 GB GPU |
| H200 | 3.50 | one H200 141 GB GPU |
| B200 | 5.50 | one B200 GPU |

They sit near the on-demand rates of GPU clouds at the end of 2026 and are a starting point for
an operator, not a quote.
"""

from decimal import Decimal

from django.db import migrations

DEFAULT_PRICES = {
    "cpu": (Decimal("0.10"), "One CPU-only job on the local launcher"),
    "A100": (Decimal("1.60"), "One NVIDIA A100 80 GB GPU"),
    "H100": (Decimal("2.50"), "One NVIDIA H100 80 GB GPU"),
    "H200": (Decimal("3.50"), "One NVIDIA H200 141 GB GPU"),
    "B200": (Decimal("5.50"), "One NVIDIA B200 GPU"),
}


def seed(apps, schema_editor):
    Price = apps.get_model("billing", "Price")
    for resource_type, (usd_per_hour, description) in DEFAULT_PRICES.items():
        Price.objects.get_or_create(
            resource_type=resource_type, defaults={"usd_per_hour": usd_per_hour, "description": description}
        )


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
