"""The Kubernetes launcher: each attempt is a Kueue-queued JobSet (``jobs.launchers.kubernetes.objects``).

``launch`` builds the attempt's JobSet (raising SplitUnavailable, before creating anything, for
a split attempt on a pool without a shared volume: the reconciler fails the job with
``internal_error`` naming the setting), makes sure the organization's namespace, LocalQueue and
default-deny NetworkPolicy exist, creates the suspended JobSet, then its NetworkPolicy and last
its Secret, both owned by it; each create that finds its object already there (409) counts as
done, so a repeated launch (a retried task, a worker that died after creating) makes nothing
twice. The Secret comes last because the engine container cannot start without it: a pod never
runs before its attempt's NetworkPolicy exists. ``observe_many`` reads the watch cache (``cache``), never one request per job;
while the cache is not in sync with the API (an outage) it raises ``ClusterUnavailable``, so the
reconciler leaves every job as it is until the API answers again. ``cancel`` deletes the
attempt's pods (the kubelet sends SIGTERM and the engine checkpoints and exits 3; ``force``
deletes with no grace); a JobSet still waiting in Kueue has no pods and is deleted instead.
``cleanup`` deletes the JobSet (Background propagation: Jobs, pods, the NetworkPolicy and the
Secret follow).
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timedelta, timezone

from engine.egress import origin_of
from jobs.launchers.base import AttemptPhase, Launcher, LaunchRequest, Observation, QueuePlaces, judge_urls
from jobs.launchers.kubernetes.cache import ClusterCache, GroupObjects, WatchSpec
from jobs.launchers.kubernetes.gateway import ClusterGateway, ClusterUnavailable
from jobs.launchers.kubernetes.kinds import JOB, JOBSET, NODE, POD, WORKLOAD
from jobs.launchers.kubernetes.objects import (
    CLUSTER_QUEUE,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    JOB_LABEL,
    MANAGED_BY_LABEL,
    PoolSettings,
    default_deny_object,
    jobset_object,
    judge_egress_rule,
    local_queue_object,
    namespace_object,
    network_policy_object,
    secret_object,
)
from jobs.launchers.kubernetes.status import observe_attempt, parse_time
from lab.lib.http import UnsafeURL, check_url, checked_addresses

logger = logging.getLogger(__name__)

#: What the cache watches: Kueue's Workloads (no label of Lab's: matched to JobSets by owner),
#: and the Jobs, pods and JobSets Lab labels. The JobSets come last, so a first round ends with
#: a complete picture of them.
WATCHES = [
    WatchSpec(WORKLOAD),
    WatchSpec(JOB, JOB_LABEL),
    WatchSpec(POD, JOB_LABEL),
    WatchSpec(JOBSET, f"{MANAGED_BY_LABEL}=lab"),
]
#: Handle keys: the uid of the pod that opened the attempt (``jobs.readmission``), and the
#: time from which the JobSet's pods are this attempt's (after a readmission by Kueue).
POD_UID_KEY = "pod_uid"
PODS_SINCE_KEY = "pods_since"
#: A JobSet of no live attempt is an orphan only once it is this old (a launch records its
#: handle just after creating it).
ORPHAN_AFTER = timedelta(minutes=10)


class KubernetesLauncher(Launcher):
    """Runs attempts as JobSets through ``gateway``; observes them through a watch cache.

    With ``background`` the cache runs in daemon threads (a long-lived worker) and
    ``observe_many`` waits up to ``sync_timeout_s`` for its first listing; without, every
    ``observe_many`` first runs one synchronous list/watch round (tests, benchmarks).
    """

    name = "kubernetes"

    def __init__(self, *, gateway: ClusterGateway, settings: PoolSettings, background: bool = True,
                 sync_timeout_s: float = 30.0, clock=lambda: datetime.now(timezone.utc)):
        self.gateway = gateway
        self.settings = settings
        self.cache = ClusterCache(gateway, WATCHES)
        self.background = background
        self.sync_timeout_s = sync_timeout_s
        self._clock = clock
        self._ready_namespaces: set[str] = set()

    # --- launching ----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> dict:
        if request.resume_archive is not None and request.resume_checkpoint_id is None:
            raise RuntimeError("the Kubernetes pool resumes from object storage: set LAB_STORAGE_URL=s3://...")
        manifest = jobset_object(request, self.settings)  # before any create: a spec this pool cannot run makes nothing
        judges = self._judge_egress(request)  # likewise: a judge at a refused address makes nothing
        self._ensure_namespace(request.namespace, "" if self.settings.shared_namespace else request.organization)
        jobset = self.gateway.apply(manifest)
        # The Secret last: its pods' container cannot start before it exists, so none runs
        # before the policy that confines it does.
        self.gateway.apply(network_policy_object(request, self.settings, owner=jobset, judges=judges))
        self.gateway.apply(secret_object(request, owner=jobset))
        self.cache.remember(jobset)
        return {
            "namespace": request.namespace,
            "jobset": jobset["metadata"]["name"],
            "launched_at": self._clock().isoformat(),
        }

    def _judge_egress(self, request: LaunchRequest) -> list[dict]:
        """Return the NetworkPolicy egress rules of the judge endpoints the job declares
        (``judge_urls``): each one's port on every address its host resolves to now, each address
        checked as a local teacher's relay is (``lab.lib.http``: no private, loopback or link-local
        address unless the pool's ``allow_private_egress``). Lab's own origin (a deployment as the judge) is
        allowed by ``engine_egress`` already. Raises ``UnsafeURL`` for a refused or unresolvable host."""
        rules = []
        for url in judge_urls(request.spec):
            if origin_of(url) == origin_of(request.lab_url):
                continue
            target = check_url(url, allow_private=self.settings.allow_private_egress, resolve=False)
            host = target.raw_host.decode("ascii")
            port = target.port or (443 if target.scheme == "https" else 80)
            try:
                addresses = checked_addresses(host, port, allow_private=self.settings.allow_private_egress)
            except OSError:
                raise UnsafeURL("unresolvable_host", f"{host} does not resolve.") from None
            rules.append(judge_egress_rule([str(address) for address in dict.fromkeys(addresses)], port))
        return rules

    def _ensure_namespace(self, namespace: str, organization: str) -> None:
        if namespace in self._ready_namespaces:
            return
        self.gateway.apply(namespace_object(namespace, organization))
        self.gateway.apply(local_queue_object(namespace))
        self.gateway.apply(default_deny_object(namespace))
        self._ready_namespaces.add(namespace)

    # --- observing ----------------------------------------------------------------------------

    def _catch_up(self) -> None:
        if self.background:
            self.cache.start()
            if not self.cache.wait_synced(self.sync_timeout_s):
                raise ClusterUnavailable(0, "the cluster watch is not in sync")
        else:
            self.cache.sync()

    def observe(self, handle: dict) -> Observation:
        return self.observe_many([handle])[0]

    def observe_many(self, handles: list[dict]) -> list[Observation]:
        self._catch_up()
        now = self._clock()
        observations = []
        for handle in handles:
            if "jobset" not in handle:
                observations.append(Observation(AttemptPhase.LOST, detail="not a Kubernetes attempt"))
                continue
            group = self._attempt_group(handle)
            launched_at = parse_time(handle.get("launched_at")) or now
            deleted = group.jobset is None and self.cache.was_deleted(handle["namespace"], handle["jobset"])
            observations.append(observe_attempt(group, launched_at=launched_at, now=now, deleted=deleted,
                                                opened_by=handle.get(POD_UID_KEY, "")))
        return observations

    def _attempt_group(self, handle: dict) -> GroupObjects:
        """Return the cache's group of ``handle``'s JobSet, without the pods of the admissions
        before it (created before ``pods_since``: a JobSet Kueue readmitted runs new pods)."""
        group = self.cache.group(handle["namespace"], handle["jobset"])
        since = parse_time(handle.get(PODS_SINCE_KEY))
        if since is not None:
            group.pods = {name: pod for name, pod in group.pods.items()
                          if (parse_time((pod.get("metadata") or {}).get("creationTimestamp")) or since) >= since}
        return group

    def handle_for_readmission(self, handle: dict) -> dict:
        """Return the handle the job's next attempt takes over in the same JobSet once Kueue
        readmits it: no pod owns it, and only pods created since the eviction (the Workload's
        ``Evicted`` condition's last transition, the cluster's clock) are the next attempt's."""
        group = self.cache.group(handle["namespace"], handle["jobset"])
        evicted = next((entry for entry in ((group.workload or {}).get("status") or {}).get("conditions") or []
                        if entry.get("type") == "Evicted"), {})
        kept = {key: value for key, value in handle.items() if key != POD_UID_KEY}
        if evicted.get("lastTransitionTime"):
            kept[PODS_SINCE_KEY] = evicted["lastTransitionTime"]
        return kept

    # --- the pool ---------------------------------------------------------------------------

    def pool_inventory(self) -> list[dict]:
        """Return the pool's node groups as the cluster's nodes say (one paged list of Nodes):
        ``[{"gpu_type", "gpus", "count", "product"}]``, one group per (GPU type, GPUs per node).

        A node's GPUs are its allocatable ``nvidia.com/gpu``; their type is the Lab GPU type whose
        product (``PoolSettings.gpu_products``) is the node's ``nvidia.com/gpu.product`` label
        (NVIDIA's GPU feature discovery), else that label itself. A node without GPUs counts as a
        ``cpu`` node. Raises ClusterUnavailable when the API does not answer.
        """
        types = {product: gpu_type for gpu_type, product in self.settings.gpu_products.items()}
        groups: Counter[tuple[str, int, str]] = Counter()
        for node in self.gateway.list(NODE).items:
            labels = (node.get("metadata") or {}).get("labels") or {}
            allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")
            try:
                gpus = int(str(allocatable))
            except ValueError:  # a quantity a device plugin never writes for whole devices
                gpus = 0
            product = labels.get(GPU_PRODUCT_LABEL, "")
            if gpus > 0 and product:
                groups[(types.get(product, product), gpus, product)] += 1
            else:
                groups[("cpu", 0, "")] += 1
        return [{"gpu_type": gpu_type, "gpus": gpus, "count": count, "product": product}
                for (gpu_type, gpus, product), count in sorted(groups.items())]

    def queue_places(self) -> QueuePlaces | None:
        """Return the 1-based place of each JobSet waiting in the ClusterQueue ``lab``, by
        ``(namespace, JobSet name)``, and how many workloads wait there, from Kueue's visibility
        API (one call, whatever the number of jobs); None when the API is not served."""
        items = self.gateway.pending_workloads(CLUSTER_QUEUE)
        if items is None:
            return None
        places: dict[tuple[str, str], int] = {}
        for item in items:
            metadata = item.get("metadata") or {}
            for owner in metadata.get("ownerReferences") or []:
                if owner.get("kind") == JOBSET.kind:
                    places[(metadata.get("namespace", ""), owner.get("name", ""))] = int(item.get("positionInClusterQueue") or 0) + 1
        return QueuePlaces(places=places, pending=len(items))

    # --- stopping -----------------------------------------------------------------------------

    def cancel(self, handle: dict, *, force: bool = False) -> None:
        if "jobset" not in handle:
            return
        group = self._attempt_group(handle)
        live = [name for name, pod in group.pods.items() if (pod.get("status") or {}).get("phase") in (None, "Pending", "Running")]
        if not live:  # still queued in Kueue, or its pods already ended: nothing to stop gracefully
            self.gateway.delete(JOBSET, handle["jobset"], handle["namespace"])
            return
        for name in live:
            self.gateway.delete(POD, name, handle["namespace"], grace_period_s=0 if force else None)

    def cleanup(self, handle: dict) -> None:
        if "jobset" in handle:
            self.gateway.delete(JOBSET, handle["jobset"], handle["namespace"])

    def sweep_orphans(self, live_handles: list[dict]) -> list[str]:
        """Delete Lab's JobSets that belong to no live attempt and are older than ORPHAN_AFTER;
        nothing while the cache is out of sync."""
        if not self.cache.synced:
            return []
        live = {(handle.get("namespace"), handle.get("jobset")) for handle in live_handles}
        now = self._clock()
        ended = []
        for namespace, name, created in self.cache.jobsets():
            created_at = parse_time(created)
            if (namespace, name) in live or created_at is None or now - created_at < ORPHAN_AFTER:
                continue
            if self.gateway.delete(JOBSET, name, namespace):
                ended.append(f"{namespace}/{name}")
        return ended
