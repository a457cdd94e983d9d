"""Prime CLI 0.18.0's routes over Lab's jobs (docs/prime-compat.md): thin adapters over
``jobs.services``, ``jobs.selectors`` and ``billing.selectors``.

Authentication, scopes, rate limits and tenancy are the rest of the API's (``ProjectAPIView``):
a Lab API key as ``Authorization: Bearer``, another project's run is the same 404 as a missing
one. Errors leave as ``{"detail": ...}`` (``serializers.error_detail``). None of these routes is
in Lab's OpenAPI document, which describes Lab's own API.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone
from labsdk.spec.layouts import detect_layout
from rest_framework.request import Request
from rest_framework.response import Response

from billing.models import UsageInterval
from billing.selectors import usage_rows
from jobs.api.prime.serializers import (
    CHECKPOINT_STATUSES,
    RUN_STATUSES,
    RUN_TOKEN_PLACEHOLDER,
    checkpoint_to_dict,
    error_detail,
    run_to_dict,
)
from jobs.distributions import job_distribution
from jobs.models import Checkpoint, Job, JobKind, JobStatus, MetricStep
from jobs.pool import pool_nodes
from jobs.selectors import job_list, job_logs_tail, job_samples_page, metric_points, sample_steps
from jobs.serializers import jobs_to_dicts
from jobs.services import job_cancel, job_delete, job_restart, job_submit
from jobs.specs import installed_models
from lab.api.base import ProjectAPIView
from lab.api.errors import ApiError, FieldError
from lab.api.errors import exception_handler as lab_exception_handler
from lab.formats import iso
from lab.paging import int_param

#: Headers of Lab's error answers that Prime's clients read too.
_KEPT_HEADERS = ("Retry-After", "WWW-Authenticate")


def prime_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Answer as Lab's handler would, with the body reshaped to ``{"detail": ...}``."""
    response = lab_exception_handler(exc, context)
    if response is None:
        return None
    status, detail = error_detail(response.status_code, response.data)
    headers = {name: response[name] for name in _KEPT_HEADERS if response.has_header(name)}
    return Response({"detail": detail}, status=status, headers=headers)


def invalid_run(errors: list[FieldError]) -> ApiError:
    """Return the 400 ``invalid_run`` (422 on the wire) listing every problem of a run body."""
    message = errors[0].message if len(errors) == 1 else f"{len(errors)} problems in the request."
    return ApiError(400, "invalid_run", message, errors=errors)


class PrimeAPIView(ProjectAPIView):
    """Base of the Prime-compatible routes: Prime's error body, and runs looked up in the key's
    project (``run``)."""

    schema = None  # Lab's OpenAPI document describes Lab's own API only

    def get_exception_handler(self):
        return prime_exception_handler

    def run(self, run_id: str) -> Job:
        """Return this project's training job ``run_id`` or raise the 404 (``No such run.``): an
        evaluation's job is no run of Prime's training API."""
        return self.get_owned(Job.objects.select_related("created_by_key").filter(kind=JobKind.TRAINING), run_id, "run")

    def run_body(self, job: Job) -> dict[str, Any]:
        """Return ``{"run": RUN}`` for ``job`` as it is now."""
        return {"run": run_to_dict(job, jobs_to_dicts([job])[0])}


def _body(request: Request) -> Mapping[str, Any]:
    data = request.data if request.data is not None else {}
    if not isinstance(data, Mapping):
        raise invalid_run([FieldError(None, "invalid_type", "the request body must be a JSON object")])
    return data


def _optional_string(body: Mapping[str, Any], key: str, errors: list[FieldError], max_length: int = 4096) -> str | None:
    value = body.get(key)
    if value is not None and not (isinstance(value, str) and len(value) <= max_length):
        errors.append(FieldError(key, "invalid_type", f"{key} must be a string of at most {max_length} characters"))
        return None
    return value


#: Body keys of ``POST /training/runs`` (prime_cli ``build_payload_from_toml``) Lab has no use for:
#: a volume, a prime-rl source overlay, SFT mode and resuming a paused run.
_UNSUPPORTED_RUN_KEYS = {
    "volume": "Lab has no named volumes; a job's checkpoints are kept by Lab (prime train checkpoints)",
    "sourceRef": "Lab runs its own engine, not a prime-rl source ref (--ref, --pr)",
    "resumeFrom": "Lab resumes a stopped run in place: prime train restart RUN_ID",
    "normalizedConfig": "Lab validates the config itself on submission",
}
_RUN_KEYS = {"config", "name", "imageTag", "gpuType", "wandbApiKey", "hfToken", "teamId", "mode", *_UNSUPPORTED_RUN_KEYS}


class TrainingRunPrepareView(PrimeAPIView):
    """``POST /training/runs/prepare``: always 404, so the CLI skips its local validation and
    Lab validates the config when it is submitted."""

    required_scope = "read"

    def post(self, request: Request) -> Response:
        raise ApiError(404, "not_found", "Lab offers no local validation; it validates the config on submission.")


#: Why a run whose mode is not ``rl`` is refused (Prime's ``sft`` mode fine-tunes on a dataset), and
#: what Lab offers instead: a config of mode ``rl`` with ``loss = "sft"`` distils a ``[teacher]``.
MODE_REFUSED = (
    "mode must be 'rl': Lab trains on environments' prompts, not on a fixed dataset (mode 'sft'); "
    "to distil from a teacher model, send mode 'rl' with loss = \"sft\" and a [teacher] table in the config "
    "(docs/prime-compat.md)"
)


class TrainingRunCreateView(PrimeAPIView):
    """``POST /training/runs``: submit a prime-rl config as a Lab job.

    Body ``{"config": <the TOML as JSON>, "name"?, "gpuType"?, "wandbApiKey"?, "hfToken"?,
    "imageTag"?, "teamId"?}``; ``config`` goes to ``job_submit`` as the spec (prime-rl's native
    layout is translated there, ``labsdk.spec.layouts``), ``name`` and ``gpuType`` fill its
    ``name`` and ``gpu_type`` when the config has none, the two tokens become the job's
    ``WANDB_API_KEY``/``HF_TOKEN`` secrets. ``imageTag`` and ``teamId`` are ignored (Lab runs
    its own engine; the key names the project). Answers ``{"runId", "tokenValue", "gpuType"}``;
    422 listing every problem of the body or the spec, 402 when billing lets nothing run.
    """

    def post(self, request: Request) -> Response:
        body = _body(request)
        errors = [FieldError(key, "unknown_key", message) for key, message in _UNSUPPORTED_RUN_KEYS.items() if key in body]
        errors += [
            FieldError(str(key)[:64], "unknown_key", f"unknown key; use {', '.join(sorted(_RUN_KEYS - set(_UNSUPPORTED_RUN_KEYS)))}")
            for key in body
            if key not in _RUN_KEYS
        ]
        config = body.get("config")
        if not isinstance(config, Mapping):
            errors.append(FieldError("config", "invalid_type", "config must be the run's TOML config as a JSON object"))
        if body.get("mode") not in (None, "rl"):
            errors.append(FieldError("mode", "invalid_value", MODE_REFUSED))
        name = _optional_string(body, "name", errors, max_length=128)
        gpu_type = _optional_string(body, "gpuType", errors, max_length=32)
        secrets = {
            secret: value
            for secret, key in (("WANDB_API_KEY", "wandbApiKey"), ("HF_TOKEN", "hfToken"))
            if (value := _optional_string(body, key, errors))
        }
        for key in ("imageTag", "teamId"):
            _optional_string(body, key, errors, max_length=256)
        if errors:
            raise invalid_run(errors)
        spec = dict(config)
        if name:
            spec.setdefault("name", name)
        if gpu_type:
            if detect_layout(spec) == "prime-rl":
                spec.setdefault("gpu_type", gpu_type)
            elif isinstance(resources := spec.get("resources", {}), Mapping):  # else validation names it
                spec["resources"] = {"gpu_type": gpu_type, **resources}
        if secrets:
            spec["secrets"] = secrets
        job = job_submit(project=self.project, actor=self.actor, data=spec)
        return Response({"runId": job.public_id, "tokenValue": RUN_TOKEN_PLACEHOLDER, "gpuType": job.gpu_type})


class TrainingRunDeleteView(PrimeAPIView):
    """``DELETE /training/runs/{id}``: as ``DELETE /rft/runs/{id}``, answering ``{"runId", "deleted"}``."""

    def delete(self, request: Request, run_id: str) -> Response:
        job_delete(job=self.run(run_id), actor=self.actor)
        return Response({"runId": run_id, "deleted": True})


class TrainingRunPauseView(PrimeAPIView):
    """``POST /training/runs/{id}/pause``: Lab's cancel, which stops the engine after a
    checkpoint (``job_cancel``); answers ``{"status"}``. Lab has no separate paused state: the
    run ends STOPPED and ``resume`` restarts it from that checkpoint."""

    def post(self, request: Request, run_id: str) -> Response:
        job = job_cancel(job=self.run(run_id), actor=self.actor)
        return Response({"status": RUN_STATUSES[job.status]})


class TrainingRunResumeView(PrimeAPIView):
    """``POST /training/runs/{id}/resume``: Lab's restart of a stopped or failed job from its
    latest ready checkpoint (``job_restart``), the same job id again; answers ``{"runId",
    "tokenValue"}``. The job keeps its spec and secrets: a ``gpuType`` other than its own, or new
    tokens, are 422; 402 when billing lets nothing run."""

    def post(self, request: Request, run_id: str) -> Response:
        job = self.run(run_id)
        body = _body(request)
        errors = []
        gpu_type = _optional_string(body, "gpuType", errors, max_length=32)
        if gpu_type and gpu_type != job.gpu_type:
            errors.append(FieldError("gpuType", "invalid_value", f"a restarted job keeps its GPU type ({job.gpu_type})"))
        errors += [
            FieldError(key, "invalid_value", "a restarted job keeps the secrets it was submitted with")
            for key in ("wandbApiKey", "hfToken")
            if body.get(key) is not None
        ]
        errors += [FieldError(str(key)[:64], "unknown_key", "unknown key") for key in body if key not in ("gpuType", "imageTag", "wandbApiKey", "hfToken")]
        if errors:
            raise invalid_run(errors)
        job = job_restart(job=job, actor=self.actor)
        return Response({"runId": job.public_id, "tokenValue": RUN_TOKEN_PLACEHOLDER, "gpuType": job.gpu_type})


class RunListView(PrimeAPIView):
    """``GET /rft/runs?page=&limit=&mine=``: the project's jobs, newest first, as
    ``{"runs", "total", "page", "limit", "total_pages"}``. ``mine=true`` keeps the jobs this API
    key submitted; ``team_id`` is ignored (the key names the project)."""

    def get(self, request: Request) -> Response:
        params = request.query_params
        page = int_param(params, "page", minimum=1, maximum=10**6, default=1)
        limit = int_param(params, "limit", minimum=1, maximum=100, default=20)
        jobs = job_list(project=self.project).select_related("created_by_key").order_by("-pk")
        if params.get("mine", "").lower() == "true":
            jobs = jobs.filter(created_by_key=self.api_key)
        total = jobs.count()
        page_jobs = list(jobs[(page - 1) * limit : page * limit])
        runs = [run_to_dict(job, lab_job) for job, lab_job in zip(page_jobs, jobs_to_dicts(page_jobs))]
        return Response({"runs": runs, "total": total, "page": page, "limit": limit, "total_pages": math.ceil(total / limit)})


class RunDetailView(PrimeAPIView):
    """``GET /rft/runs/{id}`` → ``{"run"}``; ``DELETE /rft/runs/{id}`` deletes a finished job and
    its data (``job_delete``; 409 while it runs) → 204."""

    def get(self, request: Request, run_id: str) -> Response:
        return Response(self.run_body(self.run(run_id)))

    def delete(self, request: Request, run_id: str) -> Response:
        job_delete(job=self.run(run_id), actor=self.actor)
        return Response(status=204)


class RunStopView(PrimeAPIView):
    """``PUT /rft/runs/{id}/stop``: Lab's cancel (``job_cancel``: a queued job is STOPPED at
    once, a running one stops after a checkpoint) → ``{"run"}``; 409 for a finished job."""

    def put(self, request: Request, run_id: str) -> Response:
        return Response(self.run_body(job_cancel(job=self.run(run_id), actor=self.actor)))


class RunRestartView(PrimeAPIView):
    """``PUT /rft/runs/{id}/restart``: Lab's restart (``job_restart``: a failed or stopped job is
    queued again and resumes from its latest ready checkpoint) → ``{"run"}``; 409 otherwise; 402
    when billing lets nothing run."""

    def put(self, request: Request, run_id: str) -> Response:
        return Response(self.run_body(job_restart(job=self.run(run_id), actor=self.actor)))


#: Log queries of prime CLI that Lab cannot answer: Lab keeps one log per job, plain lines
#: without a level, searched by substring.
_UNSUPPORTED_LOG_FILTERS = {
    "component": "Lab keeps one log per job with every engine role in it; leave out --component and --env",
    "env_name": "Lab keeps one log per job with every engine role in it; leave out --component and --env",
    "pod_index": "Lab keeps one log per job with every engine role in it; leave out --component and --env",
    "level": "Lab's log lines carry no level; use --search",
    "regex": "Lab searches logs by substring; leave out --regex",
}


class RunLogsView(PrimeAPIView):
    """``GET /rft/runs/{id}/logs?tail_lines=&search=&since_seconds=`` → ``{"logs": "<lines>"}``,
    the last ``tail_lines`` (1-5,000, default 1,000) lines as ``<time> <line>``, oldest first.

    Before a queued or starting job has logged anything: 404 saying so, which ``prime train
    logs -f`` waits on. ``component``, ``level`` and ``regex`` are 400 (``_UNSUPPORTED_LOG_FILTERS``).
    """

    def get(self, request: Request, run_id: str) -> Response:
        job = self.run(run_id)
        params = request.query_params
        for name, message in _UNSUPPORTED_LOG_FILTERS.items():
            if params.get(name) not in (None, "", "false", "False"):
                raise ApiError(400, "invalid_request", message, param=name)
        tail = int_param(params, "tail_lines", minimum=1, maximum=5000, default=1000)
        since_seconds = int_param(params, "since_seconds", minimum=1, maximum=86_400, default=None)
        search = params.get("search") or ""
        if len(search) > 256 or "\x00" in search:
            raise ApiError(400, "invalid_request", "search takes at most 256 characters and no NUL.", param="search")
        since = timezone.now() - timedelta(seconds=since_seconds) if since_seconds else None
        lines = job_logs_tail(job=job, limit=tail, contains=search, since=since)
        if not lines and job.status in (JobStatus.QUEUED, JobStatus.STARTING):
            raise ApiError(404, "not_found", f"Logs are not available yet: the job is {job.status}.")
        return Response({"logs": "".join(f"{line['time']} {line['line']}\n" for line in lines)})


class RunMetricsView(PrimeAPIView):
    """``GET /rft/runs/{id}/metrics?min_step=&max_step=&limit=`` → ``{"metrics": [{"step",
    "time", name: value, ...}]}``: the first ``limit`` (1-10,000, default 10,000) steps from
    ``min_step`` to ``max_step`` (both included), in step order (``metric_points``)."""

    def get(self, request: Request, run_id: str) -> Response:
        job = self.run(run_id)
        params = request.query_params
        min_step = int_param(params, "min_step", minimum=0, maximum=10**9, default=0)
        max_step = int_param(params, "max_step", minimum=0, maximum=10**9, default=None)
        limit = int_param(params, "limit", minimum=1, maximum=10_000, default=10_000)
        points = metric_points(job=job, params={"after_step": str(min_step - 1), "limit": str(limit)})["data"]
        return Response({
            "metrics": [
                {"step": point["step"], "time": point["time"], **point["values"]}
                for point in points
                if max_step is None or point["step"] <= max_step
            ]
        })


class RunSamplesView(PrimeAPIView):
    """``GET /rft/runs/{id}/samples?step=&page=&limit=`` → ``{"run_id", "samples", "total",
    "page", "limit", "total_pages"}``: one page (``limit`` 1-1,000, default 100) of the step's
    rollout samples as in Lab's ``GET /jobs/{id}/samples``; ``step`` defaults to the latest."""

    def get(self, request: Request, run_id: str) -> Response:
        job = self.run(run_id)
        params = request.query_params
        page = int_param(params, "page", minimum=1, maximum=10**6, default=1)
        limit = int_param(params, "limit", minimum=1, maximum=1000, default=100)
        step = int_param(params, "step", minimum=0, maximum=10**9, default=None)
        if step is None:
            steps = sample_steps(job=job, limit=1)
            step = steps[0] if steps else 0
        samples, total = job_samples_page(job=job, step=step, page=page, limit=limit)
        return Response({
            "run_id": job.public_id, "samples": samples, "total": total, "page": page, "limit": limit,
            "total_pages": math.ceil(total / limit),
        })


class RunProgressView(PrimeAPIView):
    """``GET /rft/runs/{id}/progress`` → ``{"latestStep", "stepsWithSamples",
    "stepsWithDistributions", "lastUpdatedAt"}``: the job's step, the steps with rollout
    samples (each also has reward and advantage distributions), and the time of its latest
    metric point (or its latest change before the first)."""

    def get(self, request: Request, run_id: str) -> Response:
        job = self.run(run_id)
        run = run_to_dict(job, jobs_to_dicts([job])[0])
        steps = sorted(sample_steps(job=job, limit=10_000))
        latest_metric = MetricStep.objects.filter(job=job).order_by("-step").values_list("time", flat=True).first()
        return Response({
            "latestStep": job.step,
            "stepsWithSamples": steps,
            "stepsWithDistributions": steps,
            "lastUpdatedAt": _iso_or(latest_metric, run["updatedAt"]),
        })


def _iso_or(moment, fallback: str) -> str:
    return iso(moment) if moment is not None else fallback


class RunDistributionsView(PrimeAPIView):
    """``GET /rft/runs/{id}/distributions?type=&step=`` → ``{"bins": [{"min", "max", "count"}],
    "step", "type", "count", "mean"}``: Lab's histogram of the step's rollout rewards (``type``
    ``reward``/``rewards``, the default) or advantages (``advantage``/``advantages``), as
    ``GET /api/v1/jobs/{id}/distributions`` answers it (``jobs.distributions``)."""

    def get(self, request: Request, run_id: str) -> Response:
        job = self.run(run_id)
        params = request.query_params
        kind = (params.get("type") or "reward").lower().removesuffix("s")
        distribution = job_distribution(job=job, params={"type": kind, "step": params.get("step") or ""})
        return Response({
            "bins": [{"min": item["low"], "max": item["high"], "count": item["count"]} for item in distribution["bins"]],
            "step": distribution["step"],
            "type": distribution["type"],
            "count": distribution["count"],
            "mean": distribution["mean"],
        })


class RunCheckpointsView(PrimeAPIView):
    """``GET /rft/runs/{id}/checkpoints?status_filter=`` → ``{"checkpoints": [...]}``, highest step
    first; ``status_filter`` is one of READY, PENDING, UPLOADING, FAILED, DELETED (any case)."""

    def get(self, request: Request, run_id: str) -> Response:
        job = self.run(run_id)
        checkpoints = Checkpoint.objects.filter(job=job).select_related("job").order_by("-step", "-id")
        wanted = request.query_params.get("status_filter")
        if wanted:
            by_prime_status = {prime: lab for lab, prime in CHECKPOINT_STATUSES.items()}
            if wanted.upper() not in by_prime_status:
                message = f"status_filter must be one of {', '.join(by_prime_status)}."
                raise ApiError(400, "invalid_request", message, param="status_filter")
            checkpoints = checkpoints.filter(status=by_prime_status[wanted.upper()])
        return Response({
            "checkpoints": [
                checkpoint_to_dict(checkpoint, storage_url=request.build_absolute_uri(
                    reverse("api-checkpoint-download", kwargs={"checkpoint_id": checkpoint.public_id})
                ))
                for checkpoint in checkpoints
            ]
        })


class RunUsageView(PrimeAPIView):
    """``GET /billing/runs/{id}/usage``: the job's usage from Lab's ledger (``usage_rows``) in
    Prime's shape. Lab bills GPU- and CPU-seconds, not tokens: the cost is under ``training``,
    token counts and per-token prices are 0 and null, and ``gpu_seconds``/``cpu_seconds`` are
    added; ``record_count`` is the number of ledger intervals."""

    def get(self, request: Request, run_id: str) -> Response:
        job = self.run(run_id)
        rows = usage_rows(
            organization_id=self.project.organization_id,
            project_id=self.project.pk,
            start=job.created_at,
            end=timezone.now() + timedelta(seconds=1),
            group_by=("job",),
            job_public_id=job.public_id,
        )
        totals = rows[0] if rows else {"gpu_seconds": 0.0, "cpu_seconds": 0.0, "cost_usd": 0}
        cost = float(totals["cost_usd"])
        nothing = {"tokens": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
        return Response({
            "run_id": job.public_id,
            "run_name": job.name or None,
            "base_model": job.model,
            "status": RUN_STATUSES[job.status],
            "training": {**nothing, "cost_usd": cost},
            "inference": nothing,
            "total_tokens": 0,
            "total_cost_usd": cost,
            "pricing": {"training_per_mtok": None, "inference_input_per_mtok": None, "inference_output_per_mtok": None},
            "record_count": UsageInterval.objects.for_project(self.project).filter(job_public_id=job.public_id).count(),
            "gpu_seconds": totals["gpu_seconds"],
            "cpu_seconds": totals["cpu_seconds"],
        })


class AvailableModelsView(PrimeAPIView):
    """``GET /training/available-fft-models`` → ``{"models": [{"name", "clusters": [{"clusterId",
    "clusterName", "gpuType"}]}]}``: Lab's model catalogue, each model on every GPU type of the
    pool (``pool_nodes``)."""

    def get(self, request: Request) -> Response:
        gpu_types = sorted({group.gpu_type for group in pool_nodes()})
        clusters = [{"clusterId": f"lab-{gpu_type}", "clusterName": f"Lab pool ({gpu_type})", "gpuType": gpu_type} for gpu_type in gpu_types]
        return Response({"models": [{"name": model_id, "clusters": clusters} for model_id in sorted(installed_models(self.project.organization))]})


class AvailableGpuTypesView(PrimeAPIView):
    """``GET /training/available-gpu-types`` → ``{"gpuTypes": [...]}``: the pool's GPU types
    (``cpu`` for the local CPU pool), any of which ``--gpu-type`` takes."""

    def get(self, request: Request) -> Response:
        return Response({"gpuTypes": sorted({group.gpu_type for group in pool_nodes()})})


class UnsupportedRouteView(PrimeAPIView):
    """Every other path under ``/prime/api/v1/``: a JSON 404 naming the page that lists what is
    supported (volumes, sandboxes, pods, the environment hub, ...)."""

    required_scope = "read"

    def _not_here(self, request: Request, path: str = "") -> Response:
        raise ApiError(404, "not_found", "Lab's Prime-compatible API does not serve this route; see docs/prime-compat.md.")

    get = post = put = patch = delete = _not_here
