"""Webhook endpoints and the outbox (Standard Webhooks, docs/webhooks.md).

These models belong to the ``jobs`` app (``jobs/models.py`` imports this module), so their
migrations live in ``jobs/migrations``. One ``WebhookMessage`` per event (its ``public_id`` is
the body's ``id``, the JobEvent's ``evt_...`` for job events), one ``WebhookDelivery`` per
(message, endpoint) with its own ``msg_...`` id sent as ``webhook-id`` on every try, and one
``WebhookAttempt`` per HTTP request.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from lab.ids import public_id
from lab.tenancy import TenantManager


def _endpoint_public_id() -> str:
    return public_id("whep")


def _message_public_id() -> str:
    return public_id("evt")


def _delivery_public_id() -> str:
    return public_id("msg")


class WebhookEndpoint(models.Model):
    """A URL of a project that receives the event types it subscribed to.

    ``secret`` is ``whsec_<base64>``: a symmetric key Lab signs with, so it is stored as is (shown
    to the user only on create and rotate, never logged). After a rotation the previous secret
    also signs until ``previous_secret_expires_at`` so receivers can switch without loss.
    ``failing_since`` is the first failed attempt of the current run of failures (None after a
    success); an endpoint failing for 5 days is disabled.
    """

    tenant_path = "project"
    objects = TenantManager()

    public_id = models.CharField(max_length=40, unique=True, default=_endpoint_public_id)
    project = models.ForeignKey("lab.Project", on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.CharField(max_length=2048)
    events = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    secret = models.CharField(max_length=100)
    previous_secret = models.CharField(max_length=100, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    failing_since = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["project", "-id"], name="webhook_endpoint_project")]

    def __str__(self) -> str:
        return self.public_id

    def __repr__(self) -> str:
        return f"<WebhookEndpoint {self.public_id}>"


class WebhookMessage(models.Model):
    """One event as sent: ``body`` is the exact JSON text signed and posted on every try."""

    public_id = models.CharField(max_length=40, unique=True, default=_message_public_id)
    project = models.ForeignKey("lab.Project", on_delete=models.CASCADE, related_name="+")
    # SET_NULL: deleting a job must not drop the webhooks already promised about it.
    job_event = models.OneToOneField(
        "jobs.JobEvent", null=True, blank=True, on_delete=models.SET_NULL, related_name="webhook_message"
    )
    type = models.CharField(max_length=40)
    body = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["created_at"], name="webhook_message_created")]


class DeliveryStatus(models.TextChoices):
    """Where a delivery stands: still trying, delivered (2xx), or given up."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class WebhookDelivery(models.Model):
    """The outbox row: one message to one endpoint, tried until a 2xx or the schedule ends.

    ``next_attempt_at`` is when the next try is due; while a worker holds the delivery it is
    pushed forward by a lease, so a worker that dies mid-delivery leads to a retry once the
    lease runs out. ``attempt_count`` counts claims (tries started).
    """

    public_id = models.CharField(max_length=40, unique=True, default=_delivery_public_id)
    message = models.ForeignKey(WebhookMessage, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempt_count = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["message", "endpoint"], name="webhook_delivery_once_per_endpoint")
        ]
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="webhook_delivery_due"),
            models.Index(fields=["endpoint", "-id"], name="webhook_delivery_endpoint"),
        ]

    def __str__(self) -> str:
        return self.public_id


class WebhookAttempt(models.Model):
    """One HTTP try of a delivery, kept for the dashboard: request headers, status, answer."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    response_excerpt = models.TextField(blank=True)
    request_headers = models.JSONField(default=dict)
    succeeded = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["delivery", "number"], name="webhook_attempt_order")]
