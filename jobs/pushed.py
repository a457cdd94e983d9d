"""The job of an evaluation that ran elsewhere (``evaluations.pushes``: a local ``vf-eval`` run, or
Prime's clients, whose samples a client pushes).

Such a job is of kind ``evaluation`` and holds the pushed samples (``EvaluationSample`` rows key
them to a job), but nothing of it runs on Lab: it is created ``succeeded`` with no attempt, so
admission, the launchers and the reconciler never see it and billing records nothing for it. Its
``finished_at`` stays empty while samples arrive and is set once they are all in
(``pushed_job_finish``), which is when its evaluation's results are counted.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from jobs.models import Job, JobKind, JobStatus
from lab.audit import Actor
from lab.models import Project


def pushed_job_create(*, project: Project, actor: Actor, name: str, model: str, spec: dict[str, Any]) -> Job:
    """Create the job of a pushed evaluation in ``project``: kind ``evaluation``, ``succeeded``
    with no attempt and no end yet, ``spec`` as given (its ``[[eval.env]]`` blocks are the
    evaluation's environments; ``spec["metadata"]`` its metadata). Call inside the transaction
    that creates the evaluation."""
    return Job.objects.create(
        project=project,
        created_by=actor.user,
        created_by_key=actor.api_key,
        name=name[:128],
        kind=JobKind.EVALUATION,
        status=JobStatus.SUCCEEDED,
        spec=spec,
        metadata=dict(spec.get("metadata") or {}),
        model=model[:256],
        gpu_type="cpu",
        gpus=0,
        max_steps=0,
    )


def pushed_job_finish(*, job: Job, spec: dict[str, Any]) -> Job:
    """Mark the pushed evaluation's ``job`` (locked by the caller) as ended now, with ``spec`` (its
    environments as finally counted); a no-op for one that has ended already. Returns the job."""
    if job.finished_at is None:
        job.finished_at = timezone.now()
        job.spec = spec
        job.save(update_fields=["finished_at", "spec"])
    return job
