"""Jobs and what they produce: the job row, its event log and its checkpoints.

A Job belongs to one Project; every change of its status goes through ``jobs.services`` and
writes a JobEvent whose ``type`` is the webhook event name (docs/api.md).
"""

from __future__ import annotations

import secrets
from decimal import Decimal

from django.db import models
from django.utils import timezone

from lab.ids import public_id
from lab.models import ApiKey, Project, User
from lab.tenancy import TenantManager


def _job_public_id() -> str:
    return public_id("job")


def _event_public_id() -> str:
    return public_id("evt")


def _checkpoint_public_id() -> str:
    return public_id("ckpt")


def _adapter_public_id() -> str:
    return public_id("adp")


class JobStatus(models.TextChoices):
    """Lifecycle of a job (docs/api.md)."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
ACTIVE_STATUSES = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELLING})


class StatusReason(models.TextChoices):
    """Why a queued job waits (docs/api.md "Statuses": ``status_reason``)."""

    WAITING = "waiting"
    ORG_CONCURRENCY_LIMIT = "org_concurrency_limit"
    POOL_FULL = "pool_full"
    PAYMENT_REQUIRED = "payment_required"
    REQUEUED_AFTER_PREEMPTION = "requeued_after_preemption"
    REQUEUED_AFTER_CRASH = "requeued_after_crash"
    KUEUE_PENDING = "kueue_pending"
    KUEUE_INADMISSIBLE = "kueue_inadmissible"
    ENVIRONMENT_BUILDING = "environment_building"


class ErrorCode(models.TextChoices):
    """Why a job failed (docs/api.md "Statuses": ``error.code``)."""

    INVALID_SPEC = "invalid_spec"
    MODEL_NOT_FOUND = "model_not_found"
    ENVIRONMENT_ERROR = "environment_error"
    OOM = "oom"
    MAX_RESTARTS_EXCEEDED = "max_restarts_exceeded"
    HEARTBEAT_LOST = "heartbeat_lost"
    MAX_RUNTIME_EXCEEDED = "max_runtime_exceeded"
    INSUFFICIENT_CREDIT = "insufficient_credit"
    SPEND_LIMIT_REACHED = "spend_limit_reached"
    IMAGE_PULL_FAILED = "image_pull_failed"
    UNSCHEDULABLE = "unschedulable"
    INTERNAL_ERROR = "internal_error"


class JobKind(models.TextChoices):
    """What a job's engine runs: ``training`` (``python -m engine run``), or an ``evaluation`` of its
    model on the environments of its ``[eval]`` section that never trains (``python -m engine
    evaluate``; the job of an ``evaluations.Evaluation``, docs/evaluations.md)."""

    TRAINING = "training"
    EVALUATION = "evaluation"


class JobPriority(models.IntegerChoices):
    """Queue priority; a higher value is admitted first."""

    LOW = 0, "low"
    NORMAL = 1, "normal"
    HIGH = 2, "high"


class Job(models.Model):
    """One RL training job: its validated spec, status, progress and usage."""

    tenant_path = "project"
    objects = TenantManager()

    public_id = models.CharField(max_length=40, unique=True, default=_job_public_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    name = models.CharField(max_length=128, blank=True)
    kind = models.CharField(max_length=16, choices=JobKind.choices, default=JobKind.TRAINING)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    status_reason = models.CharField(max_length=64, blank=True)
    spec = models.JSONField()
    warnings = models.JSONField(default=list)
    metadata = models.JSONField(default=dict)
    priority = models.PositiveSmallIntegerField(choices=JobPriority.choices, default=JobPriority.NORMAL)
    model = models.CharField(max_length=256)
    gpu_type = models.CharField(max_length=32, default="cpu")
    gpus = models.PositiveSmallIntegerField(default=0)
    max_steps = models.PositiveIntegerField()
    step = models.PositiveIntegerField(default=0)
    attempt = models.PositiveIntegerField(default=0)
    # Attempts that ended in a crash (or lost heartbeat); max_restarts bounds them.
    crash_count = models.PositiveIntegerField(default=0)
    init_from = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    gpu_seconds = models.FloatField(default=0.0)
    cpu_seconds = models.FloatField(default=0.0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    # What the whole run was estimated to cost at submission (jobs.estimates), in USD: admission
    # starts a job only while its organization can still pay the part not yet used.
    estimated_cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    created_at = models.DateTimeField(default=timezone.now)
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The last number of the job's live-stream sequence (jobs.stream): every metric step,
    # sample, log line, event, status change and checkpoint change takes the next ones.
    stream_seq = models.BigIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["project", "-id"], name="job_project_newest"),
            models.Index(fields=["status", "-priority", "queued_at"], name="job_queue_order"),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def is_terminal(self) -> bool:
        """Whether the job has finished (succeeded, failed or cancelled)."""
        return self.status in TERMINAL_STATUSES

    @property
    def fails_again(self) -> bool:
        """Whether running this failed job's spec again cannot succeed: it was refused as
        ``invalid_spec``, or failed with ``environment_error`` before it ever trained (its
        environment did not load). Such a job is not restarted; its spec is edited and resubmitted."""
        return self.status == JobStatus.FAILED and (
            self.error_code == ErrorCode.INVALID_SPEC
            or (self.error_code == ErrorCode.ENVIRONMENT_ERROR and self.started_at is None)
        )


class EventLevel(models.TextChoices):
    """How a JobEvent is shown."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class EventType(models.TextChoices):
    """The types of JobEvent (docs/api.md "Statuses"); webhooks carry a subset of them."""

    QUEUED = "job.queued"
    STARTING = "job.starting"
    STARTED = "job.started"
    REQUEUED = "job.requeued"
    RESTARTED = "job.restarted"
    CANCELLING = "job.cancelling"
    SUCCEEDED = "job.succeeded"
    FAILED = "job.failed"
    CANCELLED = "job.cancelled"
    DATA_INCOMPLETE = "job.data_incomplete"  # a warning: data an engine could not deliver
    CHECKPOINT_READY = "checkpoint.ready"
    CHECKPOINT_FAILED = "checkpoint.failed"
    ADAPTER_READY = "adapter.ready"
    ADAPTER_FAILED = "adapter.failed"  # a warning: an adapter's upload failed verification or was abandoned
    FINAL_EVALUATION = "job.final_evaluation"  # the evaluation of its final checkpoint started, or why not (a warning)


class JobEvent(models.Model):
    """One thing that happened to a job; ``type`` is a webhook event name (``job.started``...)."""

    public_id = models.CharField(max_length=40, unique=True, default=_event_public_id)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    type = models.CharField(max_length=40)
    level = models.CharField(max_length=8, choices=EventLevel.choices, default=EventLevel.INFO)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    stream_seq = models.BigIntegerField(null=True)
    # For a status change: the Job object right after it, the live stream's ``status`` event
    # (number ``stream_seq + 1``), so a replay shows each status as it was.
    job_snapshot = models.JSONField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["job", "id"], name="jobevent_job_order"),
            models.Index(fields=["job", "stream_seq"], name="jobevent_job_stream"),
        ]


class CheckpointStatus(models.TextChoices):
    """Lifecycle of a checkpoint (docs/checkpoints.md): only ``ready`` ones can be downloaded or resumed."""

    PENDING = "pending"
    UPLOADING = "uploading"
    READY = "ready"
    FAILED = "failed"
    DELETED = "deleted"  # removed by keep_last retention or job deletion; stays listed, no download


class CheckpointFormat(models.TextChoices):
    """What the archive holds: a PEFT LoRA adapter or full Hugging Face weights."""

    PEFT_LORA = "peft-lora"
    HF_FULL = "hf-full"


class Artifact(models.Model):
    """What a checkpoint and an adapter share (``jobs.artifacts``): one uncompressed tar of one job
    at one step, written by one attempt, stored under ``storage_key``; ``size_bytes`` and the hex
    ``sha256`` are what Lab verified when it became ready (at ``ready_at``). A kind adds its
    ``public_id`` (its prefix), its ``job`` (the reverse name), its ``status`` choices and its
    uniqueness rule."""

    tenant_path = "job__project"
    tenant_parents = ("job",)
    objects = TenantManager()

    step = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()
    format = models.CharField(max_length=12, choices=CheckpointFormat.choices)
    storage_key = models.CharField(max_length=512, blank=True)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class Checkpoint(Artifact):
    """A saved training state of one job attempt at one step (one uncompressed tar)."""

    public_id = models.CharField(max_length=40, unique=True, default=_checkpoint_public_id)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    status = models.CharField(max_length=12, choices=CheckpointStatus.choices, default=CheckpointStatus.PENDING)
    stream_seq = models.BigIntegerField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["job", "status", "-step"], name="checkpoint_job_latest"),
            models.Index(fields=["job", "stream_seq"], name="checkpoint_job_stream"),
        ]
        constraints = [
            # One checkpoint per step of an attempt: a retried or replayed registration reuses it.
            models.UniqueConstraint(fields=["job", "attempt", "step"], name="checkpoint_once_per_attempt_step"),
        ]


class CheckpointChange(models.Model):
    """One state of a checkpoint as the live stream sent it (the Checkpoint object then, under
    its stream number). A checkpoint row holds only its latest state, so the stream replays
    these: a replay after any number is exactly what was sent live after it."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoint_changes")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="changes")
    stream_seq = models.BigIntegerField()
    snapshot = models.JSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "stream_seq"], name="checkpoint_change_once_per_number")]


class AdapterStatus(models.TextChoices):
    """Lifecycle of an adapter artifact (docs/checkpoints.md, "Adapter artifacts"): only ``ready``
    ones can be downloaded."""

    UPLOADING = "uploading"
    READY = "ready"
    FAILED = "failed"
    DELETED = "deleted"  # removed by ``[adapters] keep_last``; stays listed, no download


class Adapter(Artifact):
    """The trained weights alone (LoRA adapter or full Hugging Face weights, no optimizer or
    trainer state) of one job at one step, as one uncompressed tar (``jobs.artifacts``).

    Unique per (job, step): a newer attempt's export of a step replaces an older attempt's.
    """

    public_id = models.CharField(max_length=40, unique=True, default=_adapter_public_id)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="adapters")
    status = models.CharField(max_length=12, choices=AdapterStatus.choices, default=AdapterStatus.UPLOADING)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "step"], name="adapter_once_per_step")]


class AttemptState(models.TextChoices):
    """Where an attempt is in its launcher's hands."""

    PENDING = "pending"  # claimed by admission; the launch task has not run yet
    LAUNCHED = "launched"  # the launcher started it
    ENDED = "ended"  # its process is gone and the reconciler applied the outcome


class StopReason(models.TextChoices):
    """Why Lab asked an attempt to stop (docs/api.md "Engine exit codes")."""

    NONE = ""
    CANCEL = "cancel"
    RUNTIME = "runtime"
    CREDIT = "credit"  # the prepaid balance reached its grace floor
    SPEND_LIMIT = "spend_limit"  # the organization's monthly spend limit was reached


def _token_nonce() -> str:
    return secrets.token_hex(16)


class JobAttempt(models.Model):
    """One launch of a job: its launcher handle, heartbeat, job token and outcome.

    Each attempt is a new launch by Lab; metrics, logs and usage are per attempt. The job token
    (stored hashed) is good for this job's ingest API until an hour after the job ends.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=AttemptState.choices, default=AttemptState.PENDING)
    launcher = models.CharField(max_length=16)
    handle = models.JSONField(default=dict)
    # Random per attempt; the job token is a signature over (attempt id, nonce), so Lab can give
    # the same token to a relaunch without storing it (jobs.ingest.tokens).
    token_nonce = models.CharField(max_length=32, default=_token_nonce)
    resume_from = models.ForeignKey(Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    launched_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    phase = models.CharField(max_length=16, blank=True)
    stop_reason = models.CharField(max_length=16, choices=StopReason.choices, blank=True, default=StopReason.NONE)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    terminate_sent_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True)
    outcome_error = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="attempt_number_unique")]

    def __str__(self) -> str:
        return f"{self.job.public_id}#{self.number}"


class MetricStep(models.Model):
    """All metric values of one job at one step (one row per step, not per number).

    ``values`` maps metric names (docs/api.md "Metric names") to floats; ``attempt`` is the
    attempt that wrote the step (a newer attempt's point replaces an older one's).
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_steps")
    step = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()
    time = models.DateTimeField()
    values = models.JSONField()
    stream_seq = models.BigIntegerField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "step"], name="metric_step_unique")]
        indexes = [models.Index(fields=["job", "stream_seq"], name="metric_job_stream")]


class RolloutSample(models.Model):
    """One rollout kept for reading: prompt, completion, reward and GRPO advantage."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="samples")
    step = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()
    group = models.PositiveIntegerField()
    prompt = models.TextField()
    completion = models.TextField()
    reward = models.FloatField()
    advantage = models.FloatField()
    metrics = models.JSONField(default=dict)
    stream_seq = models.BigIntegerField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["job", "step"], name="sample_job_step"),
            models.Index(fields=["job", "stream_seq"], name="sample_job_stream"),
        ]


class LogSource(models.TextChoices):
    """Who captured a log line: the engine's own reporter, or the launcher (stdout/stderr)."""

    ENGINE = "engine"
    LAUNCHER = "launcher"


class LogLine(models.Model):
    """One log line of one attempt. Its public ``seq`` is the row id: increasing within a job.

    ``source_seq`` is the sender's own sequence number; (job, attempt, source, source_seq) is
    unique, so a resent batch is stored once.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_lines")
    attempt = models.PositiveIntegerField()
    source = models.CharField(max_length=8, choices=LogSource.choices)
    source_seq = models.BigIntegerField()
    time = models.DateTimeField()
    stream = models.CharField(max_length=16)
    line = models.TextField()
    stream_seq = models.BigIntegerField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "source", "source_seq"], name="log_line_unique")
        ]
        indexes = [
            models.Index(fields=["job", "id"], name="log_job_order"),
            models.Index(fields=["job", "stream_seq"], name="log_job_stream"),
        ]


from jobs.webhooks.models import (  # noqa: E402,F401  (models of the jobs app)
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookMessage,
)
from jobs.secrets.models import JobSecrets  # noqa: E402,F401  (a model of the jobs app)
from jobs.evaluation_samples import EvaluationSample  # noqa: E402,F401  (a model of the jobs app)
from jobs.registry.models import Model, ModelBuild, ModelBuildStatus, ModelStatus  # noqa: E402,F401  (models of the jobs app)
