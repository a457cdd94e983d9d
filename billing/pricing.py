"""What a job costs at the list prices of the ``Price`` table."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from billing.models import Price
from lab.lib.resources import resource_units

_CENT = Decimal("0.01")


def price_table() -> dict[str, Decimal]:
    """Return USD per hour by resource type."""
    return {price.resource_type: price.usd_per_hour for price in Price.objects.all()}


def cost_usd(*, gpu_type: str, gpus: int, seconds: float, prices: dict[str, Decimal] | None = None) -> Decimal:
    """Return the cost in USD of running ``gpus`` GPUs of ``gpu_type`` (or a CPU job) for ``seconds``.

    GPU jobs pay per GPU-hour, CPU jobs per job-hour. A resource without a price costs 0.
    Rounded half-up to the cent.
    """
    prices = price_table() if prices is None else prices
    hourly = prices.get(gpu_type, Decimal(0))
    units = Decimal(resource_units(gpu_type=gpu_type, gpus=gpus))
    return (hourly * units * Decimal(str(seconds)) / Decimal(3600)).quantize(_CENT, rounding=ROUND_HALF_UP)
