"""Lab's default list prices (USD per hour), seeded by migration 0002 and editable in the admin.

| resource | USD/hour | unit |
|---|---|---|
| cpu  | 0.10 | one CPU-only job (local launcher) |
| A100 | 1.60 | one A100 80 GB GPU |
| H100 | 2.50 | one H100 80 GB GPU |
| H200 | 3.50 | one H200 141 GB GPU |
| B200 | 5.50 | one B200 GPU |
| sandbox_cpu | 0.05 | one CPU core of a sandbox |
| sandbox_memory | 0.005 | one GB of a sandbox's memory |

They sit near the on-demand rates of GPU clouds at the end of 2026 and are a starting point for
an operator, not a quote.
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

DEFAULT_PRICES: dict[str, tuple[Decimal, str]] = {
    "cpu": (Decimal("0.10"), "One CPU-only job on the local launcher"),
    "A100": (Decimal("1.60"), "One NVIDIA A100 80 GB GPU"),
    "H100": (Decimal("2.50"), "One NVIDIA H100 80 GB GPU"),
    "H200": (Decimal("3.50"), "One NVIDIA H200 141 GB GPU"),
    "B200": (Decimal("5.50"), "One NVIDIA B200 GPU"),
    "sandbox_cpu": (Decimal("0.05"), "One CPU core of a sandbox"),
    "sandbox_memory": (Decimal("0.005"), "One GB of a sandbox's memory"),
}


def seed_default_prices(price_model) -> None:
    """Create the default price rows that are missing (existing rows are never changed)."""
    for resource_type, (usd_per_hour, description) in DEFAULT_PRICES.items():
        price_model.objects.get_or_create(
            resource_type=resource_type, defaults={"usd_per_hour": usd_per_hour, "description": description}
        )


def seed_price_history(price_model, price_change_model) -> None:
    """Give every price without a history its current value as its first entry, in force since
    2000-01-01, so intervals are priced from the history alone."""
    since = datetime(2000, 1, 1, tzinfo=timezone.utc)
    known = set(price_change_model.objects.values_list("resource_type", flat=True))
    price_change_model.objects.bulk_create(
        [
            price_change_model(resource_type=price.resource_type, usd_per_hour=price.usd_per_hour, effective_from=since)
            for price in price_model.objects.all()
            if price.resource_type not in known
        ]
    )


#: What a served model's tokens cost where no ``TokenPrice`` row (its own, or ``*``) says:
#: USD per million prompt tokens, per million completion tokens.
DEFAULT_TOKEN_PRICE: tuple[Decimal, Decimal] = (Decimal("0.10"), Decimal("0.30"))
