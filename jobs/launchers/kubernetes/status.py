"""Read one attempt's cluster objects (its JobSet, Kueue Workload, Jobs and pods) as an
``Observation`` in Lab's words (docs/api.md "Statuses": ``status_reason`` and ``error.code``).

| what the cluster shows | Observation |
|---|---|
| no JobSet yet, within ``missing_grace_s`` of the launch (and never seen deleted) | pending |
| no JobSet after that (deleted by hand, or gone after ``ttlSecondsAfterFinished``) | lost: the reconciler reads the engine's ``finish`` report if it sent one, else a crash |
| Workload not holding quota | pending, ``kueue_pending`` (``kueue_inadmissible`` when Kueue says so) |
| Workload ``Evicted`` (``Preempted``, ...), or a pod ended by a ``DisruptionTarget`` condition | exited, reason ``preempted`` (``kept_in_queue`` when Kueue requeued the Workload: the JobSet waits for the next attempt) |
| another pod of the JobSet live, the one that opened the attempt gone or ended | exited, reason ``preempted``, ``kept_in_queue`` (Kueue readmitted the JobSet before Lab saw the eviction) |
| a container ``OOMKilled`` | exited, ``oom_killed`` |
| ``ImagePullBackOff`` / ``InvalidImageName`` | exited, reason ``image_pull_failed`` (``ErrImagePull`` alone: pending) |
| ``PodScheduled=False`` ``Unschedulable`` for ``unschedulable_after_s`` | exited, reason ``unschedulable`` (pending before) |
| a Job failed by ``DeadlineExceeded`` (``activeDeadlineSeconds``) | exited, reason ``max_runtime_exceeded`` |
| JobSet ``Completed`` / ``Failed`` | exited with the engine container's exit code (from its terminated state, else from the Job's ``PodFailurePolicy`` message) |
| the engine container running | running |

A split attempt (the roles ``inference``, ``orchestrator``, ``trainer``; pods and Jobs say theirs
in ``lab.dev/role``) ends with: on ``Completed``, the trainer's exit code (0 when it has none);
on ``Failed``, the exit code of the role whose Job failed first by the pod failure policy (on
a tie the trainer, then the orchestrator, then inference), so an orchestrator's exit 2 fails
the job ``invalid_spec`` and the pods the JobSet ends after it do not count. Only a trainer pod
(or the whole engine's) opens attempts, so only another one of those replacing it reads as a
readmission.

``started_at``/``ended_at`` are the pods' own times: the earliest container start and the
latest container finish of any role (what usage is billed from, for the job's ``gpus``: the
sum of the roles' GPU requests, which Kueue holds for the whole admission).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from jobs.launchers.base import AttemptPhase, Observation
from jobs.launchers.kubernetes.cache import GroupObjects
from jobs.launchers.kubernetes.objects import ENGINE_ROLE, ROLE_LABEL

#: JobSet's own label of a replicated job's Jobs and pods (used when Lab's role label is absent).
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
#: Whose exit decides a split attempt that failed in several roles at once (first wins).
_ROLE_ORDER = ("trainer", "orchestrator", "inference", ENGINE_ROLE)
#: The roles whose pod opens the attempt (``POST /attempts``) and reports to Lab.
_REPORTING_ROLES = frozenset({"trainer", ENGINE_ROLE})

#: ``Failed`` condition message of a Job ended by a pod failure policy rule (kube-controller-manager's wording).
_EXIT_CODE_MESSAGE = re.compile(r"failed with exit code (\d+)")
_IMAGE_PULL_FINAL = frozenset({"ImagePullBackOff", "InvalidImageName"})
#: Eviction reasons after which Kueue does not requeue the Workload (it was deactivated).
_DEACTIVATED = frozenset({"InactiveWorkload", "Deactivated"})


def parse_time(value: str | None) -> datetime | None:
    """Parse a Kubernetes timestamp (RFC 3339, ``2026-12-01T12:00:00Z``) as an aware UTC datetime."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(timezone.utc)
    except ValueError:
        return None


def condition(obj: dict | None, kind: str) -> dict | None:
    """Return the ``status.conditions`` entry of type ``kind`` whose status is ``"True"``."""
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind and entry.get("status") == "True":
            return entry
    return None


def _any_condition(obj: dict | None, kind: str) -> dict | None:
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return entry
    return None


def role_of(obj: dict) -> str:
    """Return the engine role of a pod or Job (``lab.dev/role``, else JobSet's replicated job
    name, else ``engine``: the whole engine)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(ROLE_LABEL) or labels.get(REPLICATED_JOB_LABEL) or ENGINE_ROLE


def _containers(group: GroupObjects, role: str | None = None) -> list[dict]:
    return [status for pod in group.pods.values() if role is None or role_of(pod) == role
            for status in (pod.get("status") or {}).get("containerStatuses") or [] if status.get("name") == "engine"]


def _times(containers: list[dict]) -> tuple[datetime | None, datetime | None]:
    starts, ends = [], []
    for status in containers:
        state = status.get("state") or {}
        for key in ("running", "terminated"):
            if started := parse_time((state.get(key) or {}).get("startedAt")):
                starts.append(started)
        if finished := parse_time((state.get("terminated") or {}).get("finishedAt")):
            ends.append(finished)
    return min(starts, default=None), max(ends, default=None)


def _terminated_codes(group: GroupObjects, role: str | None = None) -> list[int | None]:
    return [status["state"]["terminated"].get("exitCode") for status in _containers(group, role)
            if "terminated" in (status.get("state") or {})]


def _failing_codes(group: GroupObjects, role: str | None = None) -> list[int]:
    return [code for code in _terminated_codes(group, role) if code not in (0, None)]


def _split(group: GroupObjects) -> bool:
    return any(role_of(obj) != ENGINE_ROLE for obj in [*group.jobs.values(), *group.pods.values()])


def _split_exit_code(group: GroupObjects, *, completed: bool) -> int | None:
    """The exit code of a split attempt (the module's table)."""
    if completed:
        codes = _terminated_codes(group, "trainer")
        return codes[0] if codes and codes[0] is not None else 0
    failed = []
    for job in group.jobs.values():
        entry = condition(job, "Failed")
        if entry and entry.get("reason") != "DeadlineExceeded":
            role = role_of(job)
            rank = _ROLE_ORDER.index(role) if role in _ROLE_ORDER else len(_ROLE_ORDER)
            failed.append((entry.get("lastTransitionTime") or "", rank, role, entry))
    for _, _, role, entry in sorted(failed, key=lambda item: (item[0], item[1])):
        if codes := _failing_codes(group, role):
            return codes[0]
        if match := _EXIT_CODE_MESSAGE.search(entry.get("message") or ""):
            return int(match.group(1))
    for role in _ROLE_ORDER:  # no Job says which failed first: the first role with a failing exit
        if codes := _failing_codes(group, role):
            return codes[0]
    return None


def _exit_code(group: GroupObjects, *, completed: bool = False) -> int | None:
    if _split(group):
        return _split_exit_code(group, completed=completed)
    codes = _terminated_codes(group)
    failing = [code for code in codes if code not in (0, None)]
    if failing:
        return failing[0]
    for job in group.jobs.values():
        failed = condition(job, "Failed")
        if failed and (match := _EXIT_CODE_MESSAGE.search(failed.get("message") or "")):
            return int(match.group(1))
    return codes[0] if codes else None


def requeued_by_kueue(group: GroupObjects) -> bool:
    """Whether Kueue requeues the evicted Workload of ``group`` itself, at its place: the JobSet
    is still there and has not ended, and the Workload was not deactivated (an inactive Workload
    is evicted for good: ``spec.active: false``, reason ``InactiveWorkload``/``Deactivated``)."""
    if group.jobset is None or condition(group.jobset, "Completed") or condition(group.jobset, "Failed"):
        return False
    workload = group.workload or {}
    evicted = _any_condition(workload, "Evicted") or {}
    return (workload.get("spec") or {}).get("active", True) is not False and evicted.get("reason") not in _DEACTIVATED


def pod_uid(pod: dict) -> str:
    """Return a pod's ``metadata.uid`` (empty when it has none)."""
    return (pod.get("metadata") or {}).get("uid") or ""


def _pod_ended(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or any(
        "terminated" in (status.get("state") or {}) for status in (pod.get("status") or {}).get("containerStatuses") or [])


def observe_attempt(
    group: GroupObjects,
    *,
    launched_at: datetime,
    now: datetime,
    deleted: bool = False,
    opened_by: str = "",
    missing_grace_s: float = 120.0,
    unschedulable_after_s: float = 600.0,
) -> Observation:
    """Return what ``group`` (one attempt's objects, from the cache) says of the attempt now.

    ``launched_at`` is when Lab created the JobSet; ``now`` is the current time (both UTC);
    ``deleted`` says the cache saw the JobSet go (no grace then); ``opened_by`` is the uid of
    the pod that opened the attempt (``jobs.readmission``), when one has.
    """
    if group.jobset is None:
        if not deleted and (now - launched_at).total_seconds() < missing_grace_s:
            return Observation(AttemptPhase.PENDING, detail="the JobSet is not in the watch cache yet")
        return Observation(AttemptPhase.LOST, detail="the JobSet is gone (deleted, or removed after it finished)")
    containers = _containers(group)
    started_at, ended_at = _times(containers)

    def exited(reason: str = "", *, exit_code: int | None = None, oom: bool = False, detail: str = "",
               kept: bool = False) -> Observation:
        return Observation(AttemptPhase.EXITED, exit_code=exit_code, oom_killed=oom, reason=reason, detail=detail,
                           started_at=started_at, ended_at=ended_at or now, kept_in_queue=kept)

    for status in containers:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return exited("oom", exit_code=terminated.get("exitCode"), oom=True, detail="the engine was OOMKilled")
    evicted = condition(group.workload, "Evicted") or condition(group.workload, "Preempted")
    if evicted and not condition(group.workload, "Finished"):
        return exited("preempted", kept=requeued_by_kueue(group),
                      detail=f"Kueue evicted the workload: {evicted.get('reason', '')} {evicted.get('message', '')}".strip())
    for pod in group.pods.values():
        if disruption := condition(pod, "DisruptionTarget"):
            return exited("preempted", detail=f"the pod was disrupted: {disruption.get('reason', '')} {disruption.get('message', '')}".strip())
    for job in group.jobs.values():
        failed = condition(job, "Failed")
        if failed and failed.get("reason") == "DeadlineExceeded":
            return exited("max_runtime_exceeded", detail=failed.get("message") or "activeDeadlineSeconds passed")
    if condition(group.jobset, "Completed"):
        code = _exit_code(group, completed=True)
        return exited(exit_code=0 if code is None else code)
    if failed := condition(group.jobset, "Failed"):
        return exited(exit_code=_exit_code(group), detail=failed.get("message") or "the JobSet failed")
    for status in containers:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _IMAGE_PULL_FINAL:
            return exited("image_pull_failed", detail=f"{waiting['reason']}: {waiting.get('message', '')}".strip())
    for pod in group.pods.values():
        scheduled = _any_condition(pod, "PodScheduled")
        if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            since = parse_time(scheduled.get("lastTransitionTime")) or now
            if (now - since).total_seconds() >= unschedulable_after_s:
                return exited("unschedulable", detail=scheduled.get("message") or "no node fits the pod")
            return Observation(AttemptPhase.PENDING, reason="unschedulable", detail=scheduled.get("message") or "")
    if opened_by:
        mine = [pod for pod in group.pods.values() if pod_uid(pod) == opened_by]
        others = [pod for pod in group.pods.values() if pod_uid(pod) != opened_by and not _pod_ended(pod)
                  and role_of(pod) in _REPORTING_ROLES]
        if others and all(_pod_ended(pod) for pod in mine):
            return exited("preempted", kept=requeued_by_kueue(group),
                          detail=f"Kueue readmitted the JobSet: pod {others[0]['metadata'].get('name', '')} replaced the attempt's pod")
    if any("running" in (status.get("state") or {}) for status in containers):
        return Observation(AttemptPhase.RUNNING, started_at=started_at)
    if not condition(group.workload, "QuotaReserved"):
        reserved = _any_condition(group.workload, "QuotaReserved") or {}
        reason = "kueue_inadmissible" if reserved.get("reason") == "Inadmissible" else "kueue_pending"
        return Observation(AttemptPhase.PENDING, reason=reason, detail=reserved.get("message") or "")
    return Observation(AttemptPhase.PENDING, detail="admitted; pods starting")
