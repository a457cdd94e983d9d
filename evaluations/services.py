"""Evaluation services: create (an evaluation and the job that runs it), cancel, retry, delete, and
settle an evaluation whose job ended (its results and its webhook). docs/evaluations.md.

The job does the running: it is queued, admitted, launched, reconciled, billed, cancelled and
restarted by ``jobs`` like any job, so these services only add the evaluation around it, in the
same transaction, with an audit row. Refusals are ``lab.errors.LabError``: ``invalid_request``
(the body, in its own terms), ``not_found`` (a checkpoint that is missing or another tenant's),
``checkpoint_not_ready``, ``invalid_state`` (a job in the wrong status) and billing's 402 codes.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from evaluations.models import Evaluation, Source
from evaluations.results import evaluation_results
from evaluations.serializers import Progress, evaluation_to_dict
from evaluations.specs import evaluation_problems, final_checkpoint_body, job_spec, parse_request, resolve_target
from jobs.events import job_record_event
from jobs.models import CheckpointStatus, EventLevel, EventType, Job, JobKind, JobStatus
from jobs.services import job_cancel, job_delete, job_restart, job_submit
from jobs.webhooks import outbox
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import LabError
from lab.ids import public_id
from lab.models import Project

#: The webhook event of an evaluation whose job ended so (a cancelled one sends none).
WEBHOOK_EVENTS = {JobStatus.SUCCEEDED: "evaluation.completed", JobStatus.FAILED: "evaluation.failed"}


@transaction.atomic
def evaluation_create(*, project: Project, actor: Actor, data: Any) -> Evaluation:
    """Validate ``data`` (the body of ``POST /evaluations``) and create the evaluation with its
    queued evaluation job in ``project``.

    Raises LabError ``invalid_request`` listing every problem of the body and of the job spec it
    makes (an unknown model or environment, environment arguments, max_tokens beyond the
    model's context, the pool, an endpoint's secret not among ``secrets``: ``missing_secret``),
    ``not_found`` for a checkpoint, adapter or deployment that is missing or another tenant's,
    ``checkpoint_not_ready``, ``adapter_not_ready``, ``invalid_state`` (a stopped deployment),
    and billing's 402 codes; nothing is created then.
    """
    request = parse_request(data)
    target = resolve_target(project=project, target=request.model)
    evaluation_id = public_id("eval")
    try:
        job = job_submit(
            project=project, actor=actor, data=job_spec(request=request, target=target, evaluation_id=evaluation_id),
            kind=JobKind.EVALUATION,
        )
    except LabError as error:
        raise evaluation_problems(error) from None
    blocks = job.spec["eval"]["env"]  # uploaded environments resolved to their exact versions
    evaluation = Evaluation.objects.create(
        public_id=evaluation_id,
        project=project,
        job=job,
        name=request.name or "",
        target_type=target.type,
        target_id=target.id,
        base_model=target.base_model,
        environments=[
            {
                "id": block["id"],
                "args": environment.args,
                "num_examples": environment.num_examples,
                "rollouts_per_example": environment.rollouts_per_example,
            }
            for block, environment in zip(blocks, request.environments)
        ],
        sampling=request.sampling.model_dump(),
        metadata=request.metadata,
        details=target.details,
        created_by=actor.user,
        created_by_key=actor.api_key,
        created_at=job.created_at,
    )
    audit_record(
        actor=actor, organization=project.organization, project=project, action=AuditAction.EVALUATION_CREATE,
        target=evaluation.public_id,
    )
    return evaluation


def is_settled(evaluation: Evaluation) -> bool:
    """Whether the evaluation's samples are all in once its job has ended: always for Lab's own,
    once finalized for a pushed one (``evaluations.pushes``)."""
    return evaluation.source != Source.PUSHED or evaluation.finalized_at is not None


def _refuse_pushed(evaluation: Evaluation, verb: str) -> None:
    """Refuse to ``verb`` a pushed evaluation: it ran elsewhere, and Lab has nothing to run or stop."""
    if evaluation.source == Source.PUSHED:
        raise LabError(
            "invalid_request",
            f"{evaluation.public_id} ran elsewhere and was pushed to Lab: there is nothing to {verb}. "
            "Run it again where it ran and push the new results, or evaluate the model on Lab (POST /evaluations).",
        )


def evaluation_cancel(*, evaluation: Evaluation, actor: Actor) -> Evaluation:
    """Cancel the evaluation's job (``jobs.services.job_cancel``: ``cancelled`` at once while
    queued, else ``cancelling``; the samples stored so far are kept). Raises LabError
    ``invalid_request`` for a pushed evaluation and ``invalid_state`` once it has ended."""
    _refuse_pushed(evaluation, "cancel")
    with transaction.atomic():
        job_cancel(job=evaluation.job, actor=actor)
        audit_record(
            actor=actor, organization=evaluation.project.organization, project=evaluation.project,
            action=AuditAction.EVALUATION_CANCEL, target=evaluation.public_id,
        )
    evaluation.job.refresh_from_db()
    return evaluation


def evaluation_retry(*, evaluation: Evaluation, actor: Actor) -> Evaluation:
    """Run a failed or cancelled evaluation's job again (``jobs.services.job_restart``): it
    samples what is still missing again (what was stored stays, once) and its results are
    counted anew when it ends. Raises LabError ``invalid_request`` for a pushed evaluation and
    ``invalid_state`` for another status."""
    _refuse_pushed(evaluation, "retry")
    with transaction.atomic():
        job_restart(job=evaluation.job, actor=actor, kind=JobKind.EVALUATION)
        audit_record(
            actor=actor, organization=evaluation.project.organization, project=evaluation.project,
            action=AuditAction.EVALUATION_RETRY, target=evaluation.public_id,
        )
    evaluation.job.refresh_from_db()
    return evaluation


@transaction.atomic
def evaluation_delete(*, evaluation: Evaluation, actor: Actor) -> None:
    """Delete a finished evaluation with its job and samples (``jobs.services.job_delete``).
    Raises LabError ``invalid_state`` while its job has not ended."""
    audit_record(
        actor=actor, organization=evaluation.project.organization, project=evaluation.project,
        action=AuditAction.EVALUATION_DELETE, target=evaluation.public_id,
    )
    job_delete(job=evaluation.job, actor=actor, kind=JobKind.EVALUATION)  # the evaluation goes with its job


@transaction.atomic
def evaluation_settle(*, job_id: int) -> Evaluation | None:
    """Count the results of the evaluation whose job ``job_id`` (a Job primary key) has ended and
    send its webhook (``evaluation.completed`` when it succeeded, ``evaluation.failed`` when it
    failed) through the outbox, once per end of its job: a retried job that ends again is
    counted and sent again. A no-op while the job runs, once settled, and for a job without an
    evaluation. Returns the evaluation, or None."""
    evaluation = (
        Evaluation.objects.unscoped().select_for_update(of=("self",)).select_related("job", "project")
        .filter(job_id=job_id).first()
    )
    if evaluation is None:
        return None
    job = Job.objects.unscoped().get(pk=job_id)
    evaluation.job = job
    if not job.is_terminal or evaluation.results_for == job.finished_at or not is_settled(evaluation):
        return evaluation
    evaluation.results = evaluation_results(job=job, environments=evaluation.environments)
    evaluation.results_for = job.finished_at
    evaluation.save(update_fields=["results", "results_for"])
    event = WEBHOOK_EVENTS.get(job.status)
    endpoints = outbox.subscribed_endpoints(project_id=evaluation.project_id, type=event) if event else []
    if endpoints:
        outbox.publish(
            project_id=evaluation.project_id, type=event, data=evaluation_to_dict(evaluation, _progress(evaluation)),
            endpoints=endpoints, created_at=timezone.now(),
        )
    return evaluation


def _progress(evaluation: Evaluation) -> Progress:
    """The settled evaluation's stored samples and tokens, from its results."""
    results = (evaluation.results or {}).values()
    return Progress(
        samples=sum(result["samples"] for result in results),
        prompt_tokens=sum(result["tokens"]["prompt"] for result in results),
        completion_tokens=sum(result["tokens"]["completion"] for result in results),
    )


def evaluation_of_final_checkpoint(*, job_id: int) -> Evaluation | None:
    """Evaluate the final checkpoint of the training job ``job_id`` (a Job primary key) that
    succeeded, as its spec's ``[eval] evaluate_final_checkpoint`` asks (``final_checkpoint_body``),
    on behalf of whoever submitted the job, once: a ``job.final_evaluation`` event names the
    evaluation, or says why there is none (a warning: no ready checkpoint of the last step, or the
    refusal of ``evaluation_create``, billing's included). A no-op for a job that did not succeed,
    does not ask for it, or was handled already. Returns the evaluation, or None."""
    with transaction.atomic():
        job = (
            Job.objects.unscoped().select_for_update(of=("self",))
            .select_related("project__organization", "created_by", "created_by_key").filter(pk=job_id).first()
        )
        if (
            job is None or job.kind != JobKind.TRAINING or job.status != JobStatus.SUCCEEDED
            or not (job.spec.get("eval") or {}).get("evaluate_final_checkpoint")
            or job.events.filter(type=EventType.FINAL_EVALUATION).exists()
        ):
            return None
        checkpoint = job.checkpoints.filter(status=CheckpointStatus.READY, step=job.max_steps).order_by("-attempt").first()
        if checkpoint is None:
            return _no_final_evaluation(job, f"no ready checkpoint of its last step ({job.max_steps}) to evaluate")
        actor = Actor(user=job.created_by, api_key=job.created_by_key)
        try:
            with transaction.atomic():
                evaluation = evaluation_create(
                    project=job.project, actor=actor, data=final_checkpoint_body(job=job, checkpoint=checkpoint)
                )
        except LabError as error:
            return _no_final_evaluation(job, error.message)
        evaluation.source_job = job
        evaluation.save(update_fields=["source_job"])
        job_record_event(
            job=job, type=EventType.FINAL_EVALUATION,
            message=f"Evaluating the final checkpoint {checkpoint.public_id}: {evaluation.public_id}.",
            data={"evaluation_id": evaluation.public_id, "checkpoint_id": checkpoint.public_id},
        )
        return evaluation


def _no_final_evaluation(job: Job, why: str) -> None:
    """Record on ``job`` (locked) why its final checkpoint is not evaluated."""
    job_record_event(
        job=job, type=EventType.FINAL_EVALUATION, level=EventLevel.WARNING,
        message=f"The final checkpoint is not evaluated: {why}", data={"evaluation_id": None},
    )
