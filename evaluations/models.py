"""An evaluation: what is scored (a model, checkpoint, adapter, endpoint or deployment), on which environments, how
it is sampled, the job that runs it and, once that job has ended, its results (docs/evaluations.md).

The evaluation's status, progress, timestamps and usage are its job's (``jobs.Job``, of kind
``evaluation``): it is queued, admitted, launched, cancelled, retried and billed as a job is.
Its samples are the job's (``jobs.evaluation_samples.EvaluationSample``).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from lab.ids import public_id
from lab.models import ApiKey, Project, User
from lab.tenancy import TenantManager


def _evaluation_public_id() -> str:
    return public_id("eval")


class TargetType(models.TextChoices):
    """What an evaluation scores (docs/api.md "Evaluation" ``model.type``; docs/evaluations.md
    "What is evaluated"): a catalogue model, a checkpoint or adapter of the project, an
    OpenAI-compatible endpoint (``target_id`` its model id) or a deployment of the project."""

    MODEL = "model"
    CHECKPOINT = "checkpoint"
    ADAPTER = "adapter"
    ENDPOINT = "endpoint"
    DEPLOYMENT = "deployment"


class Source(models.TextChoices):
    """Where an evaluation's samples come from: ``lab``, its own job run by Lab's engine, or
    ``pushed``, a run made elsewhere (a local ``vf-eval``, Prime's clients) whose samples a client
    pushed (``evaluations.pushes``)."""

    LAB = "lab"
    PUSHED = "pushed"


class Evaluation(models.Model):
    """One evaluation of a project.

    ``target_type`` and ``target_id`` say what is scored (a catalogue model id, a checkpoint's
    ``ckpt_...``, an adapter's ``adp_...`` or a deployment's ``dep_...`` id, an endpoint's model
    id; an endpoint's URL and secret name are in ``details``), ``base_model`` the catalogue model
    its weights start from.
    ``environments`` is the list of ``{"id", "args", "num_examples", "rollouts_per_example"}`` as
    run (an uploaded environment's id with its exact version; ``num_examples`` a count or
    ``"all"``); ``sampling`` is ``{"temperature", "top_p", "max_tokens", "seed"}``. ``results``
    (``evaluations.results``) are those of the job's run that ended at ``results_for`` (the job's
    ``finished_at``): a retried job's new end makes them stale until they are counted again.
    """

    tenant_path = "project"
    objects = TenantManager()

    public_id = models.CharField(max_length=40, unique=True, default=_evaluation_public_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="evaluations")
    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="evaluation")
    #: The training job whose final checkpoint this evaluates, as its ``[eval]
    #: evaluate_final_checkpoint`` asked (one such evaluation per job); None otherwise.
    source_job = models.OneToOneField(
        "jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="final_evaluation"
    )
    name = models.CharField(max_length=128, blank=True)
    target_type = models.CharField(max_length=16, choices=TargetType.choices)
    target_id = models.CharField(max_length=256)
    base_model = models.CharField(max_length=256)
    environments = models.JSONField(default=list)
    sampling = models.JSONField(default=dict)
    metadata = models.JSONField(default=dict)
    results = models.JSONField(null=True, blank=True)
    results_for = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.LAB)
    #: A pushed evaluation's key (the client's digest of what it pushes): the same push again
    #: answers the evaluation it made, once per project. Empty for Lab's own.
    push_id = models.CharField(max_length=128, blank=True)
    #: What a pushed run's own files said of it (its format and verifiers version, its endpoint,
    #: its own averages), as pushed; empty for Lab's own.
    details = models.JSONField(default=dict, blank=True)
    #: When a pushed evaluation was finalized (its samples all pushed); None before, and for Lab's own.
    finalized_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["project", "-id"], name="evaluation_project_newest")]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "push_id"], condition=~models.Q(push_id=""), name="evaluation_push_once_per_project"
            )
        ]

    def __str__(self) -> str:
        return self.public_id
