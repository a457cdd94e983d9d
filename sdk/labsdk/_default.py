"""The shared client of the module-level API (``lab.jobs``, ``lab.webhooks.create``, ...)."""

from __future__ import annotations

from labsdk.client import Lab

_client: Lab | None = None


def default_client() -> Lab:
    """Return the module's shared client, building it from the environment on first use
    (``LAB_API_KEY``, ``LAB_BASE_URL``)."""
    global _client
    if _client is None:
        _client = Lab()
    return _client
