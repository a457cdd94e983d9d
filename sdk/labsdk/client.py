"""The API client, :class:`Lab`."""

from __future__ import annotations

import os
from typing import Self

import httpx

from labsdk._adapters import Adapters
from labsdk._billing import Billing, UsageRow, usage_list
from labsdk._catalog import Environments, Models, Prices
from labsdk._checkpoints import Checkpoints
from labsdk._datasets import Datasets
from labsdk._deployments import Deployments
from labsdk._evals import Evals
from labsdk._http import HTTPClient
from labsdk._jobs import STREAM_RECONNECT_S, Jobs
from labsdk._sandboxes import Sandboxes
from labsdk._webhooks import Webhooks
from labsdk.types import WhoAmI

#: Where the SDK looks for Lab when neither ``base_url`` nor ``LAB_BASE_URL`` says.
DEFAULT_BASE_URL = "http://127.0.0.1:8000"
API_PREFIX = "/api/v1"


def api_url(base_url: str) -> str:
    """Return the API prefix for a Lab address: ``http://host:8000`` and
    ``http://host:8000/api/v1`` both give ``http://host:8000/api/v1``."""
    base_url = base_url.rstrip("/")
    return base_url if base_url.endswith(API_PREFIX) else base_url + API_PREFIX


class Lab:
    """A client for one Lab project, identified by its API key.

    ``api_key`` defaults to ``LAB_API_KEY``, ``base_url`` to ``LAB_BASE_URL`` then
    ``http://127.0.0.1:8000``. ``timeout`` is seconds per HTTP attempt, ``max_retries`` the
    retries after a connection error, 429 or 5xx; ``stream_reconnect_s`` how long
    ``jobs.stream`` keeps reconnecting a broken live stream (seconds, default 60). Resources:
    :attr:`jobs`, :attr:`models`, :attr:`environments`, :attr:`datasets`, :attr:`prices`, :attr:`checkpoints`,
    :attr:`adapters`, :attr:`billing`, :attr:`webhooks`, :attr:`sandboxes`, :attr:`deployments`, :attr:`evals`; and :meth:`whoami`, :meth:`usage`. Usable as a context
    manager.
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        *,
        stream_reconnect_s: float = STREAM_RECONNECT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        self.api_key = api_key or os.environ.get("LAB_API_KEY") or None
        self.base_url = (base_url or os.environ.get("LAB_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self._http = HTTPClient(
            base_url=api_url(self.base_url),
            token=self.api_key,
            timeout=timeout,
            max_retries=max_retries,
            transport=transport,
        )
        self.jobs = Jobs(self._http, stream_reconnect_s=stream_reconnect_s)
        self.models = Models(self._http)
        self.environments = Environments(self._http)
        self.datasets = Datasets(self._http)
        self.prices = Prices(self._http)
        self.checkpoints = Checkpoints(self._http)
        self.adapters = Adapters(self._http)
        self.billing = Billing(self._http)
        self.webhooks = Webhooks(self._http)
        self.sandboxes = Sandboxes(self._http)
        self.deployments = Deployments(self._http)
        self.evals = Evals(self._http)

    def whoami(self) -> WhoAmI:
        """Return the organization, project and scopes of this client's API key."""
        return WhoAmI.model_validate(self._http.request("GET", "whoami"))

    def usage(self, start=None, end=None, group_by="day", job_id: str | None = None, deployment_id: str | None = None) -> list[UsageRow]:
        """Return this project's usage (GPU/CPU-seconds, served tokens and cost) from ``start`` to
        ``end`` (dates, date-times or ISO strings; default the last 30 days), grouped by ``"day"``,
        ``"resource"``, ``"job"``, ``"deployment"`` or a list of them (``labsdk._billing.usage_list``)."""
        return usage_list(self._http, start=start, end=end, group_by=group_by, job_id=job_id, deployment_id=deployment_id)

    def close(self) -> None:
        """Close the client's connections (to Lab and to sandbox agents)."""
        self._http.close()
        self.sandboxes.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Lab(base_url={self.base_url!r})"
