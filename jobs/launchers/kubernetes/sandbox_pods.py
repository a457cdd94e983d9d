"""The pods of the sandbox pool (``sandboxes.runtime.pool``) on Lab's cluster gateway.

Sandboxes sit below jobs and never import them; the pool reaches the cluster through this
adapter, named by ``LAB_SANDBOX_POOL_CLUSTER`` (``sandboxes.conf``). A claim is a JSON merge
patch of the pod's labels carrying the ``resourceVersion`` it was read at: 409 (changed since) or
404 (gone) is ``PodConflict``, any other refusal ``RuntimeRefusal("cluster_unavailable")``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from jobs.launchers.kubernetes.gateway import ClusterError, ClusterGateway, KubernetesGateway
from jobs.launchers.kubernetes.kinds import POD
from sandboxes.runtime.base import RuntimeRefusal
from sandboxes.runtime.pool import PodCluster, PodConflict


class GatewayPods(PodCluster):
    """The pods of ``namespace`` through ``gateway``."""

    def __init__(self, gateway: ClusterGateway, *, namespace: str) -> None:
        self.gateway, self.namespace = gateway, namespace

    def pods(self, labels: Mapping[str, str]) -> list[dict]:
        selector = ",".join(f"{key}={value}" for key, value in labels.items())
        try:
            return self.gateway.list(POD, namespace=self.namespace, label_selector=selector).items
        except ClusterError as error:
            raise RuntimeRefusal("cluster_unavailable", f"The cluster did not list the sandbox pods: {error}") from None

    def relabel(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str], *,
                resource_version: str) -> dict:
        patch = {"metadata": {"resourceVersion": resource_version, "labels": dict(labels), "annotations": dict(annotations)}}
        try:
            return self.gateway.patch(POD, name, self.namespace, patch)
        except ClusterError as error:
            if error.status in (404, 409):
                raise PodConflict(name) from None
            raise RuntimeRefusal("cluster_unavailable", f"The cluster did not relabel pod {name}: {error}") from None

    def delete(self, name: str) -> bool:
        try:
            return self.gateway.delete(POD, name, self.namespace)
        except ClusterError as error:
            raise RuntimeRefusal("cluster_unavailable", f"The cluster did not delete pod {name}: {error}") from None


@functools.cache
def gateway_pods(namespace: str) -> GatewayPods:
    """Return the pods of ``namespace`` on the cluster of this process (one gateway, its HTTP pool kept)."""
    return GatewayPods(KubernetesGateway(), namespace=namespace)
