"""The Kubernetes sandbox pool on the fake cluster (``FakeGateway`` with its ReplicaSets on),
its pods' agents real processes on this machine (docs/kubernetes.md "Sandbox pool").

``PoolCluster`` applies the pool's Deployment from k8s/sandbox-pool/pool.yaml (so the labels
Lab claims by are the manifest's), makes its pending pods Ready at the address of a free agent,
and is what ``LAB_SANDBOX_POOL_CLUSTER`` names in tests (``pods_of``)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from jobs.launchers.kubernetes.sandbox_pods import GatewayPods
from tests.support.fake_gateway import FakeGateway
from tests.support.sandbox_agent import RunningAgent

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "lab-sandboxes"
DEPLOYMENT = "lab-sandbox-pool-python-3-11"
#: What ``LAB_SANDBOX_POOL_CLUSTER`` names in tests.
CLUSTER_PATH = "tests.support.sandbox_pool.pods_of"

_current: FakeGateway | None = None


def pool_manifests() -> list[dict]:
    """Return the objects of k8s/sandbox-pool/pool.yaml."""
    return [doc for doc in yaml.safe_load_all((ROOT / "k8s/sandbox-pool/pool.yaml").read_text()) if doc]


class PoolCluster:
    """A fake cluster running the pool's Deployment with ``replicas`` pods; ``agents`` are the
    local agents its pods may point at (a pod takes one no other live pod uses)."""

    def __init__(self, agents: list[RunningAgent], *, replicas: int = 2) -> None:
        global _current
        self.gateway = FakeGateway()
        self.gateway.replica_sets = True
        self.agents = agents
        deployment = copy.deepcopy(next(obj for obj in pool_manifests() if obj["kind"] == "Deployment"))
        deployment["spec"]["replicas"] = replicas
        self.gateway.apply(deployment)
        _current = self.gateway

    def pods(self) -> list[dict]:
        """Return the stored pods of the namespace (not copies), oldest first."""
        return sorted((obj for (kind, namespace, _), obj in self.gateway.objects.items() if kind == "Pod" and namespace == NAMESPACE),
                      key=lambda pod: int(pod["metadata"]["uid"].split("-")[1]))

    def warm(self) -> list[dict]:
        """Return the pods the Deployment owns (warm, Ready or not)."""
        return self.gateway.deployment_pods(NAMESPACE, DEPLOYMENT)

    def ready_all(self) -> list[str]:
        """Make the pending pods Ready, each at the address of an agent no live pod uses, while
        there are such agents; return their names."""
        names = []
        for pod in self.pods():
            if pod["status"].get("phase") == "Pending":
                if (agent := self.free_agent()) is None:
                    break
                self.gateway.ready_pod(NAMESPACE, pod["metadata"]["name"], ip="127.0.0.1", port=port_of(agent))
                names.append(pod["metadata"]["name"])
        return names

    def free_agent(self) -> RunningAgent | None:
        """Return an agent no live pod points at (None when every one is taken)."""
        used = {pod["spec"]["containers"][0]["ports"][0]["containerPort"] for pod in self.pods()
                if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")}
        return next((agent for agent in self.agents if port_of(agent) not in used), None)

    def agent_of(self, pod_name: str) -> RunningAgent:
        port = self.gateway.objects[("Pod", NAMESPACE, pod_name)]["spec"]["containers"][0]["ports"][0]["containerPort"]
        return next(agent for agent in self.agents if port_of(agent) == port)


def port_of(agent: RunningAgent) -> int:
    return int(agent.url.rsplit(":", 1)[1])


def pods_of(namespace: str) -> GatewayPods:
    """The pool's pods on the fake cluster made last (what ``LAB_SANDBOX_POOL_CLUSTER`` names)."""
    assert _current is not None, "no PoolCluster was made"
    return GatewayPods(_current, namespace=namespace)
