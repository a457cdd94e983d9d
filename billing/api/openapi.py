"""OpenAPI components of the billing bodies (docs/billing.md), as ``billing/api/views.py`` builds them."""

from __future__ import annotations

from itertools import permutations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter

from billing.models import Plan
from billing.selectors import GROUP_KEYS
from lab.api.schema import BOOLEAN, INTEGER, MONEY, NUMBER, STRING, component, list_component, nullable, obj

# The bounds below are the ones ``billing.services`` and ``billing.checkout`` check, as patterns:
# a decimal string of USD with at most two decimals, within the accepted range.
#: 5.00 to 10000.00 (``billing.checkout.MIN_PURCHASE_USD`` and ``MAX_PURCHASE_USD``).
PURCHASE_USD: dict = {
    "type": "string",
    "pattern": r"^(?:(?:[5-9]|[1-9][0-9]{1,3})(?:\.[0-9]{1,2})?|10000(?:\.00?)?)$",
    "description": "USD as a decimal string with at most two decimals, from 5.00 to 10000.00",
}
#: 0.00 to 10000000 (``billing.services.MAX_SPEND_LIMIT_USD``).
SPEND_LIMIT_USD: dict = {
    "type": "string",
    "pattern": r"^(?:(?:0|[1-9][0-9]{0,6})(?:\.[0-9]{1,2})?|10000000(?:\.00?)?)$",
    "description": "USD as a decimal string with at most two decimals, from 0.00 to 10000000",
}

BALANCE = component(
    "Balance",
    obj(
        {
            "object": {"const": "balance"},
            "plan": {"type": "string", "enum": list(Plan.values)},
            "balance_usd": MONEY,
            "spend_limit_usd": nullable(MONEY),
            "spent_this_month_usd": MONEY,
            "payment_failed": BOOLEAN,
            "billing_enabled": BOOLEAN,
            "max_running_jobs": nullable(INTEGER),
        },
        description="The organization's plan, prepaid balance, monthly spend limit and spend this month (UTC).",
    ),
)
component(
    "UsageRow",
    obj(
        {
            "date": {"type": "string", "format": "date"},
            "resource": STRING,
            "job_id": nullable(STRING),
            "deployment_id": nullable(STRING),
            "gpu_seconds": NUMBER,
            "cpu_seconds": NUMBER,
            "memory_gb_seconds": NUMBER,
            "requests": INTEGER,
            "prompt_tokens": INTEGER,
            "completion_tokens": INTEGER,
            "cost_usd": MONEY,
        },
        description="Usage summed over one group, compute and served tokens; date, resource, job_id and deployment_id "
        "appear per grouping (resource `tokens` and job_id null for served tokens; deployment_id null for compute other "
        "than a dedicated server's; sandboxes' resources `sandbox_cpu` and `sandbox_memory`).",
        optional=("date", "resource", "job_id", "deployment_id"),
    ),
)
USAGE_LIST = list_component("UsageRow", "Usage rows, ordered by their keys.")
SETTINGS_BODY = component(
    "BillingSettingsUpdate",
    {
        "type": "object",
        "properties": {
            "monthly_spend_limit_usd": nullable(SPEND_LIMIT_USD),
            # from 1 to this Lab's LAB_ORG_MAX_RUNNING_JOBS (billing.services._max_running_jobs)
            "max_running_jobs": nullable({"type": "integer", "minimum": 1, "maximum": settings.LAB_ORG_MAX_RUNNING_JOBS}),
            "plan": {"type": "string", "enum": list(Plan.values)},
        },
        "additionalProperties": False,
    },
)
CHECKOUT_BODY = component(
    "CheckoutCreate",
    obj({"amount_usd": PURCHASE_USD}, description="Credit to buy, in USD (at least 5.00, at most 10000.00).")
    | {"additionalProperties": False},
)
URL = component("RedirectUrl", obj({"url": {"type": "string", "format": "uri"}}))

#: A ``start`` or ``end`` of ``GET /usage`` (``billing.api.views._moment``): a date, or a date-time
#: to the second (microseconds at most) with ``Z`` or an offset, in years 1000 to 2999 so that UTC
#: holds it whatever the offset; the formats refuse days a month does not have (2026-02-30).
_MOMENT_PATTERN = (
    r"^[12][0-9]{3}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
    r"(?:T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]))?$"
)
_MOMENT = {"type": "string", "pattern": _MOMENT_PATTERN, "anyOf": [{"format": "date"}, {"format": "date-time"}]}
#: ``group_by`` of ``GET /usage``: one or more of GROUP_KEYS joined by commas, each at most once.
GROUP_BY_VALUES = [",".join(keys) for count in range(1, len(GROUP_KEYS) + 1) for keys in permutations(GROUP_KEYS, count)]
USAGE_PARAMETERS = [
    OpenApiParameter("start", _MOMENT, description="from this date or date-time (UTC; default 30 days ago)"),
    OpenApiParameter("end", _MOMENT, description="until this date or date-time, excluded, after start (default now)"),
    OpenApiParameter(
        "group_by", {"type": "string", "enum": GROUP_BY_VALUES}, description="day, resource, job, or several joined by commas"
    ),
    OpenApiParameter("job_id", str, description="only this job's usage (its compute)"),
    OpenApiParameter("deployment_id", str, description="only this deployment's usage (its served tokens)"),
]
