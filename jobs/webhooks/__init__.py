"""Webhooks (Standard Webhooks, docs/webhooks.md): endpoints, the outbox and its delivery.

- ``models``: WebhookEndpoint, WebhookMessage (one per event), WebhookDelivery (one per
  message and endpoint: the outbox row), WebhookAttempt (one per HTTP try).
- ``events``: the event types; ``schemas``: endpoint bodies (pydantic).
- ``endpoints``: create/update/rotate/delete endpoints, the test event and redeliver, each for
  owners, admins and write keys only (``require_endpoint_manager``).
- ``outbox``: the subscribed endpoints of an event, and messages and delivery rows of the
  finished payloads ``jobs.events`` hands it, queued on commit; the retry schedule.
- ``delivery``: claim, sign, send and record tries; disable endpoints that keep failing.
- ``sweep``: the periodic queueing of due retries and purge of old deliveries.
- ``tasks``: Celery adapters (registered in the worker by ``lab.celery``, sent by name);
  ``views``/``urls``: the REST endpoints.
"""
