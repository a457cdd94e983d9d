"""A preempted job keeps its Kueue queue place (docs/kubernetes.md "Preemption and the queue place").

When Kueue evicts an attempt's Workload it suspends the JobSet and requeues that same Workload
at its place (Kueue orders pending workloads by creation time, except after a PodsReady timeout
or an admission check). A new JobSet would go to the back of its priority band, so Lab keeps the
evicted one: the reconciler ends the attempt as preempted (the job goes ``queued``,
``requeued_after_preemption``) and marks the ended attempt's handle ``parked``. Lab's admission
leaves a job whose JobSet is parked to Kueue (``jobs.parking.awaiting_readmission``). When Kueue readmits the
JobSet, its engine pod opens the job's next attempt itself with the job's bootstrap token
(``POST /api/v1/ingest/jobs/{id}/attempts``, ``attempt_open_for_pod``): a new attempt number, its
job token, and the latest ready checkpoint to resume from. Nothing else changes hands: the
JobSet, its Secret and the Workload stay the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from billing.pricing import usd_to_micro
from jobs.environment_packages import launch_packages
from jobs.registry.store import launch_model
from jobs.ingest.tokens import job_token
from jobs.models import AttemptState, Job, JobAttempt, JobStatus, StatusReason
from jobs.parking import PARKED, parked
from jobs.queue import lock_admission, organization_cap, organization_running, spend_budget
from jobs.services import current_attempt, job_claim_for_start
from lab.errors import LabError

#: Handle key: the uid of the pod that opened an attempt (``attempt_open_for_pod``).
POD_UID = "pod_uid"
#: How long an engine waits before asking again after ``attempt_not_ready`` (seconds).
RETRY_AFTER_S = 5


@dataclass(frozen=True)
class AttemptGrant:
    """What an engine pod is given when it opens an attempt: the attempt number, its job token
    (``ljt_...``), the checkpoint id to resume from (``ckpt_...``, None for a fresh start) and
    the uploaded environment packages to install and the stored model to fetch (``model``), with
    download URLs made now (those in the JobSet's Secret were made at launch and may have
    expired while Kueue held the JobSet)."""

    attempt: int
    token: str
    resume_from: str | None
    environment_packages: tuple[dict, ...] = ()
    model: dict | None = None

    def as_dict(self) -> dict:
        """Return the answer body of ``POST /attempts`` (``model`` only for a stored model)."""
        return {"attempt": self.attempt, "token": self.token, "resume_from": self.resume_from,
                "environment_packages": list(self.environment_packages),
                **({"model": self.model} if self.model is not None else {})}


def attempt_unpark(*, attempt_id: int) -> bool:
    """Give up waiting for Kueue to readmit ``attempt_id``'s JobSet (it is gone, or ended without
    opening an attempt): Lab's admission starts the job again with a new JobSet. Return whether
    the attempt was still parked."""
    with transaction.atomic():
        attempt = parked(JobAttempt.objects.select_for_update().filter(pk=attempt_id)).first()
        if attempt is None:
            return False
        attempt.handle = {**attempt.handle, PARKED: False}
        attempt.save(update_fields=["handle"])
    return True


def _grant(attempt: JobAttempt) -> AttemptGrant:
    resume = attempt.resume_from
    return AttemptGrant(
        attempt=attempt.number, token=job_token(attempt), resume_from=resume.public_id if resume else None,
        environment_packages=launch_packages(attempt.job),
        model=launch_model(model_id=str(attempt.job.spec.get("model", "")), organization_id=attempt.job.project.organization_id),
    )


def _not_ready(message: str) -> LabError:
    return LabError("attempt_not_ready", message, retry_after_s=RETRY_AFTER_S)


@transaction.atomic
def attempt_open_for_pod(*, job_public_id: str, pod_uid: str, jobset: str) -> AttemptGrant:
    """Open the attempt the engine pod ``pod_uid`` of JobSet ``jobset`` runs, once per pod start.

    - the job's current attempt runs in this JobSet and no pod has opened it yet: this pod takes
      it (the first start of a launched JobSet);
    - the job is queued with this JobSet parked after a preemption: Kueue readmitted it, and
      the next attempt opens (queued → starting, ``attempt`` + 1, resuming from the latest ready
      checkpoint; ``jobs.services.job_claim_for_start``), already launched in this JobSet;
    - this pod opened the current attempt already: the same answer again (idempotent by pod uid).

    Raises LabError ``attempt_not_ready`` (with ``Retry-After``) while Lab has not caught up
    with the cluster (the launch not yet recorded, or the previous attempt not yet seen ending),
    409 ``invalid_state`` when the job has ended or this JobSet does not run it (ask no more),
    and 404 for a job that no longer exists.
    """
    job = Job.objects.unscoped().select_for_update(of=("self",)).select_related("project__organization").filter(
        public_id=job_public_id
    ).first()
    if job is None:
        raise LabError("not_found", f"No job '{job_public_id}'.")
    if job.is_terminal:
        raise LabError("invalid_state", f"The job has {job.status}; there is no attempt to run.")
    attempt = current_attempt(job)
    handle = attempt.handle if attempt is not None else {}
    if handle.get(POD_UID) == pod_uid and handle.get("jobset") == jobset:
        return _grant(attempt)
    if job.status == JobStatus.QUEUED:
        if not (handle.get(PARKED) and handle.get("jobset") == jobset
                and job.status_reason == StatusReason.REQUEUED_AFTER_PREEMPTION):
            raise LabError("invalid_state", "No attempt of this job waits in this JobSet.")
        # Kueue readmitted the JobSet, but the organization's cap and billing still hold: the pod
        # waits (asking again) until one of the organization's jobs ends or credit returns. Admission's lock keeps two
        # readmissions, or a readmission and an admission, from both taking the last place.
        lock_admission()
        organization = job.project.organization
        if organization_running(organization) >= organization_cap(organization):
            raise _not_ready(
                f"The organization already runs {organization_cap(organization)} jobs, its cap; "
                "this job starts when one of them ends. Ask again."
            )
        remaining = max(0, usd_to_micro(job.estimated_cost_usd - job.cost_usd))
        if blocker := spend_budget([organization.pk]).refusal(organization.pk, remaining):
            raise _not_ready(f"Billing does not let this job start now ({blocker}); ask again.")
        opened = job_claim_for_start(
            job_id=job.pk,
            handle={key: value for key, value in handle.items() if key != PARKED} | {POD_UID: pod_uid},
        )
        if opened is None:  # unreachable under the row lock; refuse rather than guess
            raise _not_ready("The job is changing state; ask again.")
        return _grant(JobAttempt.objects.select_related("resume_from").get(pk=opened.pk))
    if attempt is None or attempt.state == AttemptState.ENDED:
        raise _not_ready("The job's next attempt is not ready yet; ask again.")
    if attempt.state == AttemptState.PENDING:
        raise _not_ready("The attempt's launch is not recorded yet; ask again.")
    if handle.get("jobset") != jobset:
        raise LabError("invalid_state", "This JobSet does not run the job's current attempt.")
    if handle.get(POD_UID):
        # Another pod of this JobSet opened the current attempt: Kueue readmitted the JobSet
        # before the reconciler saw the eviction. The next pass ends that attempt; then this opens.
        raise _not_ready("The previous attempt has not ended yet; ask again.")
    attempt.handle = {**handle, POD_UID: pod_uid}
    attempt.save(update_fields=["handle"])
    return _grant(attempt)
