"""What compute costs: the ``Price`` table, its history, and exact money in micro-dollars.

A price change is appended to ``PriceChange`` (``price_set``), so usage is always priced at the
price in force when it was used (``price_at``), never at today's.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone as dt_timezone
from decimal import ROUND_HALF_UP, Decimal

from django.db import transaction
from django.utils import timezone

from billing.models import MICRO_USD, Price, PriceChange
from lab.lib.resources import resource_units

_CENT = Decimal("0.01")
_EPOCH = datetime(2000, 1, 1, tzinfo=dt_timezone.utc)


#: What one hour of a price buys, by resource type (``GET /prices``' ``unit``): a GPU otherwise.
PRICE_UNITS = {"cpu": "job_hour", "sandbox_cpu": "core_hour", "sandbox_memory": "gb_hour"}


def price_unit(resource_type: str) -> str:
    """Return what one hour of ``resource_type``'s price buys: ``job_hour`` (a CPU-only job),
    ``core_hour`` (a sandbox's core), ``gb_hour`` (a GB of a sandbox's memory) or ``gpu_hour``."""
    return PRICE_UNITS.get(resource_type, "gpu_hour")


def price_table() -> dict[str, Decimal]:
    """Return USD per hour by resource type, as the prices are now."""
    return {price.resource_type: price.usd_per_hour for price in Price.objects.all()}


class PriceHistory:
    """The prices of some resource types over time, read once; ``at`` answers without a query.

    Built by ``price_history``; the usage ledger prices a whole batch of intervals from one.
    """

    def __init__(self, changes: dict[str, list[tuple[datetime, Decimal]]], current: dict[str, Decimal]) -> None:
        self._changes = changes  # per resource type, newest first
        self._current = current

    def at(self, resource_type: str, moment: datetime) -> Decimal:
        """Return the USD per hour of ``resource_type`` in force at ``moment``: the newest change
        effective at ``moment``; without one, the ``Price`` row; 0 for a resource with no price."""
        for effective_from, usd_per_hour in self._changes.get(resource_type, ()):
            if effective_from <= moment:
                return usd_per_hour
        return self._current.get(resource_type, Decimal(0))


def price_history(resource_types: Iterable[str]) -> PriceHistory:
    """Return the whole price history of ``resource_types`` (two queries, whatever their number)."""
    resource_types = set(resource_types)
    changes: dict[str, list[tuple[datetime, Decimal]]] = {}
    for resource_type, effective_from, usd_per_hour in (
        PriceChange.objects.filter(resource_type__in=resource_types)
        .order_by("-effective_from", "-id")
        .values_list("resource_type", "effective_from", "usd_per_hour")
    ):
        changes.setdefault(resource_type, []).append((effective_from, usd_per_hour))
    current = dict(Price.objects.filter(resource_type__in=resource_types).values_list("resource_type", "usd_per_hour"))
    return PriceHistory(changes, current)


def price_at(resource_type: str, moment: datetime) -> Decimal:
    """Return the USD per hour of ``resource_type`` in force at ``moment`` (``PriceHistory.at``)."""
    return price_history([resource_type]).at(resource_type, moment)


@transaction.atomic
def price_set(*, resource_type: str, usd_per_hour: Decimal, description: str | None = None) -> Price:
    """Set the price of ``resource_type`` from now on, keeping the old one for usage before now.

    Creates the ``Price`` row when missing. The first change of a resource also records the
    price it had until now (effective since 2000-01-01), so intervals that ended earlier but are
    closed later still get the old price.
    """
    now = timezone.now()
    price = Price.objects.select_for_update().filter(resource_type=resource_type).first()
    if price is not None and not PriceChange.objects.filter(resource_type=resource_type).exists():
        PriceChange.objects.create(resource_type=resource_type, usd_per_hour=price.usd_per_hour, effective_from=_EPOCH)
    if price is None:
        price = Price(resource_type=resource_type)
    price.usd_per_hour = Decimal(usd_per_hour)
    if description is not None:
        price.description = description
    price.updated_at = now
    price.save()
    PriceChange.objects.create(resource_type=resource_type, usd_per_hour=price.usd_per_hour, effective_from=now)
    return price


def exact_cost_micro_usd(*, usd_per_hour: Decimal, units: int | Decimal, seconds: Decimal) -> Decimal:
    """Return the cost in micro-dollars, unrounded, of ``units`` for ``seconds`` at ``usd_per_hour``
    (``usd_per_hour × units × seconds / 3600``, 12 decimals)."""
    micro = Decimal(usd_per_hour) * units * Decimal(seconds) * MICRO_USD / 3600
    return micro.quantize(Decimal("1e-12"), rounding=ROUND_HALF_UP)


def round_micro(amount: Decimal) -> int:
    """Return micro-dollars rounded half-up to a whole micro-dollar."""
    return int(Decimal(amount).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def micro_to_usd(micro_usd: int) -> Decimal:
    """Return micro-dollars as an exact USD Decimal (``1_250_000`` → ``Decimal("1.25")``)."""
    return Decimal(int(micro_usd)) / MICRO_USD


def usd_to_micro(usd: Decimal) -> int:
    """Return USD as micro-dollars, rounded half-up."""
    return int((Decimal(usd) * MICRO_USD).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def cents(usd: Decimal) -> Decimal:
    """Return ``usd`` rounded half-up to the cent (for display and invoices only)."""
    return Decimal(usd).quantize(_CENT, rounding=ROUND_HALF_UP)


def cost_usd(*, gpu_type: str, gpus: int, seconds: float, prices: dict[str, Decimal] | None = None) -> Decimal:
    """Return the cost in USD of running ``gpus`` GPUs of ``gpu_type`` (or a CPU job) for ``seconds``
    at the current prices (estimates; usage is priced by the ledger).

    GPU jobs pay per GPU-hour, CPU jobs per job-hour. A resource without a price costs 0.
    Rounded half-up to the cent.
    """
    prices = price_table() if prices is None else prices
    hourly = prices.get(gpu_type, Decimal(0))
    units = Decimal(resource_units(gpu_type=gpu_type, gpus=gpus))
    return cents(hourly * units * Decimal(str(seconds)) / Decimal(3600))


def list_cost_micro_usd(*, gpu_type: str, gpus: int, seconds: float) -> int:
    """Return what ``seconds`` of a job holding ``gpus`` GPUs of ``gpu_type`` cost at today's list
    prices, in micro-dollars (for estimates; usage is priced by the ledger)."""
    return round_micro(
        exact_cost_micro_usd(
            usd_per_hour=price_table().get(gpu_type, Decimal(0)),
            units=resource_units(gpu_type=gpu_type, gpus=gpus),
            seconds=Decimal(str(seconds)),
        )
    )
