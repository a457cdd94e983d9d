"""Billing's rows: prices and their history, billing accounts, credit grants and the usage ledger.

The ledger (``UsageInterval``) is append-only: one row per closed interval of one job attempt,
priced once from the price in force when it closed. It refers to jobs by public id and to
attempts by row id (``billing`` never imports ``jobs``), so a deleted job leaves its usage in the
ledger. Money is stored exactly, in micro-dollars (1 USD = 1,000,000); it is rounded to the
cent only for display and invoices.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from lab.ids import public_id
from lab.tenancy import TenantManager

#: Micro-dollars per dollar: every amount of money billing stores is an integer of these.
MICRO_USD = 1_000_000


class Price(models.Model):
    """The hourly list price of one resource type, as it is now.

    For a GPU type the unit is one GPU for one hour (a job pays ``gpus × hours × usd_per_hour``);
    for ``cpu`` it is one CPU-only job for one hour; for ``sandbox_cpu`` one core of a sandbox and
    for ``sandbox_memory`` one GB of a sandbox's memory, for one hour. Change it with ``billing.pricing.price_set``
    (the admin does), which also appends a ``PriceChange``: intervals are priced from that history.
    """

    resource_type = models.CharField(max_length=32, unique=True)
    usd_per_hour = models.DecimalField(max_digits=10, decimal_places=4)
    description = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["resource_type"]

    def __str__(self) -> str:
        return f"{self.resource_type}: ${self.usd_per_hour}/h"


class PriceChange(models.Model):
    """One price of one resource type from ``effective_from`` on, until the next change.

    An interval is priced from the newest change in force at its end; a resource with no
    change recorded is priced from its ``Price`` row.
    """

    resource_type = models.CharField(max_length=32)
    usd_per_hour = models.DecimalField(max_digits=10, decimal_places=4)
    effective_from = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["resource_type", "-effective_from"], name="price_change_latest")]


class Plan(models.TextChoices):
    """How an organization pays: credits bought in advance, or a monthly invoice."""

    PREPAID = "prepaid"
    INVOICED = "invoiced"


class BillingAccount(models.Model):
    """One organization's billing state: plan, prepaid balance, spend limit, Stripe ids.

    Created on first use with ``LAB_TRIAL_CREDIT_USD`` (``billing.accounts.account_for``). The
    balance only changes under this row's lock, by ``F()`` updates.
    """

    organization = models.OneToOneField("lab.Organization", on_delete=models.CASCADE, related_name="billing_account")
    plan = models.CharField(max_length=10, choices=Plan.choices, default=Plan.PREPAID)
    balance_micro_usd = models.BigIntegerField(default=0)
    monthly_spend_limit_micro_usd = models.BigIntegerField(null=True, blank=True)
    payment_failed = models.BooleanField(default=False)
    stripe_customer_id = models.CharField(max_length=64, blank=True)
    stripe_subscription_id = models.CharField(max_length=64, blank=True)
    subscription_status = models.CharField(max_length=32, blank=True)
    # When the subscription state and the payment state were last set from Stripe: an event
    # created before is older news and is not applied (Stripe does not deliver in order).
    subscription_updated_at = models.DateTimeField(null=True, blank=True)
    payment_status_updated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"billing account of organization {self.organization_id}"


class CreditKind(models.TextChoices):
    """Where credit came from."""

    TRIAL = "trial"
    PURCHASE = "purchase"
    ADJUSTMENT = "adjustment"


class CreditGrant(models.Model):
    """Credit added to a prepaid balance: the trial credit, a Checkout purchase, an adjustment.

    ``reference`` (a Stripe Checkout session id, or ``trial``) is unique per account, so the same
    purchase never adds credit twice.
    """

    account = models.ForeignKey(BillingAccount, on_delete=models.CASCADE, related_name="credit_grants")
    kind = models.CharField(max_length=12, choices=CreditKind.choices)
    amount_micro_usd = models.BigIntegerField()
    reference = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "reference"], name="credit_grant_once")]


def _usage_interval_public_id() -> str:
    return public_id("usage")


class Meter(models.TextChoices):
    """What an interval of the ledger measures, each its own series of intervals per metered thing:
    ``attempt``, a job attempt's GPUs (or CPU slot); ``sandbox_cpu`` and ``sandbox_memory``, a
    sandbox's cores and memory (GB); ``server``, a dedicated inference server's GPUs."""

    ATTEMPT = "attempt"
    SANDBOX_CPU = "sandbox_cpu"
    SANDBOX_MEMORY = "sandbox_memory"
    SERVER = "server"


class UsageInterval(models.Model):
    """One closed interval of one metered thing's resources, priced once (the append-only ledger).

    ``meter`` says what is metered (``Meter``) and ``attempt_id`` the row id of the thing metered:
    a job attempt's, a sandbox's (``sandbox_*``) or an inference server's (``server``).
    ``index`` counts its intervals from 0; (``meter``, ``attempt_id``, ``index``) is unique, so a
    reconciler running twice or two workers at once record an interval once. ``gpu_seconds`` is
    wall seconds × GPUs of a GPU job or a dedicated server, ``cpu_seconds`` wall seconds × slots of
    a CPU job or × cores of a sandbox, ``memory_gb_seconds`` wall seconds × GB of a sandbox, all
    from the times the launcher or runtime measured. ``job_public_id`` names the job billed (a
    sandbox made by a job attempt is billed to its job; empty for others), ``sandbox_public_id``
    and ``deployment_public_id`` the sandbox or deployment metered (empty for others). ``cost_micro_usd`` is the price in force at ``ended_at`` times
    those seconds (rounded so that an attempt's intervals sum to its exact cost); ``charged_micro_usd`` is what was drawn from the prepaid balance for it (less
    than the cost only when the balance hit its grace floor; 0 when billing is off or the plan is
    invoiced). ``public_id`` is the stable id sent to Stripe as a meter event ``identifier``.
    """

    tenant_path = "project"
    objects = TenantManager()

    public_id = models.CharField(max_length=40, unique=True, default=_usage_interval_public_id)
    organization = models.ForeignKey("lab.Organization", on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("lab.Project", on_delete=models.CASCADE, related_name="+")
    meter = models.CharField(max_length=16, choices=Meter.choices, default=Meter.ATTEMPT)
    job_public_id = models.CharField(max_length=40, blank=True)
    sandbox_public_id = models.CharField(max_length=40, blank=True)
    deployment_public_id = models.CharField(max_length=40, blank=True)
    attempt_id = models.BigIntegerField()
    attempt_number = models.PositiveIntegerField()
    index = models.PositiveIntegerField()
    resource_type = models.CharField(max_length=32)
    units = models.DecimalField(max_digits=10, decimal_places=4)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    gpu_seconds = models.DecimalField(max_digits=18, decimal_places=6, default=0)
    cpu_seconds = models.DecimalField(max_digits=18, decimal_places=6, default=0)
    memory_gb_seconds = models.DecimalField(max_digits=18, decimal_places=6, default=0)
    usd_per_hour = models.DecimalField(max_digits=10, decimal_places=4)
    cost_micro_usd = models.BigIntegerField()
    # The attempt's exact cost through this interval (micro-dollars, unrounded): each interval's
    # cost is the rounded running total less the previous one's, so an attempt's intervals add up
    # to its exact cost rounded once, however many intervals it has.
    running_cost_micro_usd = models.DecimalField(max_digits=32, decimal_places=12, default=0)
    charged_micro_usd = models.BigIntegerField(default=0)
    plan = models.CharField(max_length=10, choices=Plan.choices)
    billing_enabled = models.BooleanField(default=False)
    closed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["meter", "attempt_id", "index"], name="usage_interval_once_per_meter")]
        indexes = [
            models.Index(fields=["organization", "ended_at"], name="usage_org_time"),
            models.Index(fields=["job_public_id", "attempt_id"], name="usage_job"),
            models.Index(fields=["deployment_public_id"], name="usage_deployment"),
        ]

    def __str__(self) -> str:
        if self.meter != Meter.ATTEMPT:
            return f"{self.meter} {self.sandbox_public_id or self.deployment_public_id} interval {self.index}"
        return f"{self.job_public_id} attempt {self.attempt_number} interval {self.index}"


class StripeEvent(models.Model):
    """A Stripe webhook event Lab processed; the unique ``event_id`` makes each one apply once.

    ``created`` is Stripe's time of the event (what out-of-order events are ordered by);
    ``outcome`` is ``applied`` or ``ignored`` (an allow-listed type that changed nothing).
    """

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    created = models.DateTimeField()
    outcome = models.CharField(max_length=16)
    received_at = models.DateTimeField(default=timezone.now)


class MeterEventState(models.TextChoices):
    """Where an interval's Stripe meter event is (``billing.metering``)."""

    SENDING = "sending"  # owed: being sent, or to be sent again under the same identifier
    SENT = "sent"  # Stripe accepted it: never sent again
    # Requested more than the resend window ago without Stripe's answer reaching Lab: Stripe may
    # or may not have it, and would no longer dedupe a resend. Never sent again automatically; an
    # operator checks Stripe and resolves it (``billing.metering.meter_event_resolve``).
    UNCONFIRMED = "unconfirmed"


class MeterEvent(models.Model):
    """The marker that one invoiced interval's usage goes to Stripe as a meter event.

    One row per interval (unique). A sender claims it (``claimed_until``, a lease) and records
    ``requested_at`` before its first request, and marks it ``sent`` after Stripe's answer: a sent
    interval is never sent again; one left ``sending`` by a crash is resent with the same
    ``identifier`` (the interval's public id), which Stripe dedupes, only while ``requested_at``
    is within the resend window; later it becomes ``unconfirmed`` for an operator.
    """

    interval = models.OneToOneField(UsageInterval, on_delete=models.PROTECT, related_name="meter_event")
    state = models.CharField(max_length=12, choices=MeterEventState.choices, default=MeterEventState.SENDING)
    value = models.BigIntegerField()
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    # When the first request for it left (the start of Stripe's dedupe window); null until then.
    requested_at = models.DateTimeField(null=True, blank=True)
    # A sender holds it until then (no other sends it meanwhile); null or past: free to claim.
    claimed_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)


class TokenPrice(models.Model):
    """What a served model's tokens cost, in USD per million tokens, prompt and completion apart.

    ``model`` is a catalogue id, or ``*`` for every model without a row of its own
    (``billing.tokens.token_price``; ``billing.defaults.DEFAULT_TOKEN_PRICE`` when neither exists).
    A request is priced at the row as it is when the request ends; its usage row keeps that price.
    """

    model = models.CharField(max_length=200, unique=True)
    usd_per_million_prompt = models.DecimalField(max_digits=12, decimal_places=6)
    usd_per_million_completion = models.DecimalField(max_digits=12, decimal_places=6)
    description = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.model}: ${self.usd_per_million_prompt}/M prompt, ${self.usd_per_million_completion}/M completion"


def _token_usage_public_id() -> str:
    return public_id("tok")


class TokenUsage(models.Model):
    """The tokens of one inference request to a deployment, priced and charged once (the ledger
    of served tokens, beside ``UsageInterval``'s compute).

    ``request_id`` is the request's own id (``req_...``), unique: recording a request twice
    records and charges it once. ``model`` is the catalogue id it was priced as (the deployment's
    base model). ``cost_micro_usd`` is prompt tokens × the prompt price + completion tokens × the
    completion price (USD per million tokens × tokens = micro-dollars), rounded half up to the
    micro-dollar; ``charged_micro_usd`` what was drawn from a prepaid balance (as for intervals).
    It refers to its deployment by public id (``billing`` never imports ``serving``).
    ``duration_ms`` is how long Lab took to answer it, from its arrival to its last byte, and
    ``first_token_ms`` to its first sampled token for a stream (null where not measured).
    """

    tenant_path = "project"
    objects = TenantManager()

    public_id = models.CharField(max_length=40, unique=True, default=_token_usage_public_id)
    organization = models.ForeignKey("lab.Organization", on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("lab.Project", on_delete=models.CASCADE, related_name="+")
    request_id = models.CharField(max_length=64, unique=True)
    deployment_public_id = models.CharField(max_length=40)
    model = models.CharField(max_length=200)
    prompt_tokens = models.PositiveIntegerField()
    completion_tokens = models.PositiveIntegerField()
    usd_per_million_prompt = models.DecimalField(max_digits=12, decimal_places=6)
    usd_per_million_completion = models.DecimalField(max_digits=12, decimal_places=6)
    cost_micro_usd = models.BigIntegerField()
    charged_micro_usd = models.BigIntegerField(default=0)
    plan = models.CharField(max_length=10, choices=Plan.choices)
    billing_enabled = models.BooleanField(default=False)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    first_token_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["organization", "created_at"], name="token_usage_org_time"),
            models.Index(fields=["deployment_public_id"], name="token_usage_deployment"),
        ]

    def __str__(self) -> str:
        return f"{self.request_id}: {self.prompt_tokens}+{self.completion_tokens} tokens"
