"""The Kubernetes kinds Lab reads or writes, and where each lives in the API.

Kueue is addressed at ``v1beta2`` (its storage version since Kueue 0.16) and JobSet at
``v1alpha2`` (their CRDs in tests/k8s/data/).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One resource type: its ``apiVersion``, ``kind``, URL plural and whether it is namespaced."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def collection_path(self, namespace: str | None) -> str:
        """Return the URL path of this kind's collection (in ``namespace``, or cluster-wide).

        The layout is the Kubernetes API's: ``/api/v1/...`` for the core group,
        ``/apis/<group>/<version>/...`` otherwise.
        """
        root = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{namespace}/{self.plural}"
        return f"{root}/{self.plural}"

    def object_path(self, name: str, namespace: str | None) -> str:
        """Return the URL path of one object of this kind."""
        return f"{self.collection_path(namespace)}/{name}"


NAMESPACE = Kind("v1", "Namespace", "namespaces", namespaced=False)
SECRET = Kind("v1", "Secret", "secrets")
POD = Kind("v1", "Pod", "pods")
NODE = Kind("v1", "Node", "nodes", namespaced=False)
JOB = Kind("batch/v1", "Job", "jobs")
LOCAL_QUEUE = Kind("kueue.x-k8s.io/v1beta2", "LocalQueue", "localqueues")
WORKLOAD = Kind("kueue.x-k8s.io/v1beta2", "Workload", "workloads")
JOBSET = Kind("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets")
NETWORK_POLICY = Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
#: An inference server of a deployment (serving/runtime/kubernetes.py).
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
SERVICE = Kind("v1", "Service", "services")

KINDS = {kind.kind: kind for kind in (NAMESPACE, SECRET, POD, NODE, JOB, LOCAL_QUEUE, WORKLOAD, JOBSET, NETWORK_POLICY, DEPLOYMENT, SERVICE)}


def kind_of(obj: dict) -> Kind:
    """Return the Kind of a manifest (by its ``kind``); raise KeyError for one Lab does not use."""
    return KINDS[obj["kind"]]
