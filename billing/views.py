"""Stripe's webhook endpoint (outside /api/v1): a thin adapter over ``billing.webhooks``."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing.webhooks import WebhookRefused, stripe_webhook_receive


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    """``POST /billing/stripe/webhook``: 200 ``{"received": true, "outcome"}``, or 400 ``{"error"}``."""
    try:
        result = stripe_webhook_receive(payload=request.body, signature_header=request.headers.get("Stripe-Signature", ""))
    except WebhookRefused as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"received": True, "outcome": result.outcome})
