"""The scored rollouts of an evaluation job (``JobKind.EVALUATION``), one row per sample.

The engine of an evaluation (``python -m engine evaluate``, engine/evaluation.py) samples every
example of every environment of the job's ``[[eval.env]]`` blocks ``rollouts_per_example`` times
and reports each rollout through the ingest API (``POST /ingest/jobs/{id}/evaluation-samples``,
``jobs.ingest.services.ingest_evaluation_samples``). A sample's key is (environment, example,
rollout): the first one stored stays, so a resent batch or a restarted attempt, which samples the
same prompts again in the same order, stores each sample exactly once. When the engine says it
succeeded, Lab counts them (``missing_evaluation_samples``): a job never succeeds with samples
that did not arrive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.models import Count, Max
from django.utils import timezone

from lab.ids import public_id
from lab.tenancy import TenantManager


def _sample_public_id() -> str:
    return public_id("evs")


class EvaluationSample(models.Model):
    """One rollout of an evaluation: example ``example`` (0-based) of the eval split of the job's
    ``[[eval.env]]`` block number ``environment`` (0-based), rollout ``rollout`` (0-based) of it.

    ``num_examples`` is how many examples that environment has in this run (the engine resolves
    ``num_examples = -1``, the whole eval split); ``prompt`` the chat messages of the example,
    ``completion`` the reply (for a multi-turn environment, the episode's text), ``answer`` what the
    rubric checks against and ``info`` the environment's own data about the example; ``reward`` the
    weighted reward and ``functions`` each reward function's score (``{name: float}``).
    ``prompt_tokens`` and ``completion_tokens`` count tokens (the completion's: those sampled);
    ``latency_s`` is the wall-clock seconds of the batched generation and scoring call that made it;
    ``timed_out`` says its scoring ran past the environment's timeout (reward 0); ``error`` is the
    environment's failure when its code raised past its retries (reward 0, no function scored).
    ``attempt`` is the attempt that stored it.
    """

    tenant_path = "job__project"
    tenant_parents = ("job",)
    objects = TenantManager()

    public_id = models.CharField(max_length=40, unique=True, default=_sample_public_id)
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="evaluation_samples")
    attempt = models.PositiveIntegerField()
    environment = models.PositiveSmallIntegerField()
    example = models.PositiveIntegerField()
    rollout = models.PositiveIntegerField()
    num_examples = models.PositiveIntegerField()
    prompt = models.JSONField(default=list)
    completion = models.TextField(blank=True)
    answer = models.TextField(blank=True)
    info = models.JSONField(default=dict)
    reward = models.FloatField()
    functions = models.JSONField(default=dict)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_s = models.FloatField(default=0.0)
    truncated = models.BooleanField(default=False)
    timed_out = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "environment", "example", "rollout"], name="evaluation_sample_once_per_key"
            )
        ]
        indexes = [
            models.Index(fields=["job", "id"], name="evaluation_sample_job_order"),
            models.Index(fields=["job", "environment", "reward"], name="evaluation_sample_job_reward"),
        ]

    def __str__(self) -> str:
        return self.public_id


@dataclass(frozen=True)
class PlannedEnvironment:
    """What a job spec's ``[eval]`` says of one environment it evaluates: its ``id`` and ``args``,
    its ``num_examples`` (None: the whole eval split, ``-1``, which only the engine can count) and
    ``rollouts_per_example``."""

    id: str
    args: dict[str, Any]
    num_examples: int | None
    rollouts_per_example: int


def evaluation_plan(spec: dict[str, Any]) -> list[PlannedEnvironment]:
    """Return the environments a stored job spec's ``[eval]`` evaluates, in order, with the
    defaults the engine applies (engine.orchestrator.Orchestrator._eval_targets): its
    ``[[eval.env]]`` blocks with their own counts, else ``[eval]``'s (``num_examples`` 32,
    ``rollouts_per_example`` 1); without blocks, the training environments with ``[eval]``'s
    counts. An evaluation job's spec always has its blocks."""
    section = spec.get("eval") or {}
    blocks = section.get("env") or [{"id": block.get("id", ""), "args": block.get("args") or {}} for block in spec.get("env", [])]
    planned = []
    for block in blocks:
        count = block.get("num_examples")
        count = section.get("num_examples", 32) if count is None else count
        rollouts = block.get("rollouts_per_example") or block.get("group_size") or section.get("rollouts_per_example") or 1
        planned.append(PlannedEnvironment(
            block.get("id", ""), dict(block.get("args") or {}), None if count == -1 else int(count), int(rollouts),
        ))
    return planned


def missing_evaluation_samples(job) -> str:
    """Say which of ``job``'s samples never arrived, per environment ("" when every planned one
    did): each ``[[eval.env]]`` block owes ``num_examples × rollouts_per_example`` samples, its
    ``num_examples`` as the spec gives it or, for the whole split, as its samples report it (an
    environment with none stored owes an unknown number)."""
    stored = {
        row["environment"]: row
        for row in EvaluationSample.objects.filter(job=job)
        .values("environment")
        .annotate(count=Count("id"), reported=Max("num_examples"))
    }
    problems = []
    for index, planned in enumerate(evaluation_plan(job.spec)):
        row = stored.get(index)
        count = row["count"] if row else 0
        examples = planned.num_examples if planned.num_examples is not None else (row["reported"] if row else None)
        if examples is None:
            problems.append(f"environment {index}: none of its samples")
        elif count < examples * planned.rollouts_per_example:
            problems.append(f"environment {index}: {count} of {examples * planned.rollouts_per_example} samples")
    return "; ".join(problems)
