"""An in-memory cluster behind the ``ClusterGateway`` interface, for launcher, reconciler and
benchmark runs without a cluster.

It keeps objects with increasing ``resourceVersion``s, answers label selectors, treats a
duplicate create as the real gateway does (the existing object, counted in ``conflicts``),
keeps a bounded event log per kind for watches (older versions are 410 Gone; each event's
object kept as the JSON text an API server sends, parsed for each watcher as the real gateway
parses a watch line, not deep-copied in Python at several times that cost), garbage-collects
dependents (``ownerReferences``) on delete, and plays the controllers Lab relies on: Kueue
(a Workload per suspended JobSet; ``admit``, ``evict``, ``mark_inadmissible``; its visibility
API's pending workloads) and JobSet/Job/
kubelet (``run``, ``exit``, ``oom``, ``image_pull_error``, ``unschedulable``). With
``replica_sets`` on, it plays a Deployment's ReplicaSet too: it keeps ``spec.replicas`` pods
matching the Deployment's selector (new ones ``Pending`` until ``ready_pod``), and releases a pod
that stops matching it (its ownerReference dropped), so a relabelled pod is replaced. ``patch`` is
a JSON merge patch, refused with 409 when it names a ``metadata.resourceVersion`` the object no
longer has, atomically (a lock), as the API server's optimistic concurrency. Faults are injected
per call with ``fail`` (status 410, 429, 500, or 0 for no answer at all).
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections import defaultdict, deque
from collections.abc import Iterator
from datetime import datetime, timedelta

from jobs.launchers.kubernetes.cache import JOBSET_NAME_LABEL
from jobs.launchers.kubernetes.gateway import (
    ClusterError,
    ClusterGateway,
    ClusterUnavailable,
    ObjectList,
    ResourceVersionGone,
    WatchEvent,
)
from jobs.launchers.kubernetes.kinds import DEPLOYMENT, JOB, JOBSET, POD, WORKLOAD, Kind, kind_of

TIME = "2026-12-01T12:00:00Z"
#: JobSet's label of a replicated job's Jobs and pods.
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
#: The WorkloadPriorityClasses' values (k8s/base/kueue.yaml), as Kueue copies them into a Workload.
PRIORITIES = {"lab-low": 100, "lab-normal": 500, "lab-high": 1000}


def matches(labels: dict, selector: str) -> bool:
    """Whether ``labels`` match a selector of ``key``, ``!key``, ``key=value``, ``key!=value``."""
    for term in filter(None, (part.strip() for part in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeGateway(ClusterGateway):
    """The cluster in a dict: ``objects[(kind, namespace, name)]``."""

    def __init__(self, *, history: int = 10_000):
        self.objects: dict[tuple[str, str, str], dict] = {}
        #: The keys of the objects that name each uid among their ownerReferences (for deletes).
        self._dependents: dict[str | None, set[tuple[str, str, str]]] = {}
        self._version = itertools.count(100)
        self.last_version = 99
        #: Per kind, ``(resourceVersion, event type, the object as JSON text)``.
        self.events: dict[str, deque[tuple[int, str, str]]] = defaultdict(lambda: deque(maxlen=history))
        self.compacted: dict[str, int] = defaultdict(int)  # newest version no longer in the log
        self.calls: list[tuple[str, str]] = []  # (call, kind)
        self.conflicts = 0
        self.deletes: list[tuple[str, str, int | None]] = []  # (kind, name, grace period) asked for
        self.faults: dict[str, list[int]] = defaultdict(list)
        self._uids = itertools.count(1)
        self._seconds = itertools.count(1)  # the cluster's clock: each reading is a second later
        self._admissions: dict[tuple[str, str], int] = defaultdict(int)
        self.visibility = True  # Kueue's visibility API is served
        self.replica_sets = False  # Deployments' ReplicaSets keep their pods (``_replicate``)
        self._lock = threading.RLock()  # a patch is checked and stored at once, as etcd does

    # --- faults -----------------------------------------------------------------------------

    def fail(self, call: str, status: int, times: int = 1) -> None:
        """Make the next ``times`` calls of ``call`` (apply, get, list, watch, delete) fail."""
        self.faults[call] += [status] * times

    def _fault(self, call: str, kind: Kind) -> None:
        self.calls.append((call, kind.kind))
        if self.faults[call]:
            status = self.faults[call].pop(0)
            if status == 410:
                raise ResourceVersionGone(410, "too old resource version")
            if status in (0, 429) or status >= 500:
                raise ClusterUnavailable(status, "injected")
            raise ClusterError(status, "injected")

    def compact(self, kind: Kind) -> None:
        """Forget ``kind``'s event log, as etcd compaction does: older watches get 410."""
        log = self.events[kind.kind]
        if log:
            self.compacted[kind.kind] = log[-1][0]
            log.clear()

    # --- the interface ------------------------------------------------------------------------

    def apply(self, obj: dict) -> dict:
        kind = kind_of(obj)
        self._fault("apply", kind)
        key = self._key(kind, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in self.objects:
            self.conflicts += 1
            return copy.deepcopy(self.objects[key])
        stored = copy.deepcopy(obj)
        stored["metadata"].setdefault("uid", f"uid-{next(self._uids)}")
        stored["metadata"]["creationTimestamp"] = TIME
        self._store(kind, stored, "ADDED")
        if kind is JOBSET and stored["spec"].get("suspend"):
            self._create_workload(stored)
        self._replicate()
        return copy.deepcopy(stored)

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict | None:
        self._fault("get", kind)
        found = self.objects.get(self._key(kind, namespace or "", name))
        return copy.deepcopy(found) if found else None

    def list(self, kind: Kind, *, namespace: str | None = None, label_selector: str = "") -> ObjectList:
        self._fault("list", kind)
        with self._lock:  # a patch of another thread never changes the dict under the listing
            items = [
                copy.deepcopy(obj) for (kind_name, obj_namespace, _), obj in sorted(self.objects.items())
                if kind_name == kind.kind and (not namespace or obj_namespace == namespace)
                and matches(obj["metadata"].get("labels") or {}, label_selector)
            ]
        return ObjectList(items=items, resource_version=str(self._current()))

    def watch(self, kind: Kind, *, resource_version: str, namespace: str | None = None, label_selector: str = "",
              timeout_s: int = 60) -> Iterator[WatchEvent]:
        """Yield the logged events after ``resource_version``, then end (as a server's timeout)."""
        self._fault("watch", kind)
        since = int(resource_version)
        if since < self.compacted[kind.kind]:
            raise ResourceVersionGone(410, f"too old resource version: {since}")
        newer = []
        for version, event_type, text in reversed(self.events[kind.kind]):  # from the newest: only what is new is read
            if version <= since:
                break
            newer.append((event_type, text))
        for event_type, text in reversed(newer):
            obj = json.loads(text)  # as the real gateway parses a watch line
            metadata = obj["metadata"]
            if namespace and metadata.get("namespace") != namespace:
                continue
            if matches(metadata.get("labels") or {}, label_selector):
                yield WatchEvent(event_type, obj)
            if self.faults["watch_midway"]:
                self.faults["watch_midway"].pop(0)
                raise ResourceVersionGone(410, "too old resource version")

    def patch(self, kind: Kind, name: str, namespace: str | None, patch: dict) -> dict:
        self._fault("patch", kind)
        with self._lock:
            key = self._key(kind, namespace or "", name)
            if key not in self.objects:
                raise ClusterError(404, f'{kind.plural} "{name}" not found')
            stored = self.objects[key]
            expected = (patch.get("metadata") or {}).get("resourceVersion")
            if expected is not None and expected != stored["metadata"]["resourceVersion"]:
                self.conflicts += 1
                raise ClusterError(409, f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been modified')
            merged = _merge(copy.deepcopy(stored), {**patch, "metadata": {
                key_: value for key_, value in (patch.get("metadata") or {}).items() if key_ != "resourceVersion"}})
            self._store(kind, merged, "MODIFIED")
            self._replicate()
            return copy.deepcopy(self.objects[key])

    def delete(self, kind: Kind, name: str, namespace: str | None = None, *, grace_period_s: int | None = None) -> bool:
        self._fault("delete", kind)
        with self._lock:
            key = self._key(kind, namespace or "", name)
            if key not in self.objects:
                return False
            self.deletes.append((kind.kind, name, grace_period_s))
            if kind is POD and grace_period_s != 0:  # the kubelet sends SIGTERM; the pod ends later (``exit``)
                pod = self.objects[key]
                pod["metadata"]["deletionTimestamp"] = TIME
                self._store(POD, pod, "MODIFIED")
            else:
                self._delete(key)
            self._replicate()
            return True

    def pending_workloads(self, cluster_queue: str, *, limit: int = 1000) -> list[dict] | None:
        """Kueue's visibility API: the Workloads not holding quota, by priority (high first), then
        creation (an evicted one keeps its place), as ``PendingWorkloadsSummary`` items; None
        while ``visibility`` is off (the API not served)."""
        self.calls.append(("pending_workloads", "PendingWorkloadsSummary"))
        if not self.visibility:
            return None
        pending = [obj for (kind, _, _), obj in self.objects.items() if kind == "Workload"
                   and not any(entry["type"] in ("QuotaReserved", "Finished") and entry["status"] == "True"
                               for entry in obj.get("status", {}).get("conditions") or [])]
        pending.sort(key=lambda obj: (-obj["spec"]["priority"], int(obj["metadata"]["uid"].split("-")[1])))
        items, per_queue = [], defaultdict(int)
        for position, obj in enumerate(pending[:limit]):
            queue = (obj["metadata"]["namespace"], obj["spec"]["queueName"])
            items.append({"metadata": {key: obj["metadata"][key] for key in ("name", "namespace", "ownerReferences")},
                          "priority": obj["spec"]["priority"], "localQueueName": queue[1],
                          "positionInClusterQueue": position, "positionInLocalQueue": per_queue[queue]})
            per_queue[queue] += 1
        return items

    # --- the controllers ----------------------------------------------------------------------

    def _replicate(self) -> None:
        """Play each Deployment's ReplicaSet (with ``replica_sets`` on): release the pods that no
        longer match its selector, and create pods from its template up to ``spec.replicas``,
        counting those not terminating."""
        if not self.replica_sets:
            return
        with self._lock:
            for (kind_name, namespace, name), deployment in list(self.objects.items()):
                if kind_name != "Deployment":
                    continue
                owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-rs",
                         "uid": f"rs-{deployment['metadata']['uid']}", "controller": True}
                selector = deployment["spec"]["selector"]["matchLabels"]
                live = 0
                for pod in self._owned_by_uid(POD, namespace, owner["uid"]):
                    labels = pod["metadata"].get("labels") or {}
                    if any(labels.get(key) != value for key, value in selector.items()):
                        pod["metadata"]["ownerReferences"] = [
                            ref for ref in pod["metadata"]["ownerReferences"] if ref["uid"] != owner["uid"]]
                        self._store(POD, pod, "MODIFIED")
                    elif not pod["metadata"].get("deletionTimestamp"):
                        live += 1
                template = deployment["spec"]["template"]
                for _ in range(int(deployment["spec"].get("replicas", 1)) - live):
                    pod = {
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": f"{name}-{next(self._uids)}", "namespace": namespace,
                                     "uid": f"uid-{next(self._uids)}", "creationTimestamp": self.now(),
                                     "labels": dict(template["metadata"].get("labels") or {}),
                                     "ownerReferences": [dict(owner)]},
                        "spec": copy.deepcopy(template["spec"]), "status": {"phase": "Pending"},
                    }
                    self._store(POD, pod, "ADDED")

    def _owned_by_uid(self, kind: Kind, namespace: str, uid: str) -> list[dict]:
        return [obj for (kind_name, obj_namespace, _), obj in list(self.objects.items())
                if kind_name == kind.kind and obj_namespace == namespace
                and any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])]

    def deployment_pods(self, namespace: str, name: str) -> list[dict]:
        """Return the stored pods (not copies) the Deployment ``name``'s ReplicaSet owns, oldest first."""
        uid = f"rs-{self.objects[(DEPLOYMENT.kind, namespace, name)]['metadata']['uid']}"
        return sorted(self._owned_by_uid(POD, namespace, uid), key=lambda pod: int(pod["metadata"]["uid"].split("-")[1]))

    def ready_pod(self, namespace: str, name: str, *, ip: str, port: int | None = None) -> dict:
        """The kubelet starts the pod ``name`` and its readiness probe passes: ``Running``, Ready,
        at ``ip``; ``port`` (when given) becomes its first container's first port, so that pods
        of one Deployment can point at agents on different local ports."""
        with self._lock:
            pod = self.objects[(POD.kind, namespace, name)]
            container = pod["spec"]["containers"][0]
            if port is not None:
                container["ports"] = [{**(container.get("ports") or [{}])[0], "containerPort": port}]
            pod["status"] = {
                "phase": "Running", "podIP": ip, "startTime": TIME,
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": container["name"], "ready": True, "restartCount": 0,
                                       "state": {"running": {"startedAt": TIME}}}],
            }
            self._store(POD, pod, "MODIFIED")
            return copy.deepcopy(pod)

    def jobset(self, namespace: str, name: str) -> dict:
        """Return the stored JobSet (not a copy)."""
        return self.objects[("JobSet", namespace, name)]

    def workload_of(self, namespace: str, name: str) -> dict:
        """Return the stored Workload of a JobSet (not a copy)."""
        return self.objects[("Workload", namespace, f"jobset-{name}")]

    def now(self) -> str:
        """Return the cluster's time now (RFC 3339), a second later than the reading before."""
        moment = datetime.fromisoformat(TIME.replace("Z", "+00:00")) + timedelta(seconds=next(self._seconds))
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

    def admit(self, namespace: str, name: str) -> None:
        """Kueue admits the JobSet's Workload and unsuspends it; its pods are created, pending
        (new pods with new names and uids on every admission, as the Job controller makes them)."""
        workload = self.workload_of(namespace, name)
        evicted_before = any(entry["type"] == "Evicted" for entry in workload["status"].get("conditions") or [])
        # Kueue turns Evicted and Preempted False when it reserves quota again (workload.SetQuotaReservation).
        cleared = ("False", "QuotaReserved") if evicted_before else None
        self._conditions(workload, QuotaReserved=("True", "QuotaReserved"), Admitted=("True", "Admitted"),
                         Evicted=cleared, Preempted=cleared)
        self._store(WORKLOAD, workload, "MODIFIED")
        jobset = self.jobset(namespace, name)
        jobset["spec"]["suspend"] = False
        self._store(JOBSET, jobset, "MODIFIED")
        self._admissions[(namespace, name)] += 1
        admission = self._admissions[(namespace, name)]
        for replicated in jobset["spec"]["replicatedJobs"]:
            job_name = f"{name}-{replicated['name']}-0"
            template = replicated["template"]
            job = {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": job_name, "namespace": namespace, "uid": f"uid-{next(self._uids)}",
                             "labels": {**(template["metadata"].get("labels") or {}), JOBSET_NAME_LABEL: name,
                                        REPLICATED_JOB_LABEL: replicated["name"]},
                             "ownerReferences": [self._owner(jobset)]},
                "spec": copy.deepcopy(template["spec"]), "status": {"active": 1},
            }
            self._store(JOB, job, "ADDED")
            pod_template = template["spec"]["template"]
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{job_name}-pod" + (f"{admission}" if admission > 1 else ""), "namespace": namespace,
                             "uid": f"uid-{next(self._uids)}", "creationTimestamp": self.now(),
                             "labels": {**(pod_template["metadata"].get("labels") or {}), JOBSET_NAME_LABEL: name,
                                        REPLICATED_JOB_LABEL: replicated["name"]},
                             "ownerReferences": [self._owner(job)]},
                "spec": copy.deepcopy(pod_template["spec"]),
                "status": {"phase": "Pending"},
            }
            self._store(POD, pod, "ADDED")

    def run(self, namespace: str, name: str, *, started_at: str = "2026-12-01T12:01:00Z") -> None:
        """The kubelet starts every pod of the JobSet."""
        for pod in self._pods(namespace, name):
            container = pod["spec"]["containers"][0]["name"]
            pod["status"] = {
                "phase": "Running", "startTime": started_at,
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": container, "ready": True, "restartCount": 0,
                                       "state": {"running": {"startedAt": started_at}}}],
            }
            self._store(POD, pod, "MODIFIED")

    def exit(self, namespace: str, name: str, exit_code: int, *, reason: str = "",
             finished_at: str = "2026-12-01T12:31:00Z", delete_pods: bool = False, role: str | None = None) -> None:
        """The engine container exits with ``exit_code``; the Job and JobSet end as their
        controllers would (any non-zero exit is FailJob by the pod failure policy).

        With ``role``, only that replicated job's pod exits: a non-zero exit fails the JobSet,
        the exit of a ``successPolicy`` target completes it, any other leaves it running. When
        the JobSet ends so, the pods of the other roles still running are ended by SIGTERM
        (exit 143; their Jobs are deleted by the JobSet controller, so none is marked failed).
        """
        roles = None if role is None else {role}
        self._exit_pods(namespace, name, exit_code, reason=reason, finished_at=finished_at,
                        delete_pods=delete_pods, roles=roles)
        for job in self._owned(JOB, namespace, name):
            if roles is not None and self._role(job) not in roles:
                continue
            if exit_code == 0:
                self._conditions(job, Complete=("True", "Completed"))
            else:
                job["status"]["conditions"] = [{
                    "type": "Failed", "status": "True", "reason": "PodFailurePolicy", "lastTransitionTime": self.now(),
                    "message": f"Container engine for pod {namespace}/{job['metadata']['name']}-pod failed with "
                               f"exit code {exit_code} matching FailJob rule at index 0",
                }]
            self._store(JOB, job, "MODIFIED")
        jobset = self.jobset(namespace, name)
        targets = (jobset["spec"].get("successPolicy") or {}).get("targetReplicatedJobs")
        if exit_code == 0 and role is not None and role not in (targets or [role]):
            return  # a role the JobSet's success does not wait for
        self._conditions(jobset, **({"Completed": ("True", "AllJobsCompleted")} if exit_code == 0
                                    else {"Failed": ("True", "FailurePolicy")}))
        self._store(JOBSET, jobset, "MODIFIED")
        workload = self.workload_of(namespace, name)
        self._conditions(workload, Finished=("True", "Succeeded" if exit_code == 0 else "Failed"))
        self._store(WORKLOAD, workload, "MODIFIED")
        if role is not None:  # the JobSet ended: it ends the rest
            live = {self._role(pod) for pod in self._pods(namespace, name) if pod["status"].get("phase") in ("Pending", "Running")}
            if live:
                self._exit_pods(namespace, name, 143, reason="Error", finished_at=finished_at, delete_pods=False, roles=live)

    def _exit_pods(self, namespace: str, name: str, exit_code: int, *, reason: str, finished_at: str,
                   delete_pods: bool, roles: set[str] | None) -> None:
        for pod in self._pods(namespace, name):
            if roles is not None and self._role(pod) not in roles:
                continue
            status = pod["status"]
            started = (status.get("containerStatuses") or [{}])[0].get("state", {}).get("running", {}).get(
                "startedAt", status.get("startTime", TIME))
            status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            status["containerStatuses"] = [{
                "name": pod["spec"]["containers"][0]["name"], "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                                         "startedAt": started, "finishedAt": finished_at}},
            }]
            if delete_pods:
                self._delete(("Pod", namespace, pod["metadata"]["name"]), event_object=pod)
            else:
                self._store(POD, pod, "MODIFIED")

    @staticmethod
    def _role(obj: dict) -> str:
        return (obj["metadata"].get("labels") or {}).get(REPLICATED_JOB_LABEL, "")

    def oom(self, namespace: str, name: str) -> None:
        """The kernel's OOM killer ends the engine (exit 137, reason OOMKilled)."""
        self.exit(namespace, name, 137, reason="OOMKilled")

    def image_pull_error(self, namespace: str, name: str, reason: str = "ImagePullBackOff") -> None:
        """The kubelet cannot pull the engine image."""
        for pod in self._pods(namespace, name):
            pod["status"] = {"phase": "Pending", "containerStatuses": [{
                "name": pod["spec"]["containers"][0]["name"], "ready": False, "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": "pull access denied"}}}]}
            self._store(POD, pod, "MODIFIED")

    def unschedulable(self, namespace: str, name: str, *, since: str = TIME) -> None:
        """The scheduler finds no node for the pods."""
        for pod in self._pods(namespace, name):
            pod["status"] = {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.", "lastTransitionTime": since}]}
            self._store(POD, pod, "MODIFIED")

    def evict(self, namespace: str, name: str, reason: str = "Preempted") -> None:
        """Kueue preempts the Workload: evicted, requeued, the JobSet suspended, its pods gone."""
        workload = self.workload_of(namespace, name)
        self._conditions(workload, Evicted=("True", reason), Preempted=("True", "InClusterQueue"),
                         QuotaReserved=("False", "Pending"), Admitted=("False", "NoReservation"),
                         Requeued=("True", reason))
        self._store(WORKLOAD, workload, "MODIFIED")
        jobset = self.jobset(namespace, name)
        jobset["spec"]["suspend"] = True
        self._store(JOBSET, jobset, "MODIFIED")
        for kind in (POD, JOB):
            for obj in self._owned(kind, namespace, name):
                self._delete((kind.kind, namespace, obj["metadata"]["name"]))

    def mark_inadmissible(self, namespace: str, name: str) -> None:
        """Kueue finds the Workload can never fit its ClusterQueue."""
        workload = self.workload_of(namespace, name)
        self._conditions(workload, QuotaReserved=("False", "Inadmissible"))
        self._store(WORKLOAD, workload, "MODIFIED")

    # --- internals ----------------------------------------------------------------------------

    def _create_workload(self, jobset: dict) -> None:
        metadata = jobset["metadata"]
        workload = {
            "apiVersion": WORKLOAD.api_version, "kind": "Workload",
            "metadata": {"name": f"jobset-{metadata['name']}", "namespace": metadata["namespace"],
                         "uid": f"uid-{next(self._uids)}", "ownerReferences": [self._owner(jobset)]},
            "spec": {"queueName": metadata["labels"].get("kueue.x-k8s.io/queue-name", ""),
                     "priorityClassName": metadata["labels"].get("kueue.x-k8s.io/priority-class", ""),
                     "priority": PRIORITIES.get(metadata["labels"].get("kueue.x-k8s.io/priority-class", ""), 0)},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                       "message": "couldn't assign flavors"}]},
        }
        self._store(WORKLOAD, workload, "ADDED")

    @staticmethod
    def _owner(obj: dict) -> dict:
        return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
                "uid": obj["metadata"]["uid"], "controller": True}

    def _conditions(self, obj: dict, **conditions) -> None:
        status = obj.setdefault("status", {})
        current = {condition["type"]: condition for condition in status.get("conditions") or []}
        for kind, value in conditions.items():
            if value is None:
                current.pop(kind, None)
            else:
                current[kind] = {"type": kind, "status": value[0], "reason": value[1], "message": value[1],
                                 "lastTransitionTime": self.now()}
        status["conditions"] = list(current.values())

    def _pods(self, namespace: str, jobset_name: str) -> list[dict]:
        return self._owned(POD, namespace, jobset_name)

    def _owned(self, kind: Kind, namespace: str, jobset_name: str) -> list[dict]:
        return [obj for (kind_name, obj_namespace, _), obj in list(self.objects.items())
                if kind_name == kind.kind and obj_namespace == namespace
                and (obj["metadata"].get("labels") or {}).get(JOBSET_NAME_LABEL) == jobset_name]

    def _current(self) -> int:
        return self.last_version

    @staticmethod
    def _key(kind: Kind, namespace: str, name: str) -> tuple[str, str, str]:
        return kind.kind, namespace if kind.namespaced else "", name

    def _store(self, kind: Kind, obj: dict, event_type: str) -> None:
        version = self.last_version = next(self._version)
        obj["metadata"]["resourceVersion"] = str(version)
        key = self._key(kind, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        self.objects[key] = obj
        for owner in obj["metadata"].get("ownerReferences") or []:
            self._dependents.setdefault(owner.get("uid"), set()).add(key)
        self.events[kind.kind].append((version, event_type, json.dumps(obj)))

    def _delete(self, key: tuple[str, str, str], *, event_object: dict | None = None) -> None:
        obj = self.objects.pop(key)
        if event_object is not None:
            obj = event_object
        version = self.last_version = next(self._version)
        obj["metadata"]["resourceVersion"] = str(version)
        self.events[key[0]].append((version, "DELETED", json.dumps(obj)))
        uid = obj["metadata"].get("uid")
        for dependent_key in sorted(self._dependents.pop(uid, ())):  # the garbage collector
            dependent = self.objects.get(dependent_key)
            owners = (dependent or {}).get("metadata", {}).get("ownerReferences") or []
            if dependent is not None and any(owner.get("uid") == uid for owner in owners):
                self._delete(dependent_key)



def _merge(target: dict, patch: dict) -> dict:
    """Apply the JSON merge patch ``patch`` to ``target`` (RFC 7386: null removes a key)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def kubernetes_pool(settings, monkeypatch, cluster: FakeGateway, *, nodes: list[dict], clock=None, **pool_settings):
    """Make Lab launch on `cluster` (`LAB_LAUNCHER=kubernetes`, the pool inventory `nodes`) through
    a KubernetesLauncher with `pool_settings` (PoolSettings fields) that the reconciler uses; return it."""
    from jobs.launchers import registry
    from jobs.launchers.kubernetes.launcher import KubernetesLauncher
    from jobs.launchers.kubernetes.objects import PoolSettings

    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_POOL = {"nodes": nodes}
    settings.LAB_POOL_CONFIGURED = True
    extra = {} if clock is None else {"clock": clock}
    launcher = KubernetesLauncher(gateway=cluster, settings=PoolSettings(**pool_settings), background=False, **extra)
    monkeypatch.setattr(registry, "get_launcher", lambda: launcher)
    return launcher
