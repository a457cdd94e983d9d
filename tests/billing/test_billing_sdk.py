"""labsdk's ``lab.usage(...)``, ``lab.billing.balance()`` and the ``lab usage`` / ``lab billing
balance`` commands, against Lab's real views (httpx's WSGI transport into the Django app)."""

from __future__ import annotations

import functools
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from labsdk import cli
from labsdk.client import Lab
from labsdk.errors import NotFoundError

from tests.support.billing import record

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "default_prices")]


def test_the_sdk_reads_usage_and_the_balance(owner, wsgi_transport, billing_on):
    now = timezone.now()
    # The hour of usage (closed on the ledger's minutes) ends now, or before midnight when the last
    # hour and a few minutes span it: one row, of one day.
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    ended = now if now - timedelta(minutes=65) >= midnight else midnight - timedelta(minutes=5)
    record(owner, job_id="job_sdk", seconds=3600, ended=ended)
    lab = Lab(api_key=owner.key, base_url="http://127.0.0.1", transport=wsgi_transport)

    balance = lab.billing.balance()
    this_month = Decimal("0.1") if ended.month == now.month else Decimal("0")  # the first hour of a month: last month's
    assert (balance.plan, balance.balance_usd, balance.spent_this_month_usd) == ("prepaid", Decimal("9.9"), this_month)
    [row] = lab.usage(group_by=["day", "job"], start=timezone.now() - timedelta(days=1))
    assert (row.job_id, row.cpu_seconds, row.cost_usd, row.date) == ("job_sdk", 3600.0, Decimal("0.10"), (ended - timedelta(seconds=1)).date())
    with pytest.raises(NotFoundError):
        lab.usage(job_id="job_nobody")
    assert lab.billing.update_settings(monthly_spend_limit_usd=Decimal("12.50")).spend_limit_usd == Decimal("12.50")


def test_the_cli_prints_usage_and_the_balance(owner, wsgi_transport, monkeypatch, capsys):
    record(owner, job_id="job_cli", seconds=1800)
    monkeypatch.setattr(cli, "Lab", functools.partial(Lab, api_key=owner.key, base_url="http://127.0.0.1", transport=wsgi_transport))

    assert cli.main(["usage", "--group-by", "job", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"date": None, "resource": None, "job_id": "job_cli", "deployment_id": None, "gpu_seconds": 0.0, "cpu_seconds": 1800.0, "memory_gb_seconds": 0.0,
         "requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": "0.05"}
    ]
    assert cli.main(["usage", "--group-by", "resource"]) == 0
    table = capsys.readouterr().out
    assert "RESOURCE" in table and "cpu" in table and "1800.0" in table and "0.05" in table
    assert cli.main(["billing", "balance"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "plan:             prepaid (billing off: nothing is charged)",
        "balance:          $10.00",
        "spent this month: $0.05 (limit none)",
    ]
    assert cli.main(["usage", "--group-by", "week"]) == 1
    assert "group_by must be" in capsys.readouterr().err
