"""The compute pool's inventory, from ``LAB_POOL`` (docs/configuration.md), or on the Kubernetes
pool without ``LAB_POOL`` from the cluster's nodes (docs/kubernetes.md "Admission on this pool").

``{"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 2}, ...]}``: ``count`` nodes of a type, each
with ``gpus`` GPUs; ``gpu_type: "cpu"`` with ``gpus: 0`` is the local CPU pool. A job asks for
``gpus`` GPUs of one type on one node.

The cluster's inventory (``KubernetesLauncher.pool_inventory``: one list of Nodes) is read by the
reconciler's pass in the worker, which holds the cluster credentials (``cluster_inventory_refresh``,
at most every ``CLUSTER_INVENTORY_TTL_S``), into Django's cache, shared by the processes; the web
process that checks a spec at submit only reads it there and never calls the cluster. While the
API does not answer, the last one read (kept a day) serves; without any the pool is unknown and
submit checks nothing of it: Kueue decides (a Workload that can never fit shows
``kueue_inadmissible``).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from labsdk.spec import JobSpec, SpecProblem

from jobs.launchers.base import LauncherUnavailable
from jobs.launchers.registry import get_launcher

logger = logging.getLogger(__name__)

#: How old the inventory read from the cluster's nodes may get before a pass reads it again
#: (seconds), and how long the last one read is kept while the cluster API does not answer.
CLUSTER_INVENTORY_TTL_S = 300
CLUSTER_INVENTORY_FALLBACK_S = 86_400
_CACHE_KEY = "lab:pool:cluster-inventory"

#: GPU memory of each GPU type in GB (10^9 bytes), what a model's memory estimate
#: (``jobs.registry.memory_estimate_gb``) is divided by; the larger part where a type has two.
GPU_MEMORY_GB = {"A10G": 24, "L4": 24, "L40S": 48, "A100": 80, "H100": 80, "H200": 141, "B200": 180}


@dataclass(frozen=True)
class NodeGroup:
    """``count`` identical nodes with ``gpus`` GPUs of ``gpu_type`` each."""

    gpu_type: str
    gpus: int
    count: int
    product: str = ""  # nvidia.com/gpu.product, when read from the cluster


def reads_cluster_inventory() -> bool:
    """Whether the pool's inventory comes from the cluster's nodes: the Kubernetes launcher and
    no ``LAB_POOL``."""
    return settings.LAB_LAUNCHER == "kubernetes" and not settings.LAB_POOL_CONFIGURED


def cluster_inventory_refresh(*, force: bool = False) -> bool:
    """Read the cluster's nodes into the cache when the copy there is older than
    ``CLUSTER_INVENTORY_TTL_S`` (or ``force``); return whether it was read. Nothing without
    ``reads_cluster_inventory``; an API that does not answer leaves the last copy in place."""
    if not reads_cluster_inventory():
        return False
    entry = cache.get(_CACHE_KEY)
    if entry is not None and not force and time.time() - entry["read_at"] < CLUSTER_INVENTORY_TTL_S:
        return False
    try:
        groups = get_launcher().pool_inventory()
    except LauncherUnavailable as exc:
        logger.warning("the cluster's nodes cannot be read; the last inventory stays: %s", exc)
        return False
    if groups is None:
        return False
    cache.set(_CACHE_KEY, {"read_at": time.time(), "groups": groups}, CLUSTER_INVENTORY_FALLBACK_S)
    return True


def cluster_node_groups() -> list[NodeGroup] | None:
    """Return the node groups the cluster's nodes made up when last read
    (``cluster_inventory_refresh``), or None when they were never read (or not for a day)."""
    entry = cache.get(_CACHE_KEY)
    return None if entry is None else [NodeGroup(**group) for group in entry["groups"]]


def pool_nodes() -> list[NodeGroup]:
    """Return the pool's node groups: from the cluster's nodes (``reads_cluster_inventory``; none
    while unknown), else ``LAB_POOL``; raise ImproperlyConfigured on a malformed LAB_POOL."""
    if reads_cluster_inventory():
        return cluster_node_groups() or []
    groups = []
    for index, node in enumerate(settings.LAB_POOL.get("nodes", [])):
        try:
            groups.append(NodeGroup(gpu_type=str(node["gpu_type"]), gpus=int(node["gpus"]), count=int(node.get("count", 1))))
        except (KeyError, TypeError, ValueError):
            raise ImproperlyConfigured(f"LAB_POOL nodes[{index}] needs gpu_type, gpus and count") from None
    return groups


def pool_problems(spec: JobSpec) -> list[SpecProblem]:
    """Return why the pool can never run ``spec`` (empty when some node could, or when the
    cluster's inventory is unknown: Kueue decides then)."""
    if reads_cluster_inventory():
        groups = cluster_node_groups()
        if groups is None:
            return []
    else:
        groups = pool_nodes()
    types = sorted({group.gpu_type for group in groups})
    gpu_type, gpus = spec.resources.gpu_type, spec.resources.gpus or 0
    matching = [group for group in groups if group.gpu_type == gpu_type]
    if not matching:
        return [
            SpecProblem(
                "resources.gpu_type",
                "unavailable_resource",
                f"the pool has no '{gpu_type}' nodes; available: {', '.join(types) or 'none'}",
            )
        ]
    if gpu_type == "cpu" and gpus != 0:
        return [SpecProblem("resources.gpus", "out_of_range", "CPU jobs take gpus = 0")]
    largest = max(group.gpus for group in matching)
    if gpus > largest:
        return [
            SpecProblem(
                "resources.gpus",
                "out_of_range",
                f"{gpus} GPUs do not fit on one '{gpu_type}' node (at most {largest})",
            )
        ]
    return []


def minimum_gpus(model, *, mode: str, gpu_type: str) -> int | None:
    """The fewest GPUs of ``gpu_type`` whose memory holds ``model`` (a registry row) training in
    ``mode`` (``lora`` or ``full``): its ``memory_gb`` estimate over ``GPU_MEMORY_GB``, at least 1;
    None when either is unknown (a CPU job, a model of unknown size, an unlisted GPU type)."""
    needed, per_gpu = (model.memory_gb or {}).get(mode), GPU_MEMORY_GB.get(gpu_type)
    if not needed or not per_gpu:
        return None
    return max(1, math.ceil(needed / per_gpu))


def model_gpu_problems(spec: JobSpec, model) -> list[SpecProblem]:
    """Return why ``spec`` asks for too few GPUs for its model (a registry row): fewer than
    ``minimum_gpus``, named in the message with the estimate it comes from, and whether one node
    of the pool has that many (empty when they suffice or either size is unknown)."""
    gpu_type, gpus = spec.resources.gpu_type, spec.resources.gpus or 0
    mode = "lora" if spec.lora_rank else "full"
    minimum = minimum_gpus(model, mode=mode, gpu_type=gpu_type)
    if minimum is None or gpus >= minimum:
        return []
    what = "with LoRA" if mode == "lora" else "in full"
    message = (
        f"{model.id} needs about {model.memory_gb[mode]} GB of GPU memory to train {what} (an estimate from its "
        f"{model.parameters:,} parameters) and one '{gpu_type}' holds {GPU_MEMORY_GB[gpu_type]} GB: it needs at least "
        f"{minimum} GPUs on one node"
    )
    groups = [group for group in (cluster_node_groups() if reads_cluster_inventory() else pool_nodes()) or [] if group.gpu_type == gpu_type]
    largest = max((group.gpus for group in groups), default=None)
    if largest is not None and largest < minimum:
        message += f", and this pool's '{gpu_type}' nodes have at most {largest}"
    else:
        message += f": ask for resources.gpus = {minimum}"
    return [SpecProblem("resources.gpus", "out_of_range", message)]
