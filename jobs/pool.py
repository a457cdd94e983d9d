"""The compute pool's inventory, from ``LAB_POOL`` (docs/configuration.md).

``{"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 2}, ...]}``: ``count`` nodes of a type, each
with ``gpus`` GPUs; ``gpu_type: "cpu"`` with ``gpus: 0`` is the local CPU pool. A job asks for
``gpus`` GPUs of one type on one node.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from labsdk.spec import JobSpec, SpecProblem


@dataclass(frozen=True)
class NodeGroup:
    """``count`` identical nodes with ``gpus`` GPUs of ``gpu_type`` each."""

    gpu_type: str
    gpus: int
    count: int


def pool_nodes() -> list[NodeGroup]:
    """Return the configured node groups; raise ImproperlyConfigured on a malformed LAB_POOL."""
    groups = []
    for index, node in enumerate(settings.LAB_POOL.get("nodes", [])):
        try:
            groups.append(NodeGroup(gpu_type=str(node["gpu_type"]), gpus=int(node["gpus"]), count=int(node.get("count", 1))))
        except (KeyError, TypeError, ValueError):
            raise ImproperlyConfigured(f"LAB_POOL nodes[{index}] needs gpu_type, gpus and count") from None
    return groups


def pool_problems(spec: JobSpec) -> list[SpecProblem]:
    """Return why the pool can never run ``spec`` (empty when some node could)."""
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
