"""Typed objects returned by the SDK, in the shapes of docs/api.md.

Every class keeps fields a newer server adds (``extra="allow"``: read them as attributes or
through :meth:`LabObject.to_dict`), and fields it leaves out default to ``None``, so an SDK
older or newer than the server still reads its answers. Timestamps are timezone-aware
``datetime``; money is ``Decimal`` USD; durations are seconds.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from labsdk.display import format_bytes

__all__ = [
    "TERMINAL_JOB_STATUSES",
    "Checkpoint",
    "Environment",
    "EnvironmentBuild",
    "Estimate",
    "Job",
    "JobError",
    "JobEvent",
    "LabObject",
    "LogLine",
    "MetricPoint",
    "Model",
    "ModelBuild",
    "Price",
    "Sample",
    "StreamEvent",
    "Usage",
    "WhoAmI",
]

#: Job statuses after which nothing changes (docs/api.md).
TERMINAL_JOB_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class LabObject(BaseModel):
    """Base of the SDK's objects: tolerant of unknown fields."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    def to_dict(self) -> dict[str, Any]:
        """Return the object as JSON-able data, unknown fields included."""
        return self.model_dump(mode="json")


class JobError(LabObject):
    """Why a job failed: ``code`` such as ``oom`` or ``max_restarts_exceeded``."""

    code: str | None = None
    message: str | None = None


class Usage(LabObject):
    """Resources a job used so far: seconds of GPU and CPU time and their cost in USD."""

    gpu_seconds: float | None = None
    cpu_seconds: float | None = None
    cost_usd: Decimal | None = None


class Artifact(LabObject):
    """What a checkpoint and an adapter share, one wire format: ``id``, the job and ``step`` it
    belongs to, the ``attempt`` that wrote it, ``status``, ``format`` (``peft-lora`` or
    ``hf-full``), ``size_bytes`` and ``sha256`` of its tar (``None`` until it is ready)."""

    id: str
    job_id: str | None = None
    step: int | None = None
    attempt: int | None = None
    status: str | None = None
    format: str | None = None
    size_bytes: int | None = None
    sha256: str | None = None
    created_at: datetime | None = None

    def __repr_args__(self):
        """Show ``size_bytes`` as a size in the units of ``labsdk.display.format_bytes``."""
        for name, value in super().__repr_args__():
            yield ("size", format_bytes(value)) if name == "size_bytes" and value is not None else (name, value)


class Adapter(Artifact):
    """An adapter artifact (``[adapters]``): the trained weights alone, loadable with peft, without
    optimizer state. ``status`` is ``uploading``, ``ready``, ``failed`` or ``deleted``."""


class Checkpoint(Artifact):
    """A checkpoint: ``status`` is ``pending``, ``uploading``, ``ready``, ``failed`` or ``deleted``."""


class Job(LabObject):
    """A job. ``kind`` is ``training`` or ``evaluation`` (the job of an evaluation, named by its
    ``metadata["evaluation"]``; ``None`` from an older Lab); ``status`` is one of ``queued``,
    ``starting``, ``running``, ``cancelling``, ``succeeded``, ``failed``, ``cancelled``; ``step``
    counts finished training steps out of ``max_steps``; ``spec`` is the canonical spec as stored."""

    id: str
    object: str = "job"
    kind: str | None = None
    name: str | None = None
    status: str | None = None
    status_reason: str | None = None
    queue_position: int | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    attempt: int | None = None
    step: int | None = None
    max_steps: int | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: JobError | None = None
    usage: Usage | None = None
    latest_checkpoint: Checkpoint | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    #: The engine's phase from its latest heartbeat while the job starts or runs (``loading``,
    #: ``running``, ``checkpointing``, ``finishing``); ``None`` otherwise or from an older Lab.
    phase: str | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether the job has finished (succeeded, failed or cancelled)."""
        return self.status in TERMINAL_JOB_STATUSES


class JobEvent(LabObject):
    """One entry of a job's history: ``type`` such as ``job.started``, ``level`` ``info``,
    ``warning`` or ``error``; ``data`` depends on the type."""

    id: str
    created_at: datetime | None = None
    level: str | None = None
    type: str | None = None
    message: str | None = None
    data: Any = None


class MetricPoint(LabObject):
    """The metrics of one training step: ``values`` maps names like ``reward/mean`` to
    floats; ``time`` is when the step ended."""

    step: int
    time: datetime | None = None
    attempt: int | None = None
    values: dict[str, float | None] = Field(default_factory=dict)


class LogLine(LabObject):
    """One line a job's engine wrote: ``seq`` orders lines within an attempt; ``stream`` is
    ``stdout`` or ``stderr``."""

    seq: int
    time: datetime | None = None
    attempt: int | None = None
    stream: str | None = None
    line: str = ""


class Sample(LabObject):
    """One rollout of a training step: ``group`` is its GRPO group, ``reward`` what the
    environment gave it, ``advantage`` its reward relative to its group."""

    step: int | None = None
    group: int | None = None
    prompt: Any = None
    completion: Any = None
    reward: float | None = None
    advantage: float | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)


class DistributionBin(LabObject):
    """One bin of a :class:`Distribution`: ``count`` values in [``low``, ``high``)."""

    low: float | None = None
    high: float | None = None
    count: int = 0


class Distribution(LabObject):
    """A histogram of one step's stored rollout rewards or advantages (``type``), from ``count``
    samples, with their ``min``, ``max`` and ``mean`` (``GET /jobs/{id}/distributions``)."""

    job_id: str | None = None
    step: int | None = None
    type: str | None = None
    count: int = 0
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    bins: list[DistributionBin] = Field(default_factory=list)


class ModelBuild(LabObject):
    """One check of a pushed model archive (docs/models.md): ``status`` ``queued``, ``running``,
    ``ready`` (``revision`` is the stored revision it made) or ``failed`` (``error`` says why)."""

    number: int | None = None
    status: str | None = None
    error: str | None = None
    revision: str | None = None
    archive_sha256: str | None = None
    archive_size_bytes: int | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class Model(LabObject):
    """A model of the registry (docs/models.md): ``status`` ``ready`` (a job may train it),
    ``checking`` or ``failed`` (a pushed model whose check has not passed); ``context_length`` in
    tokens; ``parameters`` in all and ``active_parameters`` per token (mixtures of experts);
    ``modes`` ``lora`` and ``full``; ``memory_gb`` the estimated GPU memory per mode; ``owned_by``
    the organization's slug (None: offered to everyone); ``build`` the latest check of a pushed one."""

    id: str
    status: str | None = None
    family: str | None = None
    architecture: str | None = None
    context_length: int | None = None
    parameters: int | None = None
    active_parameters: int | None = None
    chat_template: bool | None = None
    tool_call_format: str | None = None
    modes: list[str] = Field(default_factory=list)
    memory_gb: dict[str, float] = Field(default_factory=dict)
    revision: str | None = None
    size_bytes: int | None = None
    licence: str | None = None
    description: str | None = None
    source: str | None = None
    owned_by: str | None = None
    build: ModelBuild | None = None


class EnvironmentBuild(LabObject):
    """One build of an uploaded package version (docs/environments.md "Builds"): ``status`` is
    ``queued``, ``running``, ``ready`` or ``failed`` (``error`` says why); what loading it found:
    ``api`` (``lab``, ``v0`` for ``load_environment``, ``v1``), ``environment_class``,
    ``parameters`` (``[{"name", "default", "type", "required"}]``) and ``args`` (their defaults),
    ``dataset_size``, ``reward_functions`` (``[{"name", "weight"}]``), ``secrets``, ``multi_turn``
    (its episodes have several turns; None for a build that did not record it); its ``lock``
    (``[{"name", "version", "sha256"}]``)."""

    number: int | None = None
    status: str | None = None
    error: str | None = None
    index_url: str | None = None
    index_snapshot_at: datetime | None = None
    python: str | None = None
    api: str | None = None
    environment_class: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    parameters: list[dict[str, Any]] = Field(default_factory=list)
    dataset_size: int | None = None
    reward_functions: list[dict[str, Any]] = Field(default_factory=list)
    secrets: list[str] = Field(default_factory=list)
    verifiers_version: str | None = None
    multi_turn: bool | None = None
    lock: list[dict[str, Any]] = Field(default_factory=list)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class Environment(LabObject):
    """An environment: a built-in (``kind`` ``builtin``, ``lab/<name>``) or a version of an
    organization's uploaded package (``kind`` ``verifiers`` or ``lab``, id
    ``<organization slug>/<name>@<version>``, with its wheel's ``sha256`` and ``size_bytes``).
    ``args`` are a built-in's arguments with their defaults (an uploaded package checks its own);
    ``build`` an uploaded version's latest build (None for a built-in)."""

    id: str
    kind: str | None = None
    name: str | None = None
    version: str | None = None
    sha256: str | None = None
    size_bytes: int | None = None
    created_at: datetime | None = None
    description: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    entry_point: str | None = None
    dependencies: list[str] = Field(default_factory=list)
    verifiers_version: str | None = None
    pushed_by: str | None = None
    build: EnvironmentBuild | None = None


class Price(LabObject):
    """One row of the price table: USD per hour of a resource type, per GPU for a GPU type
    (``H100``), per job for ``cpu`` (local runs)."""

    resource_type: str | None = None
    usd_per_hour: Decimal | None = None
    description: str | None = None
    updated_at: datetime | None = None


class Estimate(LabObject):
    """What a spec would cost and when it could start, from ``POST /jobs/estimate``."""

    gpu_seconds: float | None = None
    cpu_seconds: float | None = None
    cost_usd: Decimal | None = None
    queue_position: int | None = None
    can_start_now: bool | None = None
    reason: str | None = None
    warnings: list[str] = Field(default_factory=list)


class Named(LabObject):
    """An organization or project as ``whoami`` names it."""

    id: str | None = None
    slug: str | None = None
    name: str | None = None


class WhoAmI(LabObject):
    """The organization and project an API key belongs to, and its scopes."""

    organization: Named | None = None
    project: Named | None = None
    scopes: list[str] = Field(default_factory=list)


class StreamEvent(LabObject):
    """One event of a job's live stream (``GET /jobs/{id}/stream``, docs/live-stream.md).

    ``event`` is ``status`` (``data`` a :class:`Job`), ``metrics`` (:class:`MetricPoint`),
    ``sample`` (:class:`Sample`), ``checkpoint`` (:class:`Checkpoint`), ``log``
    (:class:`LogLine`) or ``event`` (:class:`JobEvent`); other types keep the decoded JSON.
    ``id`` is the per-job sequence number (``None`` on the snapshot sent at each connection).
    """

    event: str
    id: str | None = None
    data: Any = None
