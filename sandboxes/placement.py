"""Where a sandbox runs, for the services (``sandboxes.services``): the one agent at
``LAB_SANDBOX_AGENT_URL``, or, with ``LAB_SANDBOX_RUNTIME=kubernetes``, the agent of the warm pod
of the Kubernetes pool it claimed (``sandboxes.runtime.pool``; docs/kubernetes.md "Sandbox pool").

A pool sandbox's row keeps its pod's name, uid and its agent's URL, so every later call (start,
logs, destroy, data-plane access, reconcile) goes to that pod's agent, signed with that agent's
own key (``tokens.agent_key`` of Lab's secret and the pod's uid); its end deletes the pod.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator

from django.conf import settings
from django.utils.module_loading import import_string

from lab.errors import LabError
from sandboxes.agent import tokens
from sandboxes.conf import pool_enabled, setting
from sandboxes.models import ACTIVE_STATUSES, Sandbox
from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import RuntimeRefusal, SandboxSpec
from sandboxes.runtime.pool import PoolPod, SandboxPool

logger = logging.getLogger(__name__)

#: Seconds a pod may stay claimed with no active sandbox on record before the reconcile deletes
#: it: a create claims its pod just before it stores the row, so a young one is left alone.
ORPHAN_GRACE_S = 300


def agent_at(url: str) -> AgentRuntime:
    """Return the client of the agent at ``url``, signed for with ``LAB_SANDBOX_AGENT_SECRET``."""
    return _agent(url, settings.LAB_SANDBOX_AGENT_SECRET)


@functools.lru_cache(maxsize=512)  # one client (its connection pool) per agent: a pool's pods each have one
def _agent(url: str, secret: str) -> AgentRuntime:
    return AgentRuntime(url, secret=secret.encode())


def agent_of(sandbox: Sandbox) -> AgentRuntime:
    """Return the agent that holds ``sandbox``: its pod's, signed for with that pod's own key,
    else the one at ``LAB_SANDBOX_AGENT_URL``."""
    if sandbox.pod_uid:
        return _agent(sandbox.agent_url, pod_key(sandbox.pod_uid))
    return agent_at(sandbox.agent_url or settings.LAB_SANDBOX_AGENT_URL)


def pod_key(pod_uid: str) -> str:
    """Return the key of the agent of the pool's pod ``pod_uid``: what its init container wrote
    for it (``sandboxes.agent.pod_key``), derived from ``LAB_SANDBOX_AGENT_SECRET``."""
    return tokens.agent_key(settings.LAB_SANDBOX_AGENT_SECRET.encode(), pod_uid)


def pool() -> SandboxPool:
    """Return the Kubernetes pool of this Lab's settings (``sandboxes.conf``)."""
    cluster = import_string(setting("LAB_SANDBOX_POOL_CLUSTER"))(setting("LAB_SANDBOX_POOL_NAMESPACE"))
    return SandboxPool(cluster, pools=setting("LAB_SANDBOX_POOL_IMAGES"), wait_s=setting("LAB_SANDBOX_POOL_WAIT_S"))


def claim_for(spec: SandboxSpec) -> PoolPod | None:
    """Claim a warm pod for the sandbox ``spec`` and return it (None when sandboxes do not run on
    the pool). Refusals are LabErrors: ``invalid_request`` when no pool runs such a sandbox (its
    image, or ``network: egress``) or its pods are smaller than it; ``sandbox_capacity`` (503) when
    every warm pod is taken or the cluster does not answer."""
    if not pool_enabled():
        return None
    try:
        return pool().claim(spec)
    except RuntimeRefusal as refusal:
        if refusal.code == "no_pool":
            raise LabError("invalid_request", refusal.message, param="network" if spec.network == "egress" else "image") from None
        if refusal.code == "too_large":
            raise LabError("invalid_request", refusal.message, param="memory_gb") from None
        raise LabError("sandbox_capacity", refusal.message, retry_after_s=5) from None


def pod_fields(pod: PoolPod | None) -> dict[str, str]:
    """Return the Sandbox fields that say which pod (and agent) holds it."""
    return {"pod_name": pod.name, "pod_uid": pod.uid, "agent_url": pod.agent_url} if pod else {}


@contextlib.contextmanager
def released_on_error(pod: PoolPod | None) -> Iterator[None]:
    """Delete the claimed ``pod`` when the block raises (the create it was claimed for was refused)."""
    try:
        yield
    except BaseException:
        if pod is not None:
            release_pod(pod.name, sandbox_id=pod.sandbox_id)
        raise


def release_pod(pod_name: str, *, sandbox_id: str) -> None:
    """Delete the pod ``pod_name`` of an ended sandbox; a failure is logged (the reconcile deletes
    claimed pods no active sandbox holds)."""
    try:
        pool().release(pod_name)
    except RuntimeRefusal as refusal:
        logger.warning("sandbox %s: its pod %s was not deleted: %s", sandbox_id, pod_name, refusal.message)


def data_plane_url(sandbox: Sandbox) -> str:
    """Return the data-plane address clients are given for ``sandbox``: its pod's
    (``LAB_SANDBOX_POOL_DATA_PLANE_URL`` filled with the pod's name, IP and port), else
    ``LAB_SANDBOX_DATA_PLANE_URL``."""
    if not sandbox.pod_name:
        return settings.LAB_SANDBOX_DATA_PLANE_URL
    address = sandbox.agent_url.split("://", 1)[-1]
    ip, _, port = address.rpartition(":")
    return setting("LAB_SANDBOX_POOL_DATA_PLANE_URL").format(pod=sandbox.pod_name, ip=ip, port=port).rstrip("/")


def held_sandboxes(*, now: float | None = None) -> tuple[str, set[str], bool] | None:
    """Return what holds sandboxes now: the agent's instance id (``kubernetes`` for the pool), the
    ids of the sandboxes held, and whether they are the pool's; None when the agent or the cluster
    cannot be asked. A pool's sandbox is held while its claimed pod is there, not ending, its agent
    not restarted since the claim. Claimed pods no active sandbox holds, claimed over
    ``ORPHAN_GRACE_S`` ago, are deleted."""
    try:
        if not pool_enabled():
            instance, held = agent_at(settings.LAB_SANDBOX_AGENT_URL).held()
            return instance, set(held), False
        claimed = pool().claimed()
    except RuntimeRefusal as refusal:
        logger.warning("sandbox reconcile skipped: %s", refusal.message)
        return None
    now = time.time() if now is None else now
    active_ids = set(Sandbox.objects.unscoped().filter(status__in=ACTIVE_STATUSES).values_list("public_id", flat=True))
    for sandbox_id, pod in claimed.items():
        if sandbox_id not in active_ids and not pod.ending and now - pod.claimed_at > ORPHAN_GRACE_S:
            logger.warning("sandbox pod %s holds no active sandbox (%s): deleting it", pod.name, sandbox_id)
            release_pod(pod.name, sandbox_id=sandbox_id)
    return "kubernetes", {sandbox_id for sandbox_id, pod in claimed.items() if not pod.lost_its_sandbox}, True
