"""Served tokens: what a model's tokens cost, and each inference request's tokens on the ledger,
priced and charged exactly once (docs/billing.md "Served tokens").

A request is recorded once, when it ends, under its own id (``TokenUsage.request_id`` is
unique): recording it again returns the first row and charges nothing. For a prepaid
organization with billing on, the cost is drawn from the balance under the account's row lock,
down to the grace floor at most (``billing.accounts.charge``), as compute intervals are; the
month's token costs count toward the spend limit with them (``spent_this_month_by_organization``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from billing.accounts import account_for, billing_enabled, charge, locked_account
from billing.defaults import DEFAULT_TOKEN_PRICE
from billing.models import TokenPrice, TokenUsage
from billing.pricing import round_micro

#: The ``TokenPrice`` row that prices every model without one of its own.
ANY_MODEL = "*"


def token_price(model: str) -> tuple[Decimal, Decimal]:
    """Return (USD per million prompt tokens, USD per million completion tokens) of ``model``:
    its own ``TokenPrice`` row, else the ``*`` row, else ``DEFAULT_TOKEN_PRICE``."""
    rows = {row.model: row for row in TokenPrice.objects.filter(model__in=(model, ANY_MODEL))}
    row = rows.get(model) or rows.get(ANY_MODEL)
    return (row.usd_per_million_prompt, row.usd_per_million_completion) if row else DEFAULT_TOKEN_PRICE


def token_cost_micro_usd(*, prompt_tokens: int, completion_tokens: int, prices: tuple[Decimal, Decimal]) -> int:
    """Return the cost of the tokens in micro-dollars, rounded half up (a price in USD per million
    tokens times a number of tokens is micro-dollars)."""
    prompt_price, completion_price = prices
    return round_micro(prompt_price * prompt_tokens + completion_price * completion_tokens)


def token_usage_record(
    *, organization_id: int, project_id: int, request_id: str, deployment_public_id: str, model: str,
    prompt_tokens: int, completion_tokens: int, now: datetime | None = None,
    duration_ms: int | None = None, first_token_ms: int | None = None,
) -> TokenUsage:
    """Record one request's tokens at ``model``'s price, charge a prepaid balance (billing on),
    and return the row; once per ``request_id``: a second call returns the first row unchanged.

    ``prompt_tokens`` and ``completion_tokens`` are counts (0 or more). The account row is locked
    while the row is written and the balance drawn, so concurrent requests of one organization are
    charged one after another and never below the grace floor together. Raises ValueError for a
    negative count. ``duration_ms`` and ``first_token_ms`` are the request's latency as Lab
    measured it (milliseconds; None where not measured).
    """
    if prompt_tokens < 0 or completion_tokens < 0:
        raise ValueError("token counts are 0 or more")
    prices = token_price(model)
    cost = token_cost_micro_usd(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, prices=prices)
    enabled = billing_enabled()
    account_for(organization_id)  # created outside the transaction, which then only locks it
    try:
        with transaction.atomic():
            account = locked_account(organization_id)
            existing = TokenUsage.objects.unscoped().filter(request_id=request_id).first()
            if existing is not None:
                return existing
            [charged] = charge([(account, cost)])
            return TokenUsage.objects.create(
                organization_id=organization_id, project_id=project_id, request_id=request_id,
                deployment_public_id=deployment_public_id, model=model, prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens, usd_per_million_prompt=prices[0], usd_per_million_completion=prices[1],
                cost_micro_usd=cost, charged_micro_usd=charged, plan=account.plan, billing_enabled=enabled,
                duration_ms=duration_ms, first_token_ms=first_token_ms, created_at=now or timezone.now(),
            )
    except IntegrityError:  # recorded meanwhile by a transaction that did not wait for the lock's holder
        return TokenUsage.objects.unscoped().get(request_id=request_id)


@dataclass(frozen=True)
class TokenTotals:
    """A deployment's served tokens summed from the ledger: requests, tokens, cost (micro-dollars)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micro_usd: int = 0


def token_totals_by_deployment(deployment_public_ids: Iterable[str]) -> dict[str, TokenTotals]:
    """Return the ledger's sums for each of ``deployment_public_ids`` that has requests (one query)."""
    rows = (
        TokenUsage.objects.unscoped()
        .filter(deployment_public_id__in=set(deployment_public_ids))
        .values("deployment_public_id")
        .annotate(requests=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"), cost=Sum("cost_micro_usd"))
        .values_list("deployment_public_id", "requests", "prompt", "completion", "cost")
    )
    return {
        deployment: TokenTotals(requests=requests, prompt_tokens=int(prompt or 0), completion_tokens=int(completion or 0), cost_micro_usd=int(cost or 0))
        for deployment, requests, prompt, completion, cost in rows
    }

