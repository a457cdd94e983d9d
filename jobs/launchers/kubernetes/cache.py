"""What the cluster holds of Lab's attempts, kept by list-then-watch (the informer pattern).

For each watched kind the cache lists once, then watches from the list's ``resourceVersion``,
applying each event to its store; on 410 Gone it lists again, and every ``resync_s`` it lists
again anyway (a full resync heals anything a watch missed). Objects are grouped by the JobSet
they belong to, ``(namespace, jobset name)``, so observing 1,000 attempts reads 1,000 groups,
not the API. ``sync`` runs one round synchronously (tests, benchmarks); ``start`` runs each kind
in a daemon thread for a long-lived worker.

A pod deleted after its containers ended is kept in its group until the JobSet goes, so the
exit code of an attempt whose pod was deleted (a stop Lab asked for) can still be read.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from labsdk.retry import exponential_backoff

from jobs.launchers.kubernetes.gateway import ClusterError, ClusterGateway, ResourceVersionGone
from jobs.launchers.kubernetes.kinds import JOB, JOBSET, POD, WORKLOAD, Kind

logger = logging.getLogger(__name__)

#: Label the JobSet controller puts on the Jobs and pods it creates (jobset.x-k8s.io API).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"

Group = tuple[str, str]  # (namespace, jobset name)
#: JobSets seen deleted that the cache remembers (oldest forgotten first).
TOMBSTONES = 10_000


def jobset_group(obj: dict) -> Group | None:
    """Return the JobSet group of a JobSet, Workload, Job or pod, or None when it has none.

    A JobSet is its own group; Kueue's Workload names its JobSet in ``ownerReferences``; the
    JobSet's Jobs and pods carry ``jobset.sigs.k8s.io/jobset-name``.
    """
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace", "")
    kind = obj.get("kind")
    if kind == JOBSET.kind:
        return namespace, metadata.get("name", "")
    if kind == WORKLOAD.kind:
        for owner in metadata.get("ownerReferences") or []:
            if owner.get("kind") == JOBSET.kind:
                return namespace, owner.get("name", "")
        return None
    name = (metadata.get("labels") or {}).get(JOBSET_NAME_LABEL)
    return (namespace, name) if name else None


@dataclass(frozen=True)
class WatchSpec:
    """One kind to keep, optionally narrowed by a label selector."""

    kind: Kind
    label_selector: str = ""


@dataclass
class GroupObjects:
    """The objects of one JobSet group now."""

    jobset: dict | None = None
    workload: dict | None = None
    jobs: dict[str, dict] = field(default_factory=dict)
    pods: dict[str, dict] = field(default_factory=dict)


def _pod_ended(pod: dict) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("terminated" in (status.get("state") or {}) for status in statuses)


class ClusterCache:
    """The watched kinds' objects by JobSet group, fed by ``gateway``'s list and watch."""

    def __init__(self, gateway: ClusterGateway, watches: list[WatchSpec], *, resync_s: float = 300.0,
                 watch_timeout_s: int = 60, clock: Callable[[], float] = time.monotonic):
        self.gateway = gateway
        self.watches = watches
        self.resync_s, self.watch_timeout_s = resync_s, watch_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[Group, GroupObjects] = defaultdict(GroupObjects)
        self._gone: OrderedDict[Group, None] = OrderedDict()
        self._remembered: dict[Group, tuple[float, dict]] = {}  # JobSets Lab created: when, what
        self._resource_version: dict[str, str] = {}
        self._listed_at: dict[str, float] = {}
        #: The last failure of each kind's list or watch (None once it works again).
        self.errors: dict[str, Exception | None] = {}
        self.lists = 0  # how many lists were made (first ones, relists after 410 and resyncs)
        self._threads: list[threading.Thread] = []
        self._threads_pid = 0
        self._stop = threading.Event()

    # --- reading ----------------------------------------------------------------------------

    def group(self, namespace: str, jobset_name: str) -> GroupObjects:
        """Return a copy of what the cache holds of one JobSet group (empty when nothing)."""
        with self._lock:
            found = self._groups.get((namespace, jobset_name))
            if found is None:
                return GroupObjects()
            return GroupObjects(found.jobset, found.workload, dict(found.jobs), dict(found.pods))

    def was_deleted(self, namespace: str, jobset_name: str) -> bool:
        """Whether the cache saw this JobSet and then saw it go (a DELETED event, or missing from a relist)."""
        with self._lock:
            return (namespace, jobset_name) in self._gone

    def jobsets(self) -> list[tuple[str, str, str]]:
        """Return ``(namespace, name, creationTimestamp)`` of every JobSet in the cache."""
        with self._lock:
            return [(namespace, name, (group.jobset["metadata"].get("creationTimestamp") or ""))
                    for (namespace, name), group in self._groups.items() if group.jobset is not None]

    @property
    def synced(self) -> bool:
        """Whether every kind has been listed and its last list or watch worked."""
        return all(spec.kind.kind in self._resource_version and not self.errors.get(spec.kind.kind)
                   for spec in self.watches)

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for ``synced``; return it."""
        deadline = self._clock() + timeout_s
        while not self.synced and self._clock() < deadline:
            time.sleep(0.05)
        return self.synced

    def remember(self, obj: dict) -> None:
        """Put an object Lab has just created into the cache before its watch event arrives (a
        JobSet listing already under way when it was created keeps it too)."""
        with self._lock:
            self._put(obj)
            if obj.get("kind") == JOBSET.kind:
                self._remembered[jobset_group(obj)] = (self._clock(), obj)

    # --- feeding ----------------------------------------------------------------------------

    def sync(self) -> None:
        """Run one round for every kind: list when needed, then watch until the server ends
        the stream. Raise the first kind's ClusterError after trying all of them."""
        failure: ClusterError | None = None
        for spec in self.watches:
            try:
                self._round(spec)
            except ClusterError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def start(self) -> None:
        """Keep every kind current in its own daemon thread (idempotent per process: a forked
        child, e.g. a prefork Celery worker, starts its own, since threads do not survive a fork)."""
        if self._threads and self._threads_pid == os.getpid():
            return
        self._threads, self._threads_pid = [], os.getpid()
        for spec in self.watches:
            thread = threading.Thread(target=self._run, args=(spec,), name=f"lab-watch-{spec.kind.plural}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, *, wait_s: float = 0.0) -> None:
        """Ask the threads to stop after their current watch; wait up to ``wait_s`` seconds for them."""
        self._stop.set()
        deadline = time.monotonic() + wait_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, spec: WatchSpec) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._round(spec)
                failures = 0
            except ClusterError:
                failures += 1
                self._stop.wait(exponential_backoff(failures, base=0.5, cap=30.0))
            except Exception:  # a bug must not end the thread silently: log and go on
                logger.exception("watch thread failed", extra={"kind": spec.kind.kind})
                self._stop.wait(5.0)

    def _round(self, spec: WatchSpec) -> None:
        name = spec.kind.kind
        try:
            due = self._clock() - self._listed_at.get(name, float("-inf")) >= self.resync_s
            if name not in self._resource_version or due:
                self._relist(spec)
            try:
                self._watch(spec)
            except ResourceVersionGone:
                self._relist(spec)
                self._watch(spec)
        except ClusterError as exc:
            self.errors[name] = exc
            logger.warning("cluster %s watch failed: %s", name, exc)
            raise
        self.errors[name] = None

    def _relist(self, spec: WatchSpec) -> None:
        started = self._clock()
        listing = self.gateway.list(spec.kind, label_selector=spec.label_selector)
        with self._lock:
            self.lists += 1
            # JobSets created while the list was under way may be missing from it: not gone.
            fresh = {key: obj for key, (at, obj) in self._remembered.items() if at >= started}
            if spec.kind is JOBSET:
                self._remembered = {key: self._remembered[key] for key in fresh}
                listed = {jobset_group(obj) for obj in listing.items}
                for key, group in self._groups.items():
                    if group.jobset is not None and key not in listed and key not in fresh:
                        self._bury(key)
            for group in self._groups.values():
                self._clear_kind(group, spec.kind.kind)
            for obj in listing.items:
                obj.setdefault("kind", spec.kind.kind)
                self._put(obj)
            if spec.kind is JOBSET:
                for key, obj in fresh.items():
                    if self._groups[key].jobset is None:
                        self._put(obj)
            self._drop_empty(without_jobset=spec.kind is JOBSET)
            self._resource_version[spec.kind.kind] = listing.resource_version
            self._listed_at[spec.kind.kind] = self._clock()

    def _watch(self, spec: WatchSpec) -> None:
        name = spec.kind.kind
        for event in self.gateway.watch(spec.kind, resource_version=self._resource_version[name],
                                        label_selector=spec.label_selector, timeout_s=self.watch_timeout_s):
            obj = event.object
            version = (obj.get("metadata") or {}).get("resourceVersion")
            with self._lock:
                if event.type != "BOOKMARK":
                    obj.setdefault("kind", name)
                    if event.type == "DELETED":
                        self._remove(obj)
                    else:
                        self._put(obj)
                if version:
                    self._resource_version[name] = version
            if self._stop.is_set():
                return

    # --- the store (caller holds the lock) ----------------------------------------------------

    def _put(self, obj: dict) -> None:
        group_key = jobset_group(obj)
        if group_key is None:
            return
        group = self._groups[group_key]
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == JOBSET.kind:
            group.jobset = obj
            self._gone.pop(group_key, None)
        elif kind == WORKLOAD.kind:
            group.workload = obj
        elif kind == JOB.kind:
            group.jobs[name] = obj
        elif kind == POD.kind:
            group.pods[name] = obj

    def _remove(self, obj: dict) -> None:
        group_key = jobset_group(obj)
        group = self._groups.get(group_key) if group_key else None
        if group is None:
            return
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == JOBSET.kind:
            del self._groups[group_key]  # its dependents go with it (Background propagation)
            self._bury(group_key)
        elif kind == WORKLOAD.kind:
            group.workload = None
        elif kind == JOB.kind:
            group.jobs.pop(name, None)
        elif kind == POD.kind:
            if _pod_ended(obj):
                group.pods[name] = obj  # its final state: how its container ended
            else:
                group.pods.pop(name, None)

    def _bury(self, key: Group) -> None:
        self._gone[key] = None
        self._gone.move_to_end(key)
        while len(self._gone) > TOMBSTONES:
            self._gone.popitem(last=False)

    @staticmethod
    def _clear_kind(group: GroupObjects, kind: str) -> None:
        if kind == JOBSET.kind:
            group.jobset = None
        elif kind == WORKLOAD.kind:
            group.workload = None
        elif kind == JOB.kind:
            group.jobs.clear()
        elif kind == POD.kind:
            group.pods = {name: pod for name, pod in group.pods.items() if _pod_ended(pod)}

    def _drop_empty(self, *, without_jobset: bool) -> None:
        """Drop groups left empty; after a JobSet listing, every group whose JobSet is gone."""
        for key in [key for key, group in self._groups.items() if group.jobset is None and (
                without_jobset or not (group.workload or group.jobs or group.pods))]:
            del self._groups[key]
