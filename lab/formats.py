"""Formats shared by every response body and webhook payload (docs/api.md "Conventions")."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal


def iso(moment: datetime | None) -> str | None:
    """Return ``moment`` as an ISO 8601 UTC string with a ``Z`` (``2026-11-29T22:16:31Z``), or None."""
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def money(amount: Decimal) -> str:
    """Return USD ``amount`` as a decimal string with at least two decimals (``"1.25"``, ``"0.1234"``)."""
    amount = Decimal(amount)
    cents = amount.quantize(Decimal("0.01"))
    return str(cents) if cents == amount else str(amount.normalize())
