"""``lab.deployments``: serve a checkpoint, an adapter or a catalogue model behind Lab's
OpenAI-compatible API (docs/serving.md).

    import labsdk as lab
    import openai

    deployment = lab.deployments.create("adp_...")          # or "ckpt_...", or a model id
    lab.deployments.wait(deployment.id)                     # until it is ready
    client = openai.OpenAI(base_url=deployment.openai_base_url, api_key=os.environ["LAB_API_KEY"])
    client.chat.completions.create(model=deployment.name, messages=[...])

Creating and deleting need an API key with the ``write`` scope; calling a deployment, a key with
``inference`` (or ``write``).
"""

from __future__ import annotations

import time
from datetime import datetime

from labsdk._common import paginate, parse, segment
from labsdk._http import HTTPClient
from labsdk.errors import LabError
from labsdk.types import LabObject

__all__ = ["Deployment", "DeploymentFailedError", "DeploymentWaitTimeoutError", "Deployments", "source_type"]


class DeploymentSource(LabObject):
    """What a deployment serves: ``type`` ``checkpoint``, ``adapter`` or ``model``, and its ``id``."""

    type: str
    id: str


class DeploymentUsage(LabObject):
    """A deployment's requests and tokens so far, its dedicated server's GPU-seconds (CPU-seconds
    on a CPU pool), and their cost in USD (a decimal string)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    cost_usd: str = "0.00"


class Deployment(LabObject):
    """A deployment: ``name`` is the ``model`` OpenAI clients send; ``status`` is ``pending``,
    ``deploying``, ``ready``, ``unloading``, ``stopped`` or ``failed`` (``status_reason`` says
    why); ``mode`` how it is served (``adapter`` on its base model's shared server, ``base``,
    ``dedicated``); ``server_status`` whether its server runs now (``stopped`` once scaled to
    zero: the next request starts it); ``openai_base_url`` the ``base_url`` to give OpenAI's clients."""

    id: str
    name: str
    status: str
    status_reason: str | None = None
    source: DeploymentSource
    base_model: str
    mode: str
    server_status: str | None = None
    openai_base_url: str
    usage: DeploymentUsage = DeploymentUsage()
    created_at: datetime | None = None
    ready_at: datetime | None = None
    stopped_at: datetime | None = None


class DeploymentFailedError(LabError):
    """A waited-for deployment ended ``failed`` (or ``stopped``); ``deployment`` is its final state."""

    def __init__(self, deployment: Deployment):
        super().__init__(f"deployment {deployment.id} is {deployment.status}: {deployment.status_reason or 'no reason given'}")
        self.deployment = deployment


class DeploymentWaitTimeoutError(LabError):
    """A wait ran out of time; ``deployment`` is the last state seen, not ready yet."""

    def __init__(self, deployment: Deployment, timeout: float):
        super().__init__(f"deployment {deployment.id} is still {deployment.status} after waiting {timeout:g} s")
        self.deployment, self.timeout = deployment, timeout


def source_type(source_id: str) -> str:
    """Return the type of a source id: ``checkpoint`` for ``ckpt_...``, ``adapter`` for
    ``adp_...``, else ``model`` (a catalogue id such as ``HuggingFaceTB/SmolLM2-135M-Instruct``)."""
    if source_id.startswith("ckpt_"):
        return "checkpoint"
    if source_id.startswith("adp_"):
        return "adapter"
    return "model"


class Deployments:
    """``/deployments``: create, list, retrieve and delete deployments, and wait for one. Errors
    are Lab's: 400 ``invalid_request`` naming the field (an id this project does not have, a
    name taken), 409 for a checkpoint or adapter that is not ready, 402 when billing allows
    nothing to run, 429 past the organization's cap, 404 for a deployment outside the project."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def create(self, source: str, *, name: str | None = None, type: str | None = None) -> Deployment:
        """Deploy ``source`` (a checkpoint id, an adapter id or a model id; ``type`` is guessed
        from the id's prefix unless given) and return the deployment, ``pending``. ``name``
        defaults to the model id, or ``<base model>:<id>`` for a checkpoint or an adapter."""
        body: dict = {"source": {"type": type or source_type(source), "id": source}}
        if name is not None:
            body["name"] = name
        return parse(Deployment, self._http.request("POST", "deployments", json_body=body))

    def list(self, *, status: str | None = None, limit: int = 100) -> list[Deployment]:
        """Return the project's deployments, newest first (those in ``status`` when given)."""
        params = {"limit": limit} | ({"status": status} if status else {})
        return [*paginate(self._http, "deployments", Deployment, params)]

    def get(self, deployment_id: str) -> Deployment:
        """Return one deployment."""
        return parse(Deployment, self._http.request("GET", f"deployments/{segment(deployment_id)}"))

    def delete(self, deployment_id: str) -> Deployment:
        """Delete a deployment and return it: ``unloading`` until its server lets it go, then ``stopped``."""
        return parse(Deployment, self._http.request("DELETE", f"deployments/{segment(deployment_id)}"))

    def wait(self, deployment_id: str, *, timeout: float | None = 600.0, poll_interval: float = 1.0) -> Deployment:
        """Poll a deployment until it is ``ready`` and return it. ``timeout`` and ``poll_interval``
        are seconds (``None``: no limit). Raises ``DeploymentFailedError`` when it ends
        ``failed`` or ``stopped`` instead, ``DeploymentWaitTimeoutError`` when time runs out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            deployment = self.get(deployment_id)
            if deployment.status == "ready":
                return deployment
            if deployment.status in ("failed", "stopped", "unloading"):
                raise DeploymentFailedError(deployment)
            if deadline is not None and time.monotonic() >= deadline:
                raise DeploymentWaitTimeoutError(deployment, timeout)
            time.sleep(poll_interval)
