"""Lab's objects in the shapes prime CLI 0.18.0 reads (``prime_cli/api/rl.py``, ``training.py``,
``billing.py``): camelCase run and checkpoint objects, Prime's upper-case statuses, and Lab's
errors as FastAPI-style ``{"detail": ...}`` bodies."""

from __future__ import annotations

from typing import Any

from jobs.models import Checkpoint, CheckpointStatus, Job, JobStatus
from lab.formats import iso

#: Lab's job status → the run status prime CLI knows (``RUN_STATUS_COLORS`` there). A job that is
#: cancelling still runs until its engine has checkpointed and stopped, so it reads RUNNING.
RUN_STATUSES = {
    JobStatus.QUEUED: "QUEUED",
    JobStatus.STARTING: "PENDING",
    JobStatus.RUNNING: "RUNNING",
    JobStatus.CANCELLING: "RUNNING",
    JobStatus.SUCCEEDED: "COMPLETED",
    JobStatus.FAILED: "FAILED",
    JobStatus.CANCELLED: "STOPPED",
}

#: Lab's checkpoint status → Prime's (READY, PENDING, UPLOADING, FAILED; Lab also has DELETED).
CHECKPOINT_STATUSES = {status: status.upper() for status in CheckpointStatus.values}

#: What ``POST /training/runs`` answers as ``tokenValue``. Prime's platform mints a run token
#: there; Lab gives each attempt's engine its own job token instead, so the CLI (which needs the
#: field but never uses or prints it) gets this fixed text, never a credential.
RUN_TOKEN_PLACEHOLDER = "lab:not-a-credential"


def run_to_dict(job: Job, lab_job: dict[str, Any]) -> dict[str, Any]:
    """Return ``job`` as Prime's run object (``RLRun``), from its Lab Job object ``lab_job``
    (``jobs.serializers.jobs_to_dicts``, so queue places and the rest are read once).

    ``userId`` is the public id of the API key that submitted the job (``""`` for one made in
    the dashboard); ``updatedAt`` is the latest of the job's timestamps; ``runsAhead`` is the
    number of jobs before it in the queue.
    """
    spec = lab_job["spec"]
    position = lab_job["queue_position"]
    error = lab_job["error"]
    moments = [moment for moment in (job.created_at, job.queued_at, job.started_at, job.finished_at) if moment]
    return {
        "id": lab_job["id"],
        "name": lab_job["name"] or None,
        "userId": job.created_by_key.public_id if job.created_by_key_id else "",
        "status": RUN_STATUSES[lab_job["status"]],
        "baseModel": spec.get("model"),
        "environments": [{"id": env.get("id"), "name": env.get("name") or env.get("id")} for env in spec.get("env", [])],
        "maxSteps": lab_job["max_steps"],
        "batchSize": spec.get("batch_size"),
        "rolloutsPerExample": spec.get("rollouts_per_example"),
        "maxTokens": (spec.get("sampling") or {}).get("max_tokens"),
        "learningRate": spec.get("learning_rate"),
        "loraAlpha": spec.get("lora_alpha") if spec.get("lora_rank") else None,
        "gpuCount": job.gpus,
        "runsAhead": position - 1 if position is not None else None,
        "queueReason": lab_job["status_reason"],
        "startedAt": lab_job["started_at"],
        "completedAt": lab_job["finished_at"],
        "errorMessage": f"{error['code']}: {error['message']}" if error else None,
        "failureAnalysis": None,
        "createdAt": lab_job["created_at"],
        "updatedAt": iso(max(moments)),
    }


def checkpoint_to_dict(checkpoint: Checkpoint, *, storage_url: str) -> dict[str, Any]:
    """Return ``checkpoint`` as Prime's checkpoint object (``RLCheckpoint``); ``storageUrl`` is
    where Lab serves its archive (``GET /api/v1/checkpoints/{id}/download``)."""
    return {
        "id": checkpoint.public_id,
        "rftRunId": checkpoint.job.public_id,
        "step": checkpoint.step,
        "storageUrl": storage_url,
        "status": CHECKPOINT_STATUSES[checkpoint.status],
        "sizeBytes": checkpoint.size_bytes,
        "createdAt": iso(checkpoint.created_at),
        "uploadedAt": iso(checkpoint.ready_at),
    }


def error_detail(status: int, body: dict[str, Any]) -> tuple[int, Any]:
    """Return the status and ``detail`` Prime's clients read for Lab's error ``body``
    (``{"error": {"code", "message", "errors": [{"param", "code", "message"}]}}``).

    A refused spec (400 ``invalid_spec``) or run body (400 ``invalid_run``) becomes 422 with
    FastAPI's ``[{"loc", "msg", "type"}]``, one entry per problem (``loc`` is ``"body"`` then
    the dotted ``param`` split, list indexes as numbers), which the CLI prints one per line
    (``prime_cli.core.client.ValidationError``). Every other error keeps its status, with Lab's
    message as the ``detail`` string the CLI prints after ``HTTP <status>:``.
    """
    error = body["error"]
    if status == 400 and error["code"] in ("invalid_spec", "invalid_run") and error["errors"]:
        return 422, [
            {"loc": ["body", *_location(item["param"])], "msg": item["message"], "type": item["code"]}
            for item in error["errors"]
        ]
    return status, error["message"]


def _location(param: str | None) -> list[str | int]:
    return [int(part) if part.isdigit() else part for part in (param or "").split(".") if part]
