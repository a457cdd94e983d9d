"""Inference servers and the deployments on them: weights prepared, servers started when a
deployment or a request needs one, stopped when idle or empty (docs/serving.md "Servers").

``reconcile`` is one pass (the Celery task ``serving.reconcile``: beat every
``LAB_RECONCILE_INTERVAL_S``, after every change, and every second while a server starts or
stops):

1. each ``pending`` deployment gets its weights unpacked (``serving.weights``) and its server
   (one per base model for adapters and the base model itself, one per full checkpoint; created
   on first use), and turns ``deploying``; or ``failed`` with the reason;
2. each server with deployments or a process is brought where they need it
   (``reconcile_server``): started (``server_wake``) for a ``deploying`` deployment; once it
   answers, every deployment on it registered and the ``deploying`` ones ``ready``; ``unloading``
   ones taken off it and ``stopped``; stopped when no deployment is left on it, or when it has
   had no request for ``LAB_SERVING_IDLE_S`` (scaled to zero: its deployments stay ``ready`` and
   the next request starts it again, ``server_wake``);
3. the runs of dedicated servers are billed on the usage ledger (``serving.usage``), and the
   running dedicated servers of organizations with nothing left to spend are stopped.

A server is reconciled under its advisory lock, tried without waiting: a pass that finds it held
leaves that server to the holder. The runtime (a process, a cluster) is only called outside
database transactions; every status change is a conditional update of the row.
"""

from __future__ import annotations

import functools
import logging
import secrets
from datetime import datetime, timedelta
from pathlib import Path

import httpx
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from billing.accounts import BLOCKER_MESSAGES
from jobs.launchers.kubernetes.gateway import KubernetesGateway
from jobs.launchers.registry import kubernetes_pool_settings
from jobs.models import Adapter, Checkpoint, Model, ModelStatus
from jobs.registry.store import stored_model_manifest
from lab import dispatch
from lab.celery import TaskName
from lab.errors import LabError
from lab.lib import locks
from lab.lib.locks import advisory_lock
from serving.models import (
    ACTIVE_STATUSES,
    DEDICATED_KEY_PREFIX,
    Deployment,
    DeploymentStatus,
    InferenceServer,
    ServerStatus,
    ServingMode,
    SourceType,
)
from serving.runtime.base import ServerPhase, ServerRuntime, ServerSpec
from serving.runtime.kubernetes import KubernetesServerRuntime
from serving.runtime.local import LocalServerRuntime
from serving.selectors import model_parameters
from serving.services import deployment_transition
from serving.usage import server_usage_close
from serving.weights import remove_weights, unpack_weights

logger = logging.getLogger(__name__)

#: Seconds a stopping server has to exit before it is killed.
STOP_GRACE_S = 30
#: Seconds Lab waits for a server's answer to a health check, and to an adapter's (un)registration.
HEALTH_TIMEOUT_S = 3.0
REGISTER_TIMEOUT_S = 300.0


def runtime() -> ServerRuntime:
    """Return the runtime that holds this Lab's inference servers (``LAB_SERVING_RUNTIME``): local
    processes under ``LAB_DATA_DIR/serving/servers``, or Deployments on the Kubernetes pool."""
    if settings.LAB_SERVING_RUNTIME == "kubernetes":
        return _kubernetes_runtime()
    return LocalServerRuntime(servers_dir=Path(settings.LAB_DATA_DIR) / "serving" / "servers", repo_dir=Path(settings.BASE_DIR))


@functools.cache
def _kubernetes_runtime() -> KubernetesServerRuntime:
    """The Kubernetes runtime on the cluster of this process (one gateway, its HTTP pool kept)."""
    return KubernetesServerRuntime(
        KubernetesGateway(), namespace=settings.LAB_K8S_SERVING_NAMESPACE, pool=kubernetes_pool_settings(),
        gpu_type=settings.LAB_SERVING_GPU_TYPE, weights_claim=settings.LAB_K8S_SERVING_WEIGHTS_PVC,
        weights_root=str(weights_root()), parameters=model_parameters,
    )


def weights_root() -> Path:
    """Return where deployed checkpoints' and adapters' weights are unpacked (``LAB_DATA_DIR/serving/weights``)."""
    return Path(settings.LAB_DATA_DIR) / "serving" / "weights"


def upstream_model(deployment: Deployment) -> str:
    """Return the name the deployment has on its server: an adapter's id, or the served model's."""
    if deployment.mode == ServingMode.BASE:
        return deployment.base_model
    return deployment.source_id


# --- waking and touching (the OpenAI-compatible API calls these) ----------------------------------


def server_wake(server_id: int) -> bool:
    """Claim the start of a stopped or failed server (a new generation, a new token); return
    whether this call claimed it, in which case a reconcile pass is sent to start it."""
    now = timezone.now()
    claimed = InferenceServer.objects.filter(pk=server_id, status__in=(ServerStatus.STOPPED, ServerStatus.FAILED)).update(
        status=ServerStatus.STARTING, generation=F("generation") + 1, handle={}, url="", token=secrets.token_urlsafe(32),
        status_reason="", status_changed_at=now, last_request_at=now,
    )
    if claimed:
        dispatch.enqueue_on_commit(TaskName.RECONCILE_SERVING)
    return bool(claimed)


_TOUCH_SQL = (
    "UPDATE {table} SET last_request_at = %s WHERE id = %s RETURNING status, url, token, generation"
)


def server_touch(server_id: int) -> tuple[str, str, str, int] | None:
    """Mark a request to the server now (what keeps it from being scaled to zero) and return its
    (status, url, token, generation) as they are, in one statement; None when it is gone."""
    with connection.cursor() as cursor:
        cursor.execute(_TOUCH_SQL.format(table=connection.ops.quote_name(InferenceServer._meta.db_table)), [timezone.now(), server_id])
        row = cursor.fetchone()
    return tuple(row) if row else None


# --- the pass -------------------------------------------------------------------------------------


def reconcile(*, now: datetime | None = None) -> bool:
    """Make one pass (module docstring); return whether something is in motion (a deployment
    pending or a server starting or stopping), so that another pass should follow soon."""
    now = now or timezone.now()
    for deployment in Deployment.objects.unscoped().filter(status=DeploymentStatus.PENDING).order_by("pk"):
        _prepare(deployment)
    for deployment in Deployment.objects.unscoped().filter(status=DeploymentStatus.UNLOADING, server__isnull=True).order_by("pk"):
        _stopped(deployment, "Deleted before it reached a server.")
    busy_servers = Deployment.objects.unscoped().filter(status__in=ACTIVE_STATUSES, server__isnull=False).values("server_id")
    servers = InferenceServer.objects.filter(Q(pk__in=busy_servers) | ~Q(status=ServerStatus.STOPPED)).order_by("pk")
    for server_id in servers.values_list("pk", flat=True):
        reconcile_server(server_id, now=now)
    bill_dedicated_servers(now=now)
    in_motion = InferenceServer.objects.filter(status__in=(ServerStatus.STARTING, ServerStatus.STOPPING)).exists()
    return in_motion or Deployment.objects.unscoped().filter(status=DeploymentStatus.PENDING).exists()


def bill_dedicated_servers(*, now: datetime) -> None:
    """Close the due usage of the dedicated servers' runs (``serving.usage``) and stop the running
    dedicated servers of organizations with nothing left to spend (their deployments stay
    ``ready``; a request is refused with 402 until the organization can pay, then starts it
    again). A failure is logged; the next pass closes the same intervals."""
    try:
        result = server_usage_close(now=now)
    except Exception:
        logger.exception("closing the dedicated servers' usage failed")
        return
    if not result.used_up:
        return
    unpaid = Deployment.objects.unscoped().filter(
        organization_id__in=set(result.used_up), mode=ServingMode.DEDICATED, status__in=ACTIVE_STATUSES,
        server__status=ServerStatus.RUNNING,
    ).values_list("server_id", "organization_id")
    for server_id, organization_id in unpaid:
        with advisory_lock(locks.SERVING_SERVER, server_id, wait=False) as claimed:
            if claimed:
                server = InferenceServer.objects.get(pk=server_id)
                if server.status == ServerStatus.RUNNING:
                    _stop(server, f"Stopped: {BLOCKER_MESSAGES[result.used_up[organization_id]]}")


def _prepare(deployment: Deployment) -> None:
    """Unpack a pending deployment's weights and give it its server (it turns ``deploying``), or fail it."""
    with advisory_lock(locks.SERVING_WEIGHTS, deployment.pk, wait=False) as claimed:
        if not claimed:
            return
        deployment.refresh_from_db()
        if deployment.status != DeploymentStatus.PENDING:
            return
        weights = ""
        if deployment.source_type != SourceType.MODEL:
            model = Checkpoint if deployment.source_type == SourceType.CHECKPOINT else Adapter
            artifact = model.objects.unscoped().filter(public_id=deployment.source_id).first()
            try:
                if artifact is None:
                    raise LabError("not_found", f"{deployment.source_id} no longer exists.")
                weights = str(unpack_weights(artifact, weights_root()))
            except LabError as error:
                deployment_transition(deployment=deployment, to=DeploymentStatus.FAILED, reason=f"Its weights could not be prepared: {error.message}")
                return
        server = _server_for(deployment, weights)
        with transaction.atomic():
            if Deployment.objects.unscoped().filter(pk=deployment.pk, status=DeploymentStatus.PENDING).update(server=server, weights_dir=weights):
                deployment.server, deployment.weights_dir = server, weights
                deployment_transition(deployment=deployment, to=DeploymentStatus.DEPLOYING,
                                      message=f"Weights ready; waiting for inference server {server.public_id} ({server.key}).")


def _server_for(deployment: Deployment, weights: str) -> InferenceServer:
    """Return the deployment's server, created on first use: its base model's for an adapter or
    the base model, its own (by source id) for full weights."""
    if deployment.mode == ServingMode.DEDICATED:
        key, served, weights_dir = f"{DEDICATED_KEY_PREFIX}{deployment.source_id}", deployment.source_id, weights
    else:
        key, served, weights_dir = f"base:{deployment.base_model}", deployment.base_model, ""
    try:
        server, _ = InferenceServer.objects.get_or_create(key=key, defaults={"model": deployment.base_model, "served_model": served, "weights_dir": weights_dir})
    except IntegrityError:  # created meanwhile by another pass
        server = InferenceServer.objects.get(key=key)
    return server


def reconcile_server(server_id: int, *, now: datetime) -> None:
    """Bring one server and its deployments where they should be (module docstring), unless
    another pass holds it."""
    with advisory_lock(locks.SERVING_SERVER, server_id, wait=False) as claimed:
        if not claimed:
            return
        server = InferenceServer.objects.get(pk=server_id)
        if server.status in (ServerStatus.STOPPED, ServerStatus.FAILED):
            _unload_all(server)
            if not _deployments(server, DeploymentStatus.DEPLOYING) or not server_wake(server.pk):
                return
            server.refresh_from_db()
        if server.status == ServerStatus.STARTING:
            _starting(server, now=now)
        elif server.status == ServerStatus.RUNNING:
            _running(server, now=now)
        elif server.status == ServerStatus.STOPPING:
            _stopping(server, now=now)


def _deployments(server: InferenceServer, *statuses: str) -> list[Deployment]:
    return list(Deployment.objects.unscoped().filter(server=server, status__in=statuses).order_by("pk"))


def _move(server: InferenceServer, to: str, *, reason: str = "", **fields) -> bool:
    """Move the server from the status and generation read to ``to`` (a conditional update); a
    server that stops or fails ends its run (``run_ended_at``, what it is billed to)."""
    now = timezone.now()
    if to in (ServerStatus.STOPPED, ServerStatus.FAILED) and server.run_started_at is not None and server.run_ended_at is None:
        fields["run_ended_at"] = now
    moved = InferenceServer.objects.filter(pk=server.pk, status=server.status, generation=server.generation).update(
        status=to, status_reason=reason[:500], status_changed_at=now, **fields
    )
    if moved:
        server.status, server.status_reason, server.status_changed_at = to, reason[:500], now
        for name, value in fields.items():
            setattr(server, name, value)
    return bool(moved)


def _spec(server: InferenceServer) -> ServerSpec:
    return ServerSpec(
        server_id=server.public_id, generation=server.generation, model=server.model, served_model=server.served_model,
        max_adapters=settings.LAB_SERVING_MAX_ADAPTERS, weights_dir=server.weights_dir or None, token=server.token,
        backend=settings.LAB_SERVING_BACKEND, max_lora_rank=settings.LAB_SERVING_MAX_LORA_RANK,
        stored_model=_stored_model(server.model),
    )


def _stored_model(model_id: str) -> dict | None:
    """The ``LAB_JOB_MODEL`` manifest of ``model_id`` when Lab's model store holds it ready, made
    at each start (its URLs may be pre-signed for a while only); None otherwise. Whoever may use
    the model was checked when its deployments were created (``serving.services``): a server
    serves one base model, and an organization's own model's id is in that organization's
    namespace, so no other organization's deployment is ever on its server."""
    model = Model.objects.filter(id=model_id, status=ModelStatus.READY).exclude(files=[]).first()
    return stored_model_manifest(model) if model is not None else None


def _starting(server: InferenceServer, *, now: datetime) -> None:
    if not server.handle:
        if server.run_started_at is not None and not server.run_billed:
            server_usage_close(server_ids=[server.pk], now=now)  # the last run's end, before a new run starts
        try:
            handle = runtime().start(_spec(server))
        except (OSError, RuntimeError) as error:
            _failed(server, f"The inference server could not be started: {error}")
            return
        run = {"run_started_at": timezone.now(), "run_ended_at": None, "run_billed": False}
        InferenceServer.objects.filter(pk=server.pk, generation=server.generation).update(handle=handle, **run)
        server.handle = handle
        for name, value in run.items():
            setattr(server, name, value)
    seen = runtime().observe(server.handle)
    if seen.phase in (ServerPhase.EXITED, ServerPhase.LOST):
        _failed(server, f"The inference server exited while starting: {seen.detail[-400:] or seen.phase}")
    elif seen.phase == ServerPhase.LISTENING and _healthy(seen.url):
        server.url = seen.url
        for deployment in _deployments(server, DeploymentStatus.READY, DeploymentStatus.DEPLOYING):
            _register(server, deployment, load=deployment.status == DeploymentStatus.DEPLOYING)
        if _move(server, ServerStatus.RUNNING, url=seen.url, last_request_at=timezone.now()):
            for deployment in _deployments(server, DeploymentStatus.DEPLOYING):
                deployment_transition(deployment=deployment, to=DeploymentStatus.READY, message=f"Served by {server.public_id}.")
            _unload_all(server)
    elif now - server.status_changed_at > timedelta(seconds=settings.LAB_SERVING_START_TIMEOUT_S):
        runtime().stop(server.handle, force=True)
        _failed(server, f"The inference server did not start within {settings.LAB_SERVING_START_TIMEOUT_S} s.")


def _running(server: InferenceServer, *, now: datetime) -> None:
    seen = runtime().observe(server.handle)
    if seen.phase in (ServerPhase.EXITED, ServerPhase.LOST):
        _failed(server, f"The inference server exited: {seen.detail[-400:] or seen.phase}")
        return
    for deployment in _deployments(server, DeploymentStatus.DEPLOYING):
        if _register(server, deployment, load=True):
            deployment_transition(deployment=deployment, to=DeploymentStatus.READY, message=f"Served by {server.public_id}.")
            InferenceServer.objects.filter(pk=server.pk).update(last_request_at=timezone.now())  # a new deployment is not idle
    for deployment in _deployments(server, DeploymentStatus.UNLOADING):
        if deployment.mode == ServingMode.ADAPTER:
            _unregister(server, deployment)
        _stopped(deployment, f"Taken off {server.public_id}.")
    if not _deployments(server, DeploymentStatus.READY, DeploymentStatus.DEPLOYING):
        _stop(server, "No deployment is left on it.")
        return
    idle_since = now - timedelta(seconds=settings.LAB_SERVING_IDLE_S)
    idle = InferenceServer.objects.filter(pk=server.pk, status=ServerStatus.RUNNING, generation=server.generation, status_changed_at__lt=idle_since).filter(
        Q(last_request_at__isnull=True) | Q(last_request_at__lt=idle_since)
    )
    if idle.exists():
        _stop(server, f"Scaled to zero: no request for {settings.LAB_SERVING_IDLE_S} s.", idle=idle)


def _stop(server: InferenceServer, reason: str, *, idle=None) -> None:
    """Move a running server to ``stopping`` (for ``idle``: only while still idle) and signal it."""
    now = timezone.now()
    rows = idle if idle is not None else InferenceServer.objects.filter(pk=server.pk, status=server.status, generation=server.generation)
    if rows.update(status=ServerStatus.STOPPING, status_reason=reason, status_changed_at=now):
        server.status, server.status_changed_at = ServerStatus.STOPPING, now
        runtime().stop(server.handle)


def _stopping(server: InferenceServer, *, now: datetime) -> None:
    _unload_all(server)
    seen = runtime().observe(server.handle)
    if seen.phase in (ServerPhase.EXITED, ServerPhase.LOST):
        _move(server, ServerStatus.STOPPED, reason=server.status_reason, url="")
    elif now - server.status_changed_at > timedelta(seconds=STOP_GRACE_S):
        runtime().stop(server.handle, force=True)


def _failed(server: InferenceServer, reason: str) -> None:
    """Mark the server failed and fail the deployments that were waiting for it to deploy (the
    ready ones stay ready: the next request starts it again)."""
    if _move(server, ServerStatus.FAILED, reason=reason, url=""):
        if server.handle:
            runtime().stop(server.handle, force=True)  # what is left of it (a pod restarting in a loop) goes
        for deployment in _deployments(server, DeploymentStatus.DEPLOYING):
            deployment_transition(deployment=deployment, to=DeploymentStatus.FAILED, reason=reason)
        _unload_all(server)


def _unload_all(server: InferenceServer) -> None:
    """Stop the ``unloading`` deployments of a server that holds none of them (not running)."""
    for deployment in _deployments(server, DeploymentStatus.UNLOADING):
        _stopped(deployment, f"{server.public_id} is not running.")


def _stopped(deployment: Deployment, message: str) -> None:
    """Stop an unloading deployment, and delete its unpacked weights unless another active
    deployment (or the server that serves them) still uses them."""
    if not deployment_transition(deployment=deployment, to=DeploymentStatus.STOPPED, message=message):
        return
    in_use = Deployment.objects.unscoped().filter(source_id=deployment.source_id, status__in=ACTIVE_STATUSES).exists()
    if deployment.weights_dir and not in_use:
        remove_weights(weights_root(), deployment.source_id)


# --- talking to a server ----------------------------------------------------------------------------


def _client(server: InferenceServer, timeout: float) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=timeout)


def _healthy(url: str) -> bool:
    """Whether the server at ``url`` answers its health check."""
    try:
        return httpx.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False


def _register(server: InferenceServer, deployment: Deployment, *, load: bool) -> bool:
    """Register an adapter deployment on its server (loading it now with ``load``); return
    whether it is there. One it refuses is failed with the server's reason; other modes need nothing."""
    if deployment.mode != ServingMode.ADAPTER:
        return True
    body = {"name": upstream_model(deployment), "path": deployment.weights_dir, "load": load}
    try:
        with _client(server, REGISTER_TIMEOUT_S) as client:
            answer = client.post("/v1/adapters", json=body)
    except httpx.HTTPError as error:
        if deployment.status == DeploymentStatus.DEPLOYING:
            deployment_transition(deployment=deployment, to=DeploymentStatus.FAILED, reason=f"Its server did not take it: {error}")
        return False
    if answer.status_code == 200:
        return True
    if deployment.status == DeploymentStatus.DEPLOYING:
        message = answer.json().get("error", {}).get("message", answer.text) if answer.headers.get("content-type") == "application/json" else answer.text
        deployment_transition(deployment=deployment, to=DeploymentStatus.FAILED, reason=f"Its server refused it: {message[:400]}")
    return False


def _unregister(server: InferenceServer, deployment: Deployment) -> None:
    """Take an adapter off its server (unloading it) unless another active deployment uses it."""
    name = upstream_model(deployment)
    others = Deployment.objects.unscoped().filter(server=server, source_id=deployment.source_id, status__in=(DeploymentStatus.READY, DeploymentStatus.DEPLOYING))
    if others.exclude(pk=deployment.pk).exists():
        return
    try:
        with _client(server, REGISTER_TIMEOUT_S) as client:
            client.delete(f"/v1/adapters/{name}")
    except httpx.HTTPError:
        pass  # the server is going away or restarting: it will not register it again
