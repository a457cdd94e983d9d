"""The organization's billing page: plan, balance, this month's spend against the limit, usage by
day and GPU type (a uPlot chart), jobs by cost, "buy credits", the portal link, and the spend-limit
and concurrency-cap settings.

Every member sees the balance and usage; only owners and admins buy credits, open the portal or
change settings (403 before a form is read, and ``billing.services`` refuses anyone else too).
Thin adapters over ``billing``'s services and selectors.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, time, timedelta, timezone
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone as django_timezone
from django.views.decorators.http import require_GET, require_POST

from billing.accounts import balance_of
from billing.checkout import checkout_create, portal_create
from billing.selectors import usage_rows
from billing.services import billing_settings_update
from dashboard.access import OrganizationAccess, organization_view
from dashboard.views import _actor, _render
from lab.api.errors import http_status
from lab.errors import LabError
from lab.formats import money

#: Days of usage the page charts and totals.
USAGE_DAYS = 30
#: Jobs listed by cost.
TOP_JOBS = 20


def _chart(rows: list[dict[str, Any]], start: datetime, days: int) -> dict[str, Any]:
    """Return the chart's data: one x per day (Unix seconds, UTC midnight), one cost series (USD)
    per resource type, 0 on days without usage."""
    dates = [(start + timedelta(days=offset)).date() for offset in range(days + 1)]
    costs: dict[str, dict[str, float]] = defaultdict(dict)
    for row in rows:
        costs[row["resource"]][row["date"]] = float(row["cost_usd"])
    return {
        "x": [int(datetime.combine(day, time.min, tzinfo=timezone.utc).timestamp()) for day in dates],
        "series": [
            {"resource": resource, "cost_usd": [by_day.get(day.isoformat(), 0.0) for day in dates]}
            for resource, by_day in sorted(costs.items())
        ],
    }


def _page(request: HttpRequest, access: OrganizationAccess, *, status: int = 200, form_errors: dict | None = None):
    organization = access.organization
    now = django_timezone.now()
    start = (now - timedelta(days=USAGE_DAYS)).replace(hour=0, minute=0, second=0, microsecond=0)
    by_day = usage_rows(organization_id=organization.pk, project_id=None, start=start, end=now, group_by=("day", "resource"))
    by_job = usage_rows(organization_id=organization.pk, project_id=None, start=start, end=now, group_by=("job",))
    jobs = sorted((row for row in by_job if row["job_id"]), key=lambda row: row["cost_usd"], reverse=True)[:TOP_JOBS]
    balance = balance_of(organization)
    context = {
        "organization": organization,
        "balance": balance,
        "balance_usd": money(balance.balance_usd),
        "spent_usd": money(balance.spent_this_month_usd),
        "limit_usd": None if balance.spend_limit_usd is None else money(balance.spend_limit_usd),
        "jobs": [{**row, "cost_usd": money(row["cost_usd"])} for row in jobs],
        "total_usd": money(sum((row["cost_usd"] for row in by_job), start=0)),
        "usage_days": USAGE_DAYS,
        "chart": _chart(by_day, start, (now - start).days),
        "form_errors": form_errors or {},
        "posted": request.POST if request.method == "POST" else {},
    }
    return _render(request, "dashboard/billing.html", context, access=access, status=status)


@require_GET
@organization_view
def billing(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """The billing page (every member)."""
    return _page(request, access)


def _refused(request, access, error: LabError, field: str) -> HttpResponse:
    messages.error(request, error.message)
    return _page(request, access, status=http_status(error) if http_status(error) < 500 else 400, form_errors={field: error.message})


@require_POST
@organization_view
def billing_checkout(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """POST ``amount_usd``: redirect to a Stripe Checkout page buying that credit (owners, admins)."""
    access.require_manager()
    try:
        url = checkout_create(actor=_actor(request), organization=access.organization,
                              data={"amount_usd": request.POST.get("amount_usd", "").strip()})
    except LabError as error:
        return _refused(request, access, error, "amount_usd")
    return redirect(url)


@require_POST
@organization_view
def billing_portal(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """POST: redirect to the Stripe customer portal (owners, admins)."""
    access.require_manager()
    try:
        url = portal_create(actor=_actor(request), organization=access.organization)
    except LabError as error:
        return _refused(request, access, error, "portal")
    return redirect(url)


def _optional_int(text: str) -> int | str | None:
    text = text.strip()
    if not text:
        return None
    return int(text) if text.isdigit() and len(text) < 10 else text


@require_POST
@organization_view
def billing_settings(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """POST ``monthly_spend_limit_usd`` and ``max_running_jobs`` (empty = none): owners, admins."""
    access.require_manager()
    data = {
        "monthly_spend_limit_usd": request.POST.get("monthly_spend_limit_usd", "").strip() or None,
        "max_running_jobs": _optional_int(request.POST.get("max_running_jobs", "")),
    }
    try:
        billing_settings_update(actor=_actor(request), organization=access.organization, data=data)
    except LabError as error:
        return _refused(request, access, error, (error.param or "settings"))
    messages.success(request, "Billing settings saved.")
    return redirect("billing", access.organization.slug)
