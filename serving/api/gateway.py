"""What the OpenAI-compatible API does before and after it relays a request to an inference
server, in plain synchronous code (the async views run it in worker threads): who calls, which
deployment the ``model`` names, whether billing lets it run, waking its server, and recording the
tokens it used.

Refusals are ``InferenceError``s with OpenAI's error body (``{"error": {"message", "type",
"param", "code"}}``) and Lab's codes and statuses (docs/api.md "Conventions"): 401
``invalid_api_key``; 403 ``insufficient_scope`` (a key without ``inference`` or ``write``);
404 ``model_not_found`` for a name the key's project does not have deployed, another
organization's deployment answering exactly as a missing one; 402 ``insufficient_credit``,
``spend_limit_reached``, ``payment_failed``; 429 ``rate_limited`` past
``LAB_INFERENCE_RATE_LIMIT_PER_MINUTE`` per key; 503 ``model_not_ready`` while it deploys, or
when its server does not start in time.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings
from django.db import connections
from django.http import JsonResponse

from billing.accounts import BLOCKER_MESSAGES, organization_run_blocker
from billing.tokens import token_price, token_usage_record
from lab.api.auth import INVALID_API_KEY, api_key_from_authorization
from lab.api.throttling import over_limit
from lab.lib.error_types import error_type
from lab.models import ApiKey, ApiKeyScope
from serving.models import DeploymentStatus, ServerStatus
from serving.selectors import callable_deployment, ready_deployments
from serving.servers import server_touch, server_wake, upstream_model

#: Seconds a client is told to wait before asking again (``Retry-After``) while a model deploys.
RETRY_AFTER_S = 5


class InferenceError(Exception):
    """A refusal of the OpenAI-compatible API: HTTP ``status``, Lab's ``code``, the ``param``."""

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None, retry_after_s: int | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param, self.retry_after_s = status, code, message, param, retry_after_s

    def body(self) -> dict:
        """OpenAI's error body."""
        return {"error": {"message": self.message, "type": error_type(self.status), "param": self.param, "code": self.code}}

    def response(self) -> JsonResponse:
        """The error as an HTTP answer (with ``Retry-After`` when it names a wait)."""
        response = JsonResponse(self.body(), status=self.status)
        if self.retry_after_s is not None:
            response["Retry-After"] = str(self.retry_after_s)
        return response


def model_not_found(name: str) -> InferenceError:
    """The one answer for a name the caller cannot call, whoever else may have it deployed."""
    return InferenceError(404, "model_not_found", f"The model `{name}` does not exist or you do not have access to it.", param="model")


@dataclass(frozen=True)
class Target:
    """Where one request goes: the deployment (its public id, the name the client gave, the
    name it has on its server, its base model and project) and its server as last read."""

    deployment_id: str
    model: str
    upstream_model: str
    base_model: str
    organization_id: int
    project_id: int
    server_id: int
    server_status: str
    url: str
    token: str


#: Threads that run the API's database work: at most this many per web process, each with its own
#: database connection.
DATABASE_THREADS = 8
_executor = ThreadPoolExecutor(max_workers=DATABASE_THREADS, thread_name_prefix="openai-db")


def in_thread(function):
    """Return an async function that runs ``function`` in one of the ``DATABASE_THREADS``. Its
    connection follows ``DB_CONN_MAX_AGE`` as a request thread's does: closed after each call at 0
    (the default), else kept open between requests up to that age and closed once it has failed;
    opening one costs more than a request's queries, so a server that relays many requests sets it."""

    def call(*args):
        for connection in connections.all(initialized_only=True):
            connection.close_if_unusable_or_obsolete()
        try:
            return function(*args)
        finally:
            if not settings.DATABASES["default"].get("CONN_MAX_AGE"):
                connections.close_all()

    @functools.wraps(function)
    async def run(*args):
        return await asyncio.get_running_loop().run_in_executor(_executor, call, *args)

    return run


def caller(authorization: str | None) -> ApiKey:
    """Return the API key of an ``Authorization: Bearer lab_...`` header that may call models,
    counting the request against its rate limit; raise 401, 403 or 429."""
    api_key = api_key_from_authorization(authorization or "")
    if api_key is None:
        raise InferenceError(401, "invalid_api_key", INVALID_API_KEY)
    if ApiKeyScope.INFERENCE not in api_key.scopes and ApiKeyScope.WRITE not in api_key.scopes:
        raise InferenceError(403, "insufficient_scope", "This API key lacks the 'inference' scope.")
    limited, wait = over_limit(f"inference:{api_key.public_id}", settings.LAB_INFERENCE_RATE_LIMIT_PER_MINUTE)
    if limited:
        raise InferenceError(429, "rate_limited", "Too many requests for this API key; slow down.", retry_after_s=max(1, int(wait) + 1))
    return api_key


@in_thread
def prepare(authorization: str | None, model: str) -> Target:
    """Authenticate, rate-limit, find the deployment ``model`` names and check that billing lets
    its organization run; mark the request on its server. Raises ``InferenceError``."""
    return target_for(caller(authorization).project, model)


@in_thread
def member_prepare(user_id: int, project, model: str) -> Target:
    """``prepare`` for a signed-in member of ``project`` (the dashboard's playground, which has
    checked the membership): rate-limited per user as a key is, then as ``target_for``."""
    limited, wait = over_limit(f"inference:user:{user_id}", settings.LAB_INFERENCE_RATE_LIMIT_PER_MINUTE)
    if limited:
        raise InferenceError(429, "rate_limited", "Too many requests; slow down.", retry_after_s=max(1, int(wait) + 1))
    return target_for(project, model)


def target_for(project, model: str) -> Target:
    """Return where a request of ``project`` for ``model`` goes, once billing lets its organization
    run; mark the request on its server. The caller has been authenticated and rate-limited
    (``caller`` for an API key; the dashboard's playground for a signed-in member). Raises
    ``InferenceError``."""
    deployment = callable_deployment(project, model)
    if deployment is None:
        raise model_not_found(model)
    if deployment.status != DeploymentStatus.READY:
        raise InferenceError(503, "model_not_ready", f"The model `{model}` is {deployment.status}; try again shortly.",
                             param="model", retry_after_s=RETRY_AFTER_S)
    blocker = organization_run_blocker(deployment.organization_id)
    if blocker is not None:
        raise InferenceError(402, blocker, BLOCKER_MESSAGES[blocker].replace("run jobs", "call models"))
    status, url, token, _ = server_touch(deployment.server_id)
    return Target(
        deployment_id=deployment.public_id, model=model, upstream_model=upstream_model(deployment), base_model=deployment.base_model,
        organization_id=deployment.organization_id, project_id=deployment.project_id, server_id=deployment.server_id,
        server_status=status, url=url, token=token,
    )


@in_thread
def wake(target: Target) -> Target:
    """Start the target's server when it is stopped (scaled to zero or failed), and return the
    target with its server's status now (``running`` once it answers)."""
    if target.server_status in (ServerStatus.STOPPED, ServerStatus.FAILED):
        server_wake(target.server_id)
    status, url, token, _ = server_touch(target.server_id)
    return Target(**{**target.__dict__, "server_status": status, "url": url, "token": token})


@in_thread
def record(target: Target, request_id: str, usage: dict | None, duration_ms: int | None = None, first_token_ms: int | None = None) -> None:
    """Record the request's tokens on the ledger once (``request_id``), with its latency in
    milliseconds when measured, and mark its end on its server."""
    prompt = int((usage or {}).get("prompt_tokens") or 0)
    completion = int((usage or {}).get("completion_tokens") or 0)
    token_usage_record(
        organization_id=target.organization_id, project_id=target.project_id, request_id=request_id,
        deployment_public_id=target.deployment_id, model=target.base_model, prompt_tokens=prompt, completion_tokens=completion,
        duration_ms=duration_ms, first_token_ms=first_token_ms,
    )
    server_touch(target.server_id)


@in_thread
def callable_models(authorization: str | None) -> list[dict]:
    """Return OpenAI's model objects of the key's project's ready deployments, oldest first, each
    with its token prices as Prime Inference lists them (``pricing``: ``input_usd_per_mtok`` and
    ``output_usd_per_mtok``, USD per million prompt and completion tokens of its base model), which
    ``prime inference models`` shows."""
    api_key = caller(authorization)
    deployments = ready_deployments(api_key.project)
    owner = api_key.project.organization.slug
    prices = {model: token_price(model) for model in {deployment.base_model for deployment in deployments}}
    return [
        {
            "id": deployment.name, "object": "model", "created": int(deployment.created_at.timestamp()), "owned_by": owner,
            "pricing": {
                "input_usd_per_mtok": float(prices[deployment.base_model][0]),
                "output_usd_per_mtok": float(prices[deployment.base_model][1]),
            },
        }
        for deployment in deployments
    ]
