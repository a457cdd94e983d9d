"""The event types webhooks carry (docs/webhooks.md).

Endpoints subscribe to ``WEBHOOK_EVENT_TYPES``; the outbox sends only those (plus
``TEST_EVENT_TYPE``, sent to one endpoint when its test button is pressed).
"""

from __future__ import annotations

#: The event types an endpoint may subscribe to, in the order the API lists them.
WEBHOOK_EVENT_TYPES = (
    "job.queued",
    "job.started",
    "job.requeued",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.data_incomplete",
    "checkpoint.ready",
    "adapter.ready",
    "deployment.ready",
    "deployment.failed",
    "evaluation.completed",
    "evaluation.failed",
    "webhook_endpoint.disabled",
)
#: The event ``POST /webhook-endpoints/{id}/test`` sends; never subscribed to.
TEST_EVENT_TYPE = "webhook.test"
