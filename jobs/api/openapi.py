"""OpenAPI components of the job and catalogue bodies (docs/api.md), as ``jobs/serializers.py``
and ``jobs/estimates.py`` build them; the job spec is labsdk's own JSON Schema, not restated.

Each name below is a ``$ref`` for ``@extend_schema`` in ``jobs/api/views.py``;
``tests/lab/test_openapi.py`` checks real answers against them.
"""

from __future__ import annotations

from labsdk.spec import job_spec_json_schema

from jobs.models import AdapterStatus, CheckpointFormat, CheckpointStatus, EventLevel, JobKind, JobPriority, JobStatus
from lab.api.schema import (
    BOOLEAN,
    FREE_OBJECT,
    INTEGER,
    MONEY,
    NUMBER,
    STRING,
    TIMESTAMP,
    component,
    json_schema_component,
    list_component,
    nullable,
    obj,
)

_VALUES = {"type": "object", "additionalProperties": NUMBER, "description": "metric name: value"}


def _enum(values) -> dict:
    return {"type": "string", "enum": list(values)}


JOB_SPEC = json_schema_component("JobSpec", job_spec_json_schema())


def _job_create_schema() -> dict:
    """The body of ``POST /jobs`` and ``/jobs/estimate``: the spec's keys and, beside them, the
    write-only ``secrets`` (jobs.secrets.services says what is refused)."""
    schema = job_spec_json_schema()
    schema["properties"]["secrets"] = {
        "type": ["object", "null"],
        "writeOnly": True,
        "maxProperties": 100,
        "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "additionalProperties": {"type": "string"},
        "description": "Job secrets, NAME -> value: stored encrypted, given to the job's engine process as "
        "environment variables, never answered; at most 64 KB in all; LAB_* and the names that steer a process "
        "(PATH, PYTHONPATH, LD_PRELOAD, HOME, ...) are refused.",
    }
    return schema


JOB_CREATE = json_schema_component("JobCreate", _job_create_schema())

CHECKPOINT = component(
    "Checkpoint",
    obj(
        {
            "id": STRING,
            "object": {"const": "checkpoint"},
            "job_id": STRING,
            "step": INTEGER,
            "attempt": INTEGER,
            "status": _enum(CheckpointStatus.values),
            "format": _enum(CheckpointFormat.values),
            "size_bytes": nullable(INTEGER),
            "sha256": nullable(STRING),
            "created_at": TIMESTAMP,
        },
        description="A checkpoint of a job (ckpt_...); only ready ones can be downloaded.",
    ),
)
CHECKPOINT_LIST = list_component("Checkpoint", "A job's checkpoints, newest first.")

ADAPTER = component(
    "Adapter",
    obj(
        {
            "id": STRING,
            "object": {"const": "adapter"},
            "job_id": STRING,
            "step": INTEGER,
            "attempt": INTEGER,
            "status": _enum(AdapterStatus.values),
            "format": _enum(CheckpointFormat.values),
            "size_bytes": nullable(INTEGER),
            "sha256": nullable(STRING),
            "created_at": TIMESTAMP,
        },
        description="An adapter artifact of a job (adp_...): the trained weights alone, loadable with peft, "
        "without optimizer state; only ready ones can be downloaded.",
    ),
)
ADAPTER_LIST = list_component("Adapter", "A job's adapters, newest first.")

JOB_ERROR = component(
    "JobError",
    obj(
        {
            "code": STRING | {"description": "invalid_spec, oom, max_restarts_exceeded, heartbeat_lost, ..."},
            "message": STRING,
        },
        description="Why a job failed.",
    ),
)
JOB = component(
    "Job",
    obj(
        {
            "id": STRING,
            "object": {"const": "job"},
            "kind": _enum(JobKind.values)
            | {"description": "training, or evaluation: the job of an evaluation (its metadata.evaluation), which never trains"},
            "name": STRING,
            "status": _enum(JobStatus.values),
            "status_reason": nullable(STRING) | {"description": "why a queued job waits (waiting, pool_full, ...)"},
            "queue_position": nullable(INTEGER),
            "priority": _enum(JobPriority.labels),
            "spec": JOB_SPEC,
            "warnings": {"type": "array", "items": STRING, "description": "spec keys accepted but ignored"},
            "attempt": INTEGER,
            "step": INTEGER,
            "max_steps": INTEGER,
            "phase": nullable(_enum(["loading", "running", "checkpointing", "finishing"]))
            | {"description": "the engine's phase from its latest heartbeat while the job starts or runs"},
            "created_at": TIMESTAMP,
            "started_at": nullable(TIMESTAMP),
            "finished_at": nullable(TIMESTAMP),
            "error": nullable(JOB_ERROR),
            "usage": obj({"gpu_seconds": NUMBER, "cpu_seconds": NUMBER, "cost_usd": MONEY}),
            "latest_checkpoint": nullable(CHECKPOINT),
            "metadata": {"type": "object", "additionalProperties": STRING},
        },
        description="A job (job_...): its kind, its spec as stored (defaults filled in), status and progress.",
        optional=("phase", "kind"),  # absent from the snapshots stored before Lab reported them
    ),
)
JOB_LIST = list_component("Job", "Jobs, newest first.")

JOB_EVENT = component(
    "JobEvent",
    obj(
        {
            "id": STRING,
            "object": {"const": "event"},
            "job_id": STRING,
            "created_at": TIMESTAMP,
            "level": _enum(EventLevel.values),
            "type": STRING | {"description": "job.queued, job.started, checkpoint.ready, ..."},
            "message": STRING,
            "data": FREE_OBJECT,
        },
        description="Something that happened to a job (evt_...).",
    ),
)
JOB_EVENT_LIST = list_component("JobEvent", "A job's events, oldest first.")

METRIC_POINT = component(
    "MetricPoint",
    obj({"step": INTEGER, "time": TIMESTAMP, "attempt": INTEGER, "values": _VALUES}, description="One step's metrics."),
)
METRIC_POINT_LIST = list_component("MetricPoint", "Metric points in step order.")

ROLLOUT_SAMPLE = component(
    "RolloutSample",
    obj(
        {
            "step": INTEGER,
            "attempt": INTEGER,
            "group": INTEGER,
            "prompt": STRING,
            "completion": STRING,
            "reward": NUMBER,
            "advantage": NUMBER,
            "metrics": _VALUES,
        },
        description="One rollout of a step: prompt, completion, reward and its advantage in its group.",
    ),
)
ROLLOUT_SAMPLE_LIST = list_component("RolloutSample", "Rollouts of one step, by group.")

LOG_LINE = component(
    "LogLine",
    obj(
        {"seq": INTEGER, "time": TIMESTAMP, "attempt": INTEGER, "stream": STRING, "line": STRING},
        description="One log line; seq increases, pass the last one seen as after.",
    ),
)
LOG_LINE_LIST = list_component("LogLine", "Log lines in order.")

ESTIMATE = component(
    "Estimate",
    obj(
        {
            "gpu_seconds": NUMBER,
            "cpu_seconds": NUMBER,
            "cost_usd": MONEY,
            "queue_position": INTEGER,
            "can_start_now": BOOLEAN,
            "reason": nullable(STRING),
            "warnings": {"type": "array", "items": STRING},
        },
        description="What a spec would cost and where it would queue; nothing is created.",
    ),
)

MODEL_BUILD = component(
    "ModelBuild",
    obj(
        {
            "number": INTEGER,
            "status": _enum(["queued", "running", "ready", "failed"]),
            "error": nullable(STRING),
            "revision": nullable(STRING),
            "archive_sha256": STRING,
            "archive_size_bytes": INTEGER,
            "created_at": TIMESTAMP,
            "started_at": nullable(TIMESTAMP),
            "finished_at": nullable(TIMESTAMP),
        },
        description="A check of a pushed model archive: queued, running, ready (its files are the model's) or failed (error says why).",
    ),
)

MODEL = component(
    "Model",
    obj(
        {
            "id": STRING,
            "object": {"const": "model"},
            "status": _enum(["ready", "checking", "failed"]),
            "family": STRING,
            "architecture": STRING,
            "parameters": nullable(INTEGER),
            "active_parameters": nullable(INTEGER),
            "context_length": INTEGER,
            "chat_template": BOOLEAN,
            "tool_call_format": nullable(STRING),
            "modes": {"type": "array", "items": {"enum": ["lora", "full"]}},
            "lora_target_modules": {"oneOf": [{"type": "array", "items": STRING}, {"const": "all-linear"}]},
            "memory_gb": {"type": "object", "additionalProperties": NUMBER},
            "revision": STRING,
            "size_bytes": INTEGER,
            "licence": STRING,
            "description": STRING,
            "source": _enum(["builtin", "local", "hub", "directory", "push"]),
            "owned_by": nullable(STRING),
            "build": nullable(MODEL_BUILD),
        },
        description=(
            "A model of the registry: offered to everyone (owned_by null) or the organization's own; "
            "only a ready model trains; memory_gb is the estimated GPU memory of each training mode in GB; "
            "build is the latest check of a pushed model."
        ),
    ),
)
MODEL_LIST = list_component("Model", "The models this organization sees: those offered to everyone and its own.")

ENVIRONMENT_BUILD = component(
    "EnvironmentBuild",
    obj(
        {
            "number": INTEGER,
            "status": _enum(["queued", "running", "ready", "failed"]),
            "error": nullable(STRING),
            "index_url": STRING,
            "index_snapshot_at": TIMESTAMP,
            "python": nullable(STRING),
            "api": nullable(_enum(["lab", "v0", "v1"])),
            "environment_class": nullable(STRING),
            "args": FREE_OBJECT | {"description": "load_environment's (or the taskset's) arguments with their defaults"},
            "parameters": {"type": "array", "items": FREE_OBJECT},
            "dataset_size": nullable(INTEGER),
            "hub_datasets": nullable(obj({
                "sha256": STRING, "size_bytes": INTEGER, "files": INTEGER, "repositories": {"type": "array", "items": STRING},
            })) | {"description": "the Hugging Face Hub datasets loading fetched, kept beside the build for its jobs (null: none)"},
            "reward_functions": {"type": "array", "items": obj(
                {"name": STRING, "weight": NUMBER,
                 "runtime": BOOLEAN | {"description": "true: a v1 reward function that takes a runtime, scored in a sandbox of the job's attempt"}},
                optional=("runtime",),
            )},
            "secrets": {"type": "array", "items": STRING},
            "verifiers_version": nullable(STRING),
            "multi_turn": nullable(BOOLEAN) | {"description": "its episodes have several turns (null: not recorded by this build)"},
            "lock": {"type": "array", "items": obj({"name": STRING, "version": STRING, "sha256": STRING})},
            "created_at": TIMESTAMP,
            "started_at": nullable(TIMESTAMP),
            "finished_at": nullable(TIMESTAMP),
        },
        description="A build of an uploaded environment version: its lock, and what loading it found.",
    ),
)

ENVIRONMENT = component(
    "Environment",
    obj(
        {
            "id": STRING | {"description": "built-in lab/<name>, or uploaded <organization slug>/<name>@<version>"},
            "object": {"const": "environment"},
            "kind": _enum(["builtin", "verifiers", "lab"]),
            "name": STRING,
            "version": nullable(STRING),
            "sha256": nullable(STRING),
            "size_bytes": nullable(INTEGER),
            "created_at": nullable(TIMESTAMP),
            "description": STRING,
            "args": FREE_OBJECT | {"description": "the arguments it takes, with their defaults (uploaded: checked by the package)"},
            "entry_point": nullable(STRING),
            "dependencies": {"type": "array", "items": STRING},
            "verifiers_version": nullable(STRING),
            "pushed_by": nullable(STRING),
            "build": nullable(ENVIRONMENT_BUILD) | {"description": "the latest build (uploaded versions, one at a time)"},
        },
        optional=("build",),
        description="An environment: a built-in, or a version of an organization's uploaded package.",
    ),
)
ENVIRONMENT_LIST = list_component("Environment", "The installed environments.")

PRICE = component(
    "Price",
    obj(
        {
            "object": {"const": "price"},
            "resource_type": STRING,
            "usd_per_hour": MONEY,
            "unit": _enum(["job_hour", "gpu_hour", "core_hour", "gb_hour"]),
            "description": STRING,
        },
        description="USD per hour of one resource type.",
    ),
)
PRICE_LIST = list_component("Price", "The price table.")

JSON_SCHEMA_DOCUMENT = FREE_OBJECT | {"description": "a JSON Schema (draft 2020-12) document"}
