"""Billing from the SDK: ``lab.usage(...)`` and ``lab.billing`` (docs/billing.md).

Money is ``Decimal`` USD (exact: the ledger keeps micro-dollars); seconds are floats.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from labsdk._http import HTTPClient
from labsdk.errors import APIError
from labsdk.types import LabObject

__all__ = ["Balance", "Billing", "UsageRow", "usage_list"]


class Balance(LabObject):
    """An organization's billing state (``GET /billing/balance``)."""

    plan: str | None = None  # "prepaid" or "invoiced"
    balance_usd: Decimal | None = None
    spend_limit_usd: Decimal | None = None
    spent_this_month_usd: Decimal | None = None
    payment_failed: bool | None = None
    billing_enabled: bool | None = None
    max_running_jobs: int | None = None


class UsageRow(LabObject):
    """Usage summed over one group (``GET /usage``), compute and served tokens: ``date``,
    ``resource`` (``tokens`` for served tokens, ``sandbox_cpu`` and ``sandbox_memory`` for
    sandboxes), ``job_id`` and ``deployment_id`` are set by the
    grouping asked for."""

    date: dt.date | None = None
    resource: str | None = None
    job_id: str | None = None
    deployment_id: str | None = None
    gpu_seconds: float | None = None
    cpu_seconds: float | None = None
    memory_gb_seconds: float | None = None
    requests: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: Decimal | None = None


def _parse(model, data: Any):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise APIError(f"Lab answered with an unexpected {model.__name__}: {exc}", body=data) from None


def _when(value: date | datetime | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return value.isoformat()


def usage_list(
    http: HTTPClient,
    *,
    start: date | datetime | str | None = None,
    end: date | datetime | str | None = None,
    group_by: str | Sequence[str] = "day",
    job_id: str | None = None,
    deployment_id: str | None = None,
) -> list[UsageRow]:
    """Return the project's usage from ``start`` to ``end`` (default: the last 30 days), grouped
    by ``day``, ``resource``, ``job`` and/or ``deployment``, only ``job_id``'s compute or only
    ``deployment_id``'s tokens when given. Raises ``InvalidRequestError`` for bad values and
    ``NotFoundError`` for a job or deployment without usage in this project."""
    groups = group_by if isinstance(group_by, str) else ",".join(group_by)
    params = {"start": _when(start), "end": _when(end), "group_by": groups, "job_id": job_id, "deployment_id": deployment_id}
    page = http.request("GET", "usage", params={key: value for key, value in params.items() if value is not None})
    if not isinstance(page, dict) or not isinstance(page.get("data"), list):
        raise APIError("Lab answered usage with something that is not a list", body=page)
    return [_parse(UsageRow, row) for row in page["data"]]


class Billing:
    """The organization's billing (``/billing/...``)."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def balance(self) -> Balance:
        """Return the plan, balance, monthly spend limit and this month's spend."""
        return _parse(Balance, self._http.request("GET", "billing/balance"))

    def update_settings(self, **settings: Any) -> Balance:
        """Change ``monthly_spend_limit_usd`` (a decimal string, or None), ``max_running_jobs``
        or ``plan``; owners' and admins' write keys only (else ``PermissionDeniedError``)."""
        body = {key: (str(value) if isinstance(value, Decimal) else value) for key, value in settings.items()}
        return _parse(Balance, self._http.request("PATCH", "billing/settings", json_body=body))

    def checkout(self, amount_usd: Decimal | str) -> str:
        """Return the URL of a Stripe Checkout page buying ``amount_usd`` of credit."""
        answer = self._http.request("POST", "billing/checkout", json_body={"amount_usd": str(amount_usd)})
        return str(answer["url"])

    def portal(self) -> str:
        """Return the URL of the Stripe customer portal (invoices, payment methods)."""
        return str(self._http.request("POST", "billing/portal")["url"])
