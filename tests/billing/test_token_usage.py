"""Served tokens on the ledger (billing/tokens.py): priced per model, recorded and charged once per
request, drawn from prepaid credit down to the floor, and counted toward the monthly spend limit."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.accounts import account_for, run_blocker, spent_this_month_micro_usd
from billing.models import BillingAccount, TokenPrice, TokenUsage
from billing.tokens import token_price, token_totals_by_deployment, token_usage_record

pytestmark = pytest.mark.django_db

MODEL = "lab/tiny-random-llama"


def record(tenant, request_id="req_1", prompt=1000, completion=500, deployment="dep_a"):
    return token_usage_record(
        organization_id=tenant.organization.pk, project_id=tenant.project.pk, request_id=request_id,
        deployment_public_id=deployment, model=MODEL, prompt_tokens=prompt, completion_tokens=completion,
    )


def test_a_model_is_priced_by_its_own_row_else_the_any_model_row_else_the_default():
    assert token_price(MODEL) == (Decimal("0.10"), Decimal("0.30"))
    TokenPrice.objects.create(model="*", usd_per_million_prompt=Decimal("1"), usd_per_million_completion=Decimal("2"))
    assert token_price(MODEL) == (Decimal("1"), Decimal("2"))
    TokenPrice.objects.create(model=MODEL, usd_per_million_prompt=Decimal("3.5"), usd_per_million_completion=Decimal("7"))
    assert token_price(MODEL) == (Decimal("3.5"), Decimal("7"))


def test_it_records_a_request_once_at_its_price(owner):
    TokenPrice.objects.create(model=MODEL, usd_per_million_prompt=Decimal("2"), usd_per_million_completion=Decimal("6"))
    first = record(owner)
    assert (first.prompt_tokens, first.completion_tokens, first.cost_micro_usd) == (1000, 500, 2000 + 3000)
    assert (first.usd_per_million_prompt, first.usd_per_million_completion) == (Decimal("2"), Decimal("6"))
    again = record(owner, prompt=9999, completion=9999)
    assert again.pk == first.pk and again.cost_micro_usd == 5000
    assert TokenUsage.objects.for_project(owner.project).count() == 1


def test_billing_off_records_but_charges_nothing(owner):
    balance = account_for(owner.organization.pk).balance_micro_usd
    usage = record(owner)
    assert (usage.charged_micro_usd, usage.billing_enabled) == (0, False)
    assert BillingAccount.objects.get(organization=owner.organization).balance_micro_usd == balance


def test_billing_on_draws_prepaid_credit_once_and_never_below_the_floor(owner, billing_on):
    TokenPrice.objects.create(model=MODEL, usd_per_million_prompt=Decimal("1000"), usd_per_million_completion=Decimal("1000"))
    BillingAccount.objects.filter(pk=account_for(owner.organization.pk).pk).update(balance_micro_usd=2_000_000)
    first = record(owner, "req_1", prompt=1000, completion=0)  # $1.00
    record(owner, "req_1", prompt=1000, completion=0)
    assert (first.cost_micro_usd, first.charged_micro_usd) == (1_000_000, 1_000_000)
    assert BillingAccount.objects.get(organization=owner.organization).balance_micro_usd == 1_000_000
    second = record(owner, "req_2", prompt=1500, completion=0)  # $1.50, only $1.00 left
    assert (second.cost_micro_usd, second.charged_micro_usd) == (1_500_000, 1_000_000)
    account = BillingAccount.objects.get(organization=owner.organization)
    assert account.balance_micro_usd == 0
    assert run_blocker(account) == "insufficient_credit"


def test_tokens_count_toward_the_monthly_spend_limit(owner, billing_on):
    TokenPrice.objects.create(model=MODEL, usd_per_million_prompt=Decimal("1000"), usd_per_million_completion=Decimal("0"))
    account = account_for(owner.organization.pk)
    BillingAccount.objects.filter(pk=account.pk).update(monthly_spend_limit_micro_usd=1_000_000)
    record(owner, "req_1", prompt=400, completion=0)
    assert spent_this_month_micro_usd(owner.organization.pk) == 400_000
    assert run_blocker(BillingAccount.objects.get(pk=account.pk)) is None
    record(owner, "req_2", prompt=600, completion=0)
    assert run_blocker(BillingAccount.objects.get(pk=account.pk)) == "spend_limit_reached"


def test_totals_are_summed_per_deployment(owner, outsider):
    record(owner, "req_1", prompt=10, completion=5, deployment="dep_a")
    record(owner, "req_2", prompt=20, completion=1, deployment="dep_a")
    record(outsider, "req_3", prompt=7, completion=7, deployment="dep_b")
    totals = token_totals_by_deployment(["dep_a", "dep_b", "dep_c"])
    assert (totals["dep_a"].requests, totals["dep_a"].prompt_tokens, totals["dep_a"].completion_tokens) == (2, 30, 6)
    assert totals["dep_b"].requests == 1 and "dep_c" not in totals


def test_negative_counts_are_refused(owner):
    with pytest.raises(ValueError):
        record(owner, prompt=-1)
    assert not TokenUsage.objects.for_project(owner.project).exists()
