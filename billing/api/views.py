"""Billing endpoints under /api/v1 (docs/billing.md): balance, usage, settings, Checkout, portal.

Billing is per organization; an API key acts for its project's organization. Usage read with a
key covers the key's project only (its job ids are the project's own).
"""

from __future__ import annotations

from datetime import date, datetime, time, timezone

from django.utils import timezone as django_timezone
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from billing.accounts import balance_of
from billing.api import openapi
from billing.checkout import checkout_create, portal_create
from billing.models import TokenUsage, UsageInterval
from billing.selectors import GROUP_KEYS, default_range, usage_rows
from billing.services import billing_settings_update
from lab.api.base import ProjectAPIView
from lab.api.errors import ApiError, FieldError
from lab.api.schema import ERROR, json_body
from lab.formats import money
from lab.paging import list_envelope
from lab.tenancy import MAX_PUBLIC_ID


def balance_to_dict(organization) -> dict:
    """Return the ``Balance`` body of ``organization``."""
    balance = balance_of(organization)
    return {
        "object": "balance",
        "plan": balance.plan,
        "balance_usd": money(balance.balance_usd),
        "spend_limit_usd": None if balance.spend_limit_usd is None else money(balance.spend_limit_usd),
        "spent_this_month_usd": money(balance.spent_this_month_usd),
        "payment_failed": balance.payment_failed,
        "billing_enabled": balance.billing_enabled,
        "max_running_jobs": organization.max_running_jobs,
    }


def _moment(params, name: str) -> datetime | None:
    """Return the query parameter ``name`` (``YYYY-MM-DD`` or ISO 8601 date-time) as UTC, or None."""
    raw = params.get(name)
    if raw in (None, ""):
        return None
    moment: datetime | None = None
    if len(raw) <= 40:
        try:
            parsed: datetime | date | None = parse_datetime(raw) or parse_date(raw)
            if parsed is not None and not isinstance(parsed, datetime):
                parsed = datetime.combine(parsed, time.min)
            if parsed is not None:
                moment = (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
        except (ValueError, OverflowError):  # not a date, or one UTC cannot hold (year 1 at +05:00)
            moment = None
    if moment is None:
        message = f"{name} must be a date (2026-11-01) or an ISO 8601 date-time."
        raise ApiError(400, "invalid_request", message, errors=[FieldError(name, "invalid", message)])
    return moment


def _group_by(params) -> tuple[str, ...]:
    raw = params.get("group_by") or "day"
    keys = tuple(raw.split(","))
    if not keys or any(key not in GROUP_KEYS for key in keys) or len(set(keys)) != len(keys):
        message = f"group_by must be one or more of {', '.join(GROUP_KEYS)}, separated by commas."
        raise ApiError(400, "invalid_request", message, errors=[FieldError("group_by", "invalid", message)])
    return keys


class BalanceView(ProjectAPIView):
    """``GET /billing/balance``."""

    @extend_schema(responses={200: openapi.BALANCE})
    def get(self, request: Request) -> Response:
        return Response(balance_to_dict(self.project.organization))


class UsageView(ProjectAPIView):
    """``GET /usage?start=&end=&group_by=day|resource|job|deployment&job_id=&deployment_id=``: the
    project's usage, compute and served tokens."""

    @extend_schema(
        parameters=openapi.USAGE_PARAMETERS,
        responses={200: openapi.USAGE_LIST, 404: ERROR},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        start, end = default_range(django_timezone.now())
        start, end = _moment(params, "start") or start, _moment(params, "end") or end
        if end <= start:
            message = "end must be after start."
            raise ApiError(400, "invalid_request", message, errors=[FieldError("end", "invalid", message)])
        job_id = params.get("job_id") or None
        if job_id is not None and not (
            len(job_id) <= MAX_PUBLIC_ID
            and UsageInterval.objects.for_project(self.project).filter(job_public_id=job_id).exists()
        ):
            raise ApiError(404, "not_found", "No usage of such a job.")
        deployment_id = params.get("deployment_id") or None
        if deployment_id is not None and not (
            len(deployment_id) <= MAX_PUBLIC_ID
            and (
                TokenUsage.objects.for_project(self.project).filter(deployment_public_id=deployment_id).exists()
                or UsageInterval.objects.for_project(self.project).filter(deployment_public_id=deployment_id).exists()
            )
        ):
            raise ApiError(404, "not_found", "No usage of such a deployment.")
        rows = usage_rows(
            organization_id=self.project.organization_id,
            project_id=self.project.pk,
            start=start,
            end=end,
            group_by=_group_by(params),
            job_public_id=job_id,
            deployment_public_id=deployment_id,
        )
        for row in rows:
            row["cost_usd"] = money(row["cost_usd"])
        return Response(list_envelope(rows, has_more=False))


class SettingsView(ProjectAPIView):
    """``PATCH /billing/settings``: spend limit, concurrency cap, plan (owners and admins: a write key
    acts for its creator, ``billing.services.require_billing_manager``)."""

    @extend_schema(request=json_body(openapi.SETTINGS_BODY), responses={200: openapi.BALANCE})
    def patch(self, request: Request) -> Response:
        billing_settings_update(actor=self.actor, organization=self.project.organization, data=request.data)
        return Response(balance_to_dict(self.project.organization))


class CheckoutView(ProjectAPIView):
    """``POST /billing/checkout {"amount_usd"}`` → ``{"url"}`` of a Stripe Checkout session."""

    @extend_schema(request=json_body(openapi.CHECKOUT_BODY), responses={200: openapi.URL})
    def post(self, request: Request) -> Response:
        return Response({"url": checkout_create(actor=self.actor, organization=self.project.organization, data=request.data)})


class PortalView(ProjectAPIView):
    """``POST /billing/portal`` → ``{"url"}`` of the Stripe customer portal."""

    @extend_schema(request=None, responses={200: openapi.URL})
    def post(self, request: Request) -> Response:
        return Response({"url": portal_create(actor=self.actor, organization=self.project.organization)})
