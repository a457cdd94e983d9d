"""``SandboxPool``: sandboxes on a warm pool of pods, each pod running Lab's sandbox agent
(``sandboxes.agent``) and holding one sandbox (docs/kubernetes.md "Sandbox pool").

A Deployment per image keeps its pods warm: its selector is ``lab.dev/sandbox-pool=<pool>`` and
``lab.dev/sandbox-state=warm`` (k8s/base/sandbox-pool.yaml). Creating a sandbox claims one Ready
warm pod by relabelling it ``claimed`` (with the sandbox's id) in a merge patch that names the
``resourceVersion`` it was read at: the API server refuses the patch (409) when another claim
changed the pod first, and the claim tries the next pod, so two creates never get one pod. A
claimed pod no longer matches the selector: its ReplicaSet lets it go and starts a warm pod in its
place. No pod is created on the hot path, only one list and one patch. Deleting the sandbox
deletes its pod. The pool sees plain values and a ``PodCluster``, never Lab's models; the cluster
is Lab's gateway (``jobs.launchers.kubernetes.sandbox_pods``) or a fake in tests.
"""

from __future__ import annotations

import abc
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sandboxes.runtime.base import RuntimeRefusal, SandboxSpec

#: The labels of a pool's pods: which pool, ``warm`` or ``claimed``, and the sandbox a claimed one holds.
POOL_LABEL = "lab.dev/sandbox-pool"
STATE_LABEL = "lab.dev/sandbox-state"
SANDBOX_LABEL = "lab.dev/sandbox"
WARM = "warm"
CLAIMED = "claimed"
#: The annotations a claim leaves: when (unix seconds) and how often the pod's containers had
#: restarted then (a restart since means the agent lost the sandbox).
CLAIMED_AT = "lab.dev/claimed-at"
RESTARTS_AT_CLAIM = "lab.dev/restarts-at-claim"
#: The name of the agent container's port.
AGENT_PORT = "agent"
#: What the pool's name of an image's pool for sandboxes with ``network: egress`` ends with
#: (``python:3.11+egress``): those need a pool whose NetworkPolicy lets them out.
EGRESS_SUFFIX = "+egress"
#: Kubernetes quantity suffixes (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/).
_SUFFIXES = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
#: The sandboxes' gigabyte (``sandboxes.runtime.local.GIGABYTE``).
GIGABYTE = 1024**3


class PodConflict(Exception):
    """The pod changed (or went) since it was read: another claim got it first."""


class PodCluster(abc.ABC):
    """The pods of the pool's namespace, in the API's JSON shape."""

    @abc.abstractmethod
    def pods(self, labels: Mapping[str, str]) -> list[dict]:
        """Return the pods carrying every label of ``labels``; RuntimeRefusal
        ``cluster_unavailable`` when the API cannot be asked."""

    @abc.abstractmethod
    def relabel(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str], *,
                resource_version: str) -> dict:
        """Set ``labels`` and ``annotations`` on pod ``name`` if it is still at
        ``resource_version``; return it as stored. PodConflict when it is not (or is gone);
        RuntimeRefusal ``cluster_unavailable``."""

    @abc.abstractmethod
    def delete(self, name: str) -> bool:
        """Delete pod ``name``; return False when it was gone already."""


@dataclass(frozen=True)
class PoolPod:
    """A pod of the pool as the pool reads it: its ``name``, ``resource_version``, labels and
    annotations, whether it is Ready, whether it is ending (deleted, or its containers exited),
    how often its containers restarted, its agent's URL (``http://<pod IP>:<agent port>``,
    empty before it has an IP), its first container's limits, and its ``uid`` (the identity its
    agent's key is derived from, ``sandboxes.agent.tokens.agent_key``)."""

    name: str
    resource_version: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    ready: bool
    ending: bool
    restarts: int
    agent_url: str
    cpu_cores: float | None = None
    memory_gb: float | None = None
    uid: str = ""

    def fits(self, spec: SandboxSpec) -> bool:
        """Whether the pod's limits (its first container's; none set: any) hold ``spec``'s cores and memory."""
        return (self.cpu_cores is None or spec.cpu_cores <= self.cpu_cores) and (
            self.memory_gb is None or spec.memory_gb <= self.memory_gb)

    @property
    def lost_its_sandbox(self) -> bool:
        """Whether a claimed pod can no longer hold its sandbox: it is ending, or its agent
        restarted since the claim."""
        return self.ending or self.restarts > int(self.annotations.get(RESTARTS_AT_CLAIM, "0") or 0)

    @property
    def claimed_at(self) -> float:
        """Return when the pod was claimed (unix seconds; 0 for a warm one)."""
        return float(self.annotations.get(CLAIMED_AT, "0") or 0)

    @property
    def sandbox_id(self) -> str:
        """Return the id of the sandbox a claimed pod holds ("" for a warm one)."""
        return self.labels.get(SANDBOX_LABEL, "")


def pool_pod(pod: dict) -> PoolPod:
    """Return what the pool needs of ``pod`` (a Pod in the API's JSON shape)."""
    metadata, status = pod["metadata"], pod.get("status") or {}
    conditions = {item.get("type"): item.get("status") for item in status.get("conditions") or []}
    ip = status.get("podIP") or ""
    ports = [port for container in pod["spec"]["containers"] for port in container.get("ports") or []]
    port = next((item["containerPort"] for item in ports if item.get("name") == AGENT_PORT), None) or (
        ports[0]["containerPort"] if ports else 8765)
    host = f"[{ip}]" if ":" in ip else ip
    limits = (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}
    return PoolPod(
        name=metadata["name"], resource_version=str(metadata.get("resourceVersion", "")),
        labels=dict(metadata.get("labels") or {}), annotations=dict(metadata.get("annotations") or {}),
        ready=status.get("phase") == "Running" and conditions.get("Ready") == "True",
        ending=bool(metadata.get("deletionTimestamp")) or status.get("phase") in ("Succeeded", "Failed"),
        restarts=sum(int(item.get("restartCount") or 0) for item in status.get("containerStatuses") or []),
        agent_url=f"http://{host}:{port}" if ip else "",
        cpu_cores=quantity(limits["cpu"]) if "cpu" in limits else None,
        memory_gb=quantity(limits["memory"]) / GIGABYTE if "memory" in limits else None,
        uid=str(metadata.get("uid") or ""),
    )


def quantity(value: str | int | float) -> float:
    """Return a Kubernetes quantity (``"500m"``, ``"2"``, ``"2Gi"``) as a number of its unit."""
    text = str(value)
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _SUFFIXES[suffix]
    return float(text)


class SandboxPool:
    """The warm pools of ``cluster``: ``pools`` maps each image to its pool's name (the value of
    ``lab.dev/sandbox-pool``). A claim finding no Ready warm pod looks again every ``poll_s`` for
    up to ``wait_s`` seconds, then is refused (RuntimeRefusal ``sandbox_capacity``)."""

    def __init__(self, cluster: PodCluster, *, pools: Mapping[str, str], wait_s: float = 0.0, poll_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 shuffle: Callable[[list], None] = random.shuffle, now: Callable[[], float] = time.time) -> None:
        self.cluster, self.pools = cluster, dict(pools)
        self.wait_s, self.poll_s = wait_s, poll_s
        self._clock, self._sleep, self._shuffle, self._now = clock, sleep, shuffle, now

    def claim(self, spec: SandboxSpec) -> PoolPod:
        """Claim a Ready warm pod for the sandbox ``spec`` and return it (claimed): one of the pool
        of its image (``<image>+egress`` for a sandbox with ``network: egress``) whose limits hold
        its cores and memory. Warm pods are tried in random order, so concurrent claims rarely
        race for one; a lost race (PodConflict) tries the next. RuntimeRefusal
        ``sandbox_capacity`` when none is left within ``wait_s``, ``no_pool`` when no pool runs
        such sandboxes, ``too_large`` when the pool's pods are smaller than the sandbox."""
        key = spec.image + (EGRESS_SUFFIX if spec.network == "egress" else "")
        pool = self.pools.get(key)
        if pool is None:
            raise RuntimeRefusal("no_pool", f"No sandbox pool runs {key!r} (LAB_SANDBOX_POOL_IMAGES).")
        deadline = self._clock() + self.wait_s
        while True:
            listed = [pod for pod in map(pool_pod, self.cluster.pods({POOL_LABEL: pool, STATE_LABEL: WARM}))
                      if pod.ready and not pod.ending and pod.agent_url]
            warm = [pod for pod in listed if pod.fits(spec)]
            if listed and not warm:
                largest = listed[0]
                raise RuntimeRefusal("too_large", f"A sandbox of pool {pool!r} may have at most {largest.cpu_cores} cores "
                                                  f"and {largest.memory_gb:g} GB (its pods' limits).")
            self._shuffle(warm)
            for pod in warm:
                annotations = {CLAIMED_AT: str(int(self._now())), RESTARTS_AT_CLAIM: str(pod.restarts)}
                try:
                    claimed = self.cluster.relabel(pod.name, {STATE_LABEL: CLAIMED, SANDBOX_LABEL: spec.sandbox_id},
                                                   annotations, resource_version=pod.resource_version)
                except PodConflict:
                    continue
                return pool_pod(claimed)
            if self._clock() >= deadline:
                raise RuntimeRefusal("sandbox_capacity", f"Every warm sandbox pod of pool {pool!r} is taken; try again shortly.")
            self._sleep(self.poll_s)

    def claimed(self) -> dict[str, PoolPod]:
        """Return the claimed pods of every pool by the id of the sandbox each holds (the ending
        ones too)."""
        return {pod.sandbox_id: pod for pod in map(pool_pod, self.cluster.pods({STATE_LABEL: CLAIMED})) if pod.sandbox_id}

    def release(self, pod_name: str) -> bool:
        """Delete the claimed pod ``pod_name`` (its sandbox ended); return False when it was gone."""
        return self.cluster.delete(pod_name)
