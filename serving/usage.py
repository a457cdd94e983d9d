"""Dedicated inference servers on the billing ledger (docs/billing.md "Dedicated deployments").

A dedicated server (``ServingMode.DEDICATED``: one deployment's full weights on a server of their
own) is billed for each run of its process, from when Lab launched it to when Lab saw it stopped
or failed (``InferenceServer.run_started_at``/``run_ended_at``), in the ledger's intervals
(``billing.ledger.usage_close_many``, meter ``server``, keyed by the server's row id: each interval
recorded and charged once, a later run's intervals starting where it starts). The resource is
``LAB_SERVING_GPU_TYPE`` and the units the GPUs its model takes on it (``server_gpus`` of the
model's parameter count), whichever runtime holds it: a server on this machine's local runtime
holds no GPU but is billed as the pool would hold it. Servers shared by adapters and base models
are not billed by the second (their requests are billed by the token, ``billing.tokens``).

The interval is billed to the server's deployment (the oldest one still active on it, else the
newest): its organization, project and ``deployment_public_id``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from billing.ledger import AttemptUsage, BatchCloseResult, usage_close_many
from billing.models import Meter
from lab.lib.resources import CPU
from serving.models import ACTIVE_STATUSES, DEDICATED_KEY_PREFIX, Deployment, InferenceServer
from serving.runtime.kubernetes import server_gpus
from serving.selectors import model_parameters


def server_units(model_id: str) -> tuple[str, Decimal]:
    """Return the resource a dedicated server of ``model_id`` is billed as and its units:
    ``LAB_SERVING_GPU_TYPE`` and the GPUs the model takes on it, or one ``cpu`` slot on a CPU pool."""
    gpu_type = settings.LAB_SERVING_GPU_TYPE
    if gpu_type == CPU:
        return CPU, Decimal(1)
    return gpu_type, Decimal(server_gpus(model_parameters(model_id), gpu_type))


def billed_deployment(server: InferenceServer) -> Deployment | None:
    """Return the deployment a dedicated server's usage is billed to: the oldest active one on
    it, else the newest one it held; None when it never held one."""
    deployments = Deployment.objects.unscoped().filter(server=server)
    return deployments.filter(status__in=ACTIVE_STATUSES).order_by("pk").first() or deployments.order_by("-pk").first()


def server_usages(servers: Iterable[InferenceServer], *, now: datetime) -> list[AttemptUsage]:
    """Return the ledger's series of each of the dedicated ``servers`` with a run to bill."""
    usages = []
    for server in servers:
        deployment = billed_deployment(server)
        if server.run_started_at is None or deployment is None:
            continue
        resource_type, units = server_units(server.model)
        usages.append(
            AttemptUsage(
                organization_id=deployment.organization_id,
                project_id=deployment.project_id,
                job_public_id="",
                attempt_id=server.pk,
                attempt_number=server.generation,
                resource_type=resource_type,
                gpus=int(units),
                started_at=server.run_started_at,
                ended_at=server.run_ended_at,
                meter=Meter.SERVER,
                units=units,
                deployment_public_id=deployment.public_id,
            )
        )
    return usages


def server_usage_close(*, server_ids: Iterable[int] | None = None, now: datetime | None = None) -> BatchCloseResult:
    """Close the due intervals of the dedicated servers' runs (those of ``server_ids``, else every
    one with a run not yet billed to its end) in one ledger transaction, and mark the ended runs
    ``run_billed``; return what the ledger closed (``used_up``: the organizations with nothing
    left to spend). Idempotent: an interval already in the ledger is never recorded or charged again."""
    now = now or timezone.now()
    servers = InferenceServer.objects.filter(
        key__startswith=DEDICATED_KEY_PREFIX, run_started_at__isnull=False, run_billed=False
    )
    if server_ids is not None:
        servers = servers.filter(pk__in=list(server_ids))
    servers = list(servers.order_by("pk"))
    usages = server_usages(servers, now=now)
    if not usages:
        return BatchCloseResult()
    result = usage_close_many(usages=usages, now=now, skip_locked=server_ids is None)
    billed = {
        usage.attempt_id
        for usage in usages
        if usage.ended_at is not None and usage.organization_id not in result.skipped
    }
    if billed:  # only the run that was closed: one started since keeps its own flag
        for server in servers:
            if server.pk in billed:
                InferenceServer.objects.filter(Q(pk=server.pk), run_started_at=server.run_started_at).update(
                    run_billed=True
                )
    return result
