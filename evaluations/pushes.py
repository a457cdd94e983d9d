"""Evaluations that ran elsewhere: a client creates one, pushes its samples in batches, then
finalizes it (docs/evaluations.md "Results from elsewhere").

``lab evals push DIR`` sends the results of a local verifiers ``vf-eval`` run this way (the SDK
reads verifiers' own files, ``labsdk.vf_results``), and Lab's Prime-compatible routes put Prime's
``prime eval push`` and ``prime-evals`` SDK on the same three services (``evaluations.prime``).

- ``evaluation_push_create``: a pushed evaluation (``source = pushed``) of one environment, whose
  job (``jobs.pushed``) never runs. Its ``push_id`` is the client's key for what it pushes: the
  same ``push_id`` again answers the evaluation it made, so a push that is repeated, or resumed
  after a failure, makes one evaluation.
- ``evaluation_push_samples``: stores each sample once by its key (example, rollout); a sample
  without a rollout takes the next free rollout of its example.
- ``evaluation_push_finalize``: checks that every planned sample is in (or, with no plan, takes
  what is stored as the plan), ends the job and counts the results, which sends the
  ``evaluation.completed`` webhook; finalizing again changes nothing.

Refusals are ``lab.errors.LabError``: ``invalid_request`` (the body, every problem listed),
``invalid_state`` (samples or a finalize that the evaluation's state does not allow).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated, Any

from django.db import transaction
from django.db.models import Count, Max
from django.utils import timezone
from labsdk.spec.values import MetadataKey, MetadataValue
from labsdk.spec.values import Text as StorableText
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StringConstraints, ValidationError

from evaluations.models import Evaluation, Source, TargetType
from evaluations.services import evaluation_settle
from evaluations.specs import MAX_ROLLOUTS, pydantic_problems
from jobs.evaluation_samples import EvaluationSample
from jobs.ingest.schemas import EvaluationSampleIn, storable_json
from jobs.models import Job
from jobs.pushed import pushed_job_create, pushed_job_finish
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import LabError
from lab.ids import public_id
from lab.models import Project

_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
#: Samples one push request may carry (the ingest API's batch limit).
MAX_PUSH_BATCH = 1000
#: The largest ``details`` object kept, in bytes of JSON.
MAX_DETAILS_BYTES = 65_536

Text = Annotated[StorableText, StringConstraints(min_length=1, max_length=256)]
#: JSON a client sends as it is (arguments, details): any shape, but only text PostgreSQL can store.
StorableJson = Annotated[dict[str, JsonValue], AfterValidator(storable_json)]


class PushedEnvironment(BaseModel):
    """The environment the run scored: its id as the run named it, its arguments, and its plan
    (examples and rollouts per example; None where the client does not know them)."""

    model_config = _STRICT
    id: Text
    args: StorableJson = Field(default_factory=dict)
    num_examples: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    rollouts_per_example: Annotated[int, Field(ge=1, le=MAX_ROLLOUTS)] | None = None


class PushedSampling(BaseModel):
    """The run's sampling settings, as far as it recorded them."""

    model_config = _STRICT
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] | None = None


class PushCreate(BaseModel):
    """The body of ``POST /evaluations/push``."""

    model_config = _STRICT
    push_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{8,128}$")]
    name: Annotated[StorableText, StringConstraints(min_length=1, max_length=128)] | None = None
    model: Text
    environment: PushedEnvironment
    sampling: PushedSampling = Field(default_factory=PushedSampling)
    details: StorableJson = Field(default_factory=dict)
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=32)


class PushedSample(EvaluationSampleIn):
    """One sample of a run made elsewhere: the ingest API's evaluation sample
    (``jobs.ingest.schemas.EvaluationSampleIn``) of the one environment, its rollout optional."""

    environment: Annotated[int, Field(ge=0, le=0)] = 0
    num_examples: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    rollout: Annotated[int, Field(ge=0, le=MAX_ROLLOUTS - 1)] | None = None


class PushedSamples(BaseModel):
    """The body of ``POST /evaluations/{id}/samples``."""

    model_config = _STRICT
    samples: Annotated[list[PushedSample], Field(min_length=1, max_length=MAX_PUSH_BATCH)]


def _parse(model: type[BaseModel], data: Any) -> Any:
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise pydantic_problems(error) from None


@transaction.atomic
def evaluation_push_create(*, project: Project, actor: Actor, data: Any) -> tuple[Evaluation, bool]:
    """Create a pushed evaluation from ``data`` (``PushCreate``) in ``project``, ``running`` until
    it is finalized, or return the one its ``push_id`` made already. Returns ``(evaluation,
    created)``. Raises LabError ``invalid_request`` listing every problem of the body; nothing
    is created then."""
    request = _parse(PushCreate, data)
    if len(_json_bytes(request.details)) > MAX_DETAILS_BYTES:
        raise LabError("invalid_request", f"details: at most {MAX_DETAILS_BYTES} bytes of JSON.", param="details")
    existing = Evaluation.objects.for_project(project).select_related("job").filter(push_id=request.push_id).first()
    if existing is not None:
        return existing, False
    environment = request.environment
    evaluation_id = public_id("eval")
    environments = [{
        "id": environment.id, "args": environment.args,
        "num_examples": environment.num_examples or 0, "rollouts_per_example": environment.rollouts_per_example or 1,
    }]
    sampling = request.sampling.model_dump()
    name = request.name or f"{environment.id} on {request.model}"
    job = pushed_job_create(
        project=project, actor=actor, name=name, model=request.model,
        spec=_job_spec(name=name, model=request.model, environments=environments, sampling=sampling, evaluation_id=evaluation_id),
    )
    # Lock the project's push ids briefly: two concurrent creates with one push_id make one evaluation.
    evaluation, created = Evaluation.objects.unscoped().get_or_create(
        project=project, push_id=request.push_id,
        defaults={
            "public_id": evaluation_id, "job": job, "name": name[:128], "source": Source.PUSHED,
            "target_type": TargetType.ENDPOINT, "target_id": request.model, "base_model": request.model,
            "environments": environments, "sampling": sampling, "metadata": request.metadata,
            "details": {**request.details, "planned": environment.num_examples is not None and environment.rollouts_per_example is not None},
            "created_by": actor.user, "created_by_key": actor.api_key, "created_at": job.created_at,
        },
    )
    if not created:
        job.delete()
        return evaluation, False
    audit_record(
        actor=actor, organization=project.organization, project=project, action=AuditAction.EVALUATION_PUSH,
        target=evaluation.public_id,
    )
    return evaluation, True


def _job_spec(*, name: str, model: str, environments: list[dict], sampling: dict, evaluation_id: str) -> dict[str, Any]:
    """The stored spec of a pushed evaluation's job: what ran, in a job spec's terms (its
    ``[[eval.env]]`` blocks, ``[eval.sampling]``), and ``pushed = true``; no engine reads it."""
    return {
        "name": name, "model": model, "max_steps": 0, "pushed": True,
        "env": [{"id": item["id"], "args": item["args"]} for item in environments],
        "eval": {
            "env": [
                {"id": item["id"], "args": item["args"], "num_examples": item["num_examples"],
                 "rollouts_per_example": item["rollouts_per_example"]}
                for item in environments
            ],
            "sampling": {key: value for key, value in sampling.items() if value is not None},
        },
        "metadata": {"evaluation": evaluation_id},
    }


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _locked_pushed(evaluation: Evaluation) -> tuple[Evaluation, Job]:
    """Lock the evaluation's job then the evaluation; refuse one that Lab runs."""
    job = Job.objects.unscoped().select_for_update().get(pk=evaluation.job_id)
    locked = Evaluation.objects.unscoped().select_for_update().get(pk=evaluation.pk)
    locked.job, locked.project = job, evaluation.project
    if locked.source != Source.PUSHED:
        raise LabError(
            "invalid_request",
            f"{locked.public_id} is run by Lab: its samples come from its own engine, and it ends by itself.",
        )
    return locked, job


@transaction.atomic
def evaluation_push_samples(*, evaluation: Evaluation, data: Any) -> dict[str, int]:
    """Store the samples of ``data`` (``PushedSamples``) in the pushed ``evaluation``, each once by
    its (example, rollout) key: one stored already, or twice in the batch, is a duplicate and the
    first stays. A sample without ``rollout`` takes the next free rollout of its example, in batch
    order. Returns ``{"accepted", "duplicates"}``.

    Raises LabError ``invalid_request`` for a bad body, an evaluation Lab runs, and a sample
    beyond the plan (an example or rollout past ``num_examples`` or ``rollouts_per_example`` when
    the create named them), and ``invalid_state`` once the evaluation is finalized; nothing is
    stored then."""
    batch = _parse(PushedSamples, data)
    evaluation, job = _locked_pushed(evaluation)
    if evaluation.finalized_at is not None:
        raise LabError("invalid_state", f"{evaluation.public_id} is finalized: it takes no more samples.")
    plan = evaluation.environments[0]
    planned = bool(evaluation.details.get("planned"))
    for index, sample in enumerate(batch.samples):
        if planned and (
            sample.example >= plan["num_examples"] or (sample.rollout or 0) >= plan["rollouts_per_example"]
        ):
            raise LabError(
                "invalid_request",
                f"samples.{index}: example {sample.example}, rollout {sample.rollout} is outside this evaluation's "
                f"{plan['num_examples']} examples x {plan['rollouts_per_example']} rollouts.",
                param=f"samples.{index}",
            )
    examples = {sample.example for sample in batch.samples}
    stored = set(EvaluationSample.objects.filter(job=job, example__in=examples).values_list("example", "rollout"))
    taken = Counter(example for example, _ in stored)
    rows = []
    for sample in batch.samples:
        rollout = sample.rollout
        if rollout is None:
            rollout = taken[sample.example]
            while (sample.example, rollout) in stored:
                rollout += 1
            if rollout >= MAX_ROLLOUTS:
                raise LabError("invalid_request", f"example {sample.example} has {MAX_ROLLOUTS} rollouts already.")
        key = (sample.example, rollout)
        if key in stored:
            continue
        stored.add(key)
        taken[sample.example] += 1
        rows.append(EvaluationSample(
            job=job, attempt=0, environment=0, example=sample.example, rollout=rollout,
            num_examples=plan["num_examples"] or sample.example + 1, prompt=sample.prompt, completion=sample.completion,
            answer=sample.answer, info=sample.info, reward=sample.reward, functions=sample.functions,
            prompt_tokens=sample.prompt_tokens, completion_tokens=sample.completion_tokens, latency_s=sample.latency_s,
            truncated=sample.truncated, timed_out=sample.timed_out, error=sample.error,
        ))
    EvaluationSample.objects.bulk_create(rows, batch_size=500)
    return {"accepted": len(rows), "duplicates": len(batch.samples) - len(rows)}


def evaluation_push_finalize(*, evaluation: Evaluation, actor: Actor) -> Evaluation:
    """End the pushed ``evaluation`` now that its samples are in: its job ends ``succeeded``, its
    results are counted and ``evaluation.completed`` is sent (``evaluation_settle``). Without a
    plan its examples and rollouts per example are what was stored. Finalizing a finalized
    evaluation returns it unchanged.

    Raises LabError ``invalid_request`` for an evaluation Lab runs, and ``invalid_state`` for one
    with no sample, or with fewer than its plan (``num_examples × rollouts_per_example``), naming
    how many are in."""
    with transaction.atomic():
        evaluation, job = _locked_pushed(evaluation)
        if evaluation.finalized_at is not None:
            return evaluation
        counts = EvaluationSample.objects.filter(job=job).aggregate(
            samples=Count("id"), examples=Count("example", distinct=True), last=Max("example")
        )
        plan = dict(evaluation.environments[0])
        if not counts["samples"]:
            raise LabError("invalid_state", f"{evaluation.public_id} has no sample yet: push its samples, then finalize it.")
        if evaluation.details.get("planned"):
            expected = plan["num_examples"] * plan["rollouts_per_example"]
            if counts["samples"] < expected:
                raise LabError(
                    "invalid_state",
                    f"{evaluation.public_id} has {counts['samples']} of its {expected} samples "
                    f"({plan['num_examples']} examples x {plan['rollouts_per_example']} rollouts): push the rest first.",
                )
        else:
            rollouts = (
                EvaluationSample.objects.filter(job=job).values("example").annotate(n=Count("id"))
                .aggregate(most=Max("n"))["most"]
            )
            plan["num_examples"] = counts["examples"]
            plan["rollouts_per_example"] = rollouts
            evaluation.environments = [plan]
        evaluation.finalized_at = timezone.now()
        evaluation.save(update_fields=["environments", "finalized_at"])
        pushed_job_finish(job=job, spec=_job_spec(
            name=job.name, model=job.model, environments=evaluation.environments, sampling=evaluation.sampling,
            evaluation_id=evaluation.public_id,
        ))
        audit_record(
            actor=actor, organization=evaluation.project.organization, project=evaluation.project,
            action=AuditAction.EVALUATION_FINALIZE, target=evaluation.public_id,
        )
    return evaluation_settle(job_id=job.pk) or evaluation
