"""The Kubernetes sandbox pool on the fake cluster (``FakeGateway`` with its ReplicaSets on),
its pods' agents real processes on this machine (docs/kubernetes.md "Sandbox pool").

``PoolCluster`` applies the pool's Deployment from k8s/sandbox-pool/pool.yaml (so the labels
Lab claims by are the manifest's), plays the kubelet for its pending pods: starts a real agent
for each with the key the pod's init container writes (``sandboxes.agent.pod_key``: Lab's secret
and the pod's uid) and makes the pod Ready at that agent's address; and is what
``LAB_SANDBOX_POOL_CLUSTER`` names in tests (``pods_of``)."""

from __future__ import annotations

import copy
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from jobs.launchers.kubernetes.sandbox_pods import GatewayPods
from sandboxes.agent import tokens
from tests.support.fake_gateway import FakeGateway
from tests.support.sandbox_agent import RunningAgent, start_agent

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
    """A fake cluster running the pool's Deployment with ``replicas`` pods, Lab's secret
    ``secret`` (its pods' keys are derived from it), and at most ``max_agents`` agents running
    for its live pods at once (each holds one of the machine's few uid blocks)."""

    def __init__(self, *, secret: str = "", replicas: int = 2, max_agents: int = 3) -> None:
        global _current
        self.gateway = FakeGateway()
        self.gateway.replica_sets = True
        self.secret = secret or secrets.token_hex(32)
        self.max_agents = max_agents
        #: The agent of each pod made Ready, by pod name.
        self.agents: dict[str, RunningAgent] = {}
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

    def key_of(self, pod: dict) -> str:
        """Return the key the init container of ``pod`` writes for its agent."""
        return tokens.agent_key(self.secret.encode(), pod["metadata"]["uid"])

    def ready_all(self) -> list[str]:
        """Start an agent with its pod's key for each pending pod (while fewer than
        ``max_agents`` serve live pods; the agents of deleted pods are stopped) and make the pod
        Ready at its address; return the pods' names."""
        live = set()
        for pod in self.pods():
            name = pod["metadata"]["name"]
            if name in self.agents and pod["metadata"].get("deletionTimestamp"):
                self._stop(self.agents.pop(name))
            elif name in self.agents:
                live.add(name)
        pending = [pod for pod in self.pods() if pod["status"].get("phase") == "Pending"]
        pending = pending[:max(0, self.max_agents - len(live))]
        with ThreadPoolExecutor(max_workers=max(1, len(pending))) as starting:
            started = list(starting.map(lambda pod: start_agent(warm=0, secret=self.key_of(pod)), pending))
        for pod, agent in zip(pending, started, strict=True):
            name = pod["metadata"]["name"]
            self.agents[name] = agent
            self.gateway.ready_pod(NAMESPACE, name, ip="127.0.0.1", port=port_of(agent))
        return [pod["metadata"]["name"] for pod in pending]

    def agent_of(self, pod_name: str) -> RunningAgent:
        """Return the agent of pod ``pod_name``."""
        return self.agents[pod_name]

    def close(self) -> None:
        """Stop every agent this cluster started and delete its folders."""
        for agent in self.agents.values():
            self._stop(agent)
        self.agents.clear()

    @staticmethod
    def _stop(agent: RunningAgent) -> None:
        agent.stop()
        shutil.rmtree(agent.root.parent, ignore_errors=True)


def port_of(agent: RunningAgent) -> int:
    return int(agent.url.rsplit(":", 1)[1])


def pods_of(namespace: str) -> GatewayPods:
    """The pool's pods on the fake cluster made last (what ``LAB_SANDBOX_POOL_CLUSTER`` names)."""
    assert _current is not None, "no PoolCluster was made"
    return GatewayPods(_current, namespace=namespace)
