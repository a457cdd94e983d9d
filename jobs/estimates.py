"""Estimates of a job's run time, GPU/CPU-seconds and cost before it is submitted.

The run time is a rough throughput model, not a promise:
``seconds = startup + max_steps × batch_size × max_tokens / tokens_per_s``, where
``tokens_per_s = device_rate / parameters``. ``device_rate`` (parameters × tokens per second) is
7.4e9 on the local CPU pool (SmolLM2-135M measured at ~55 tokens/s, generation and training
together, on 2 cores) and 7.4e12 per H100 (about 12.3k trainer tokens/s on a 0.6B model, as
prime-rl reports), scaled for other GPU types. Models of unknown size count as 1M parameters.
"""

from __future__ import annotations

from typing import Any

from billing.pricing import cost_usd, list_cost_micro_usd
from jobs.models import JobPriority, StatusReason
from jobs.queue import place_of_new_job, spend_budget, start_blocker
from jobs.secrets.services import split_secrets
from jobs.specs import ValidatedSpec, validate_job_spec
from lab.lib.resources import CPU
from lab.models import Project

CPU_DEVICE_RATE = 7.4e9
GPU_DEVICE_RATE = {"A100": 3.7e12, "H100": 7.4e12, "H200": 8.9e12, "B200": 1.5e13}
DEFAULT_GPU_DEVICE_RATE = 7.4e12
STARTUP_S = {"cpu": 20.0, "gpu": 120.0}
UNKNOWN_PARAMETERS = 1_000_000


def estimate_run_seconds(validated: ValidatedSpec) -> float:
    """Return the estimated wall-clock seconds of the whole run (see the module docstring): the
    model's size is its registry row's, the organization's own model included."""
    spec = validated.parsed.spec
    model = validated.model
    parameters = (model.parameters if model else None) or UNKNOWN_PARAMETERS
    gpu_type, gpus = spec.resources.gpu_type, spec.resources.gpus or 0
    if gpu_type == "cpu":
        rate, startup = CPU_DEVICE_RATE, STARTUP_S["cpu"]
    else:
        rate, startup = GPU_DEVICE_RATE.get(gpu_type, DEFAULT_GPU_DEVICE_RATE) * max(gpus, 1), STARTUP_S["gpu"]
    tokens = spec.max_steps * spec.batch_size * spec.sampling.max_tokens
    return startup + tokens * parameters / rate


def job_estimate(*, project: Project, data: Any) -> dict[str, Any]:
    """Validate ``data`` fully (as ``job_submit`` would) and estimate it without creating anything.

    Returns ``{"gpu_seconds", "cpu_seconds", "cost_usd", "queue_position", "can_start_now",
    "reason", "warnings"}`` (docs/api.md). Raises LabError ``invalid_spec``.
    """
    data, secrets = split_secrets(data)  # validated as job_submit would; never stored here
    validated = validate_job_spec(project=project, data=data, secret_names=secrets)
    spec = validated.parsed.spec
    seconds = estimate_run_seconds(validated)
    gpu_type, gpus = spec.resources.gpu_type, spec.resources.gpus or 0
    place = place_of_new_job(
        organization_id=project.organization_id, priority=JobPriority[spec.priority.upper()], gpu_type=gpu_type, gpus=gpus
    )
    cost = cost_usd(gpu_type=gpu_type, gpus=gpus, seconds=seconds)
    blocker = start_blocker(organization=project.organization, gpu_type=gpu_type, gpus=gpus)
    estimate_micro_usd = list_cost_micro_usd(gpu_type=gpu_type, gpus=gpus, seconds=seconds)
    if blocker is None and spend_budget([project.organization_id]).refusal(project.organization_id, estimate_micro_usd):
        blocker = StatusReason.PAYMENT_REQUIRED
    reason = blocker or (StatusReason.WAITING if place > 1 else None)
    return {
        "gpu_seconds": round(seconds * gpus, 1) if gpu_type != CPU else 0.0,
        "cpu_seconds": round(seconds, 1) if gpu_type == CPU else 0.0,
        "cost_usd": str(cost),
        "queue_position": place,
        "can_start_now": reason is None,
        "reason": reason,
        "warnings": validated.warnings,
    }
