"""OpenAPI components of the billing bodies (docs/billing.md), as ``billing/api/views.py`` builds them."""

from __future__ import annotations

from billing.models import Plan
from lab.api.schema import BOOLEAN, INTEGER, MONEY, NUMBER, STRING, component, list_component, nullable, obj

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
            "job_id": STRING,
            "gpu_seconds": NUMBER,
            "cpu_seconds": NUMBER,
            "cost_usd": MONEY,
        },
        description="Usage summed over one group; date, resource and job_id appear per grouping.",
        optional=("date", "resource", "job_id"),
    ),
)
USAGE_LIST = list_component("UsageRow", "Usage rows, ordered by their keys.")
SETTINGS_BODY = component(
    "BillingSettingsUpdate",
    {
        "type": "object",
        "properties": {
            "monthly_spend_limit_usd": nullable(MONEY),
            "max_running_jobs": nullable({"type": "integer", "minimum": 1}),
            "plan": {"type": "string", "enum": list(Plan.values)},
        },
        "additionalProperties": False,
    },
)
CHECKOUT_BODY = component(
    "CheckoutCreate",
    obj({"amount_usd": MONEY}, description="Credit to buy, in USD (at least 5.00, at most 10000.00)."),
)
URL = component("RedirectUrl", obj({"url": {"type": "string", "format": "uri"}}))
