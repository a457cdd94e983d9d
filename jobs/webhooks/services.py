"""The webhook services' former module: the names callers import from it, now defined by role in
``jobs.webhooks.endpoints``, ``outbox``, ``delivery`` and ``sweep``. Import from those; this module
goes once nothing imports it."""

from jobs.webhooks.delivery import DeliveryResult, claim_deliveries, deliver, endpoint_disable, lease, signature_headers
from jobs.webhooks.endpoints import (
    delivery_redeliver,
    endpoint_create,
    endpoint_delete,
    endpoint_rotate_secret,
    endpoint_send_test,
    endpoint_update,
    new_secret,
)
from jobs.webhooks.events import WEBHOOK_EVENT_TYPES
from jobs.webhooks.outbox import enqueue_event, retry_delay
from jobs.webhooks.sweep import purge_finished, sweep
from lab.api.errors import ApiError

__all__ = [
    "WEBHOOK_EVENT_TYPES",
    "ApiError",
    "DeliveryResult",
    "claim_deliveries",
    "deliver",
    "delivery_redeliver",
    "endpoint_create",
    "endpoint_delete",
    "endpoint_disable",
    "endpoint_rotate_secret",
    "endpoint_send_test",
    "endpoint_update",
    "enqueue_event",
    "lease",
    "new_secret",
    "purge_finished",
    "retry_delay",
    "signature_headers",
    "sweep",
]
