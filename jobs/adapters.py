"""Adapters: the ``adapter`` kind of ``jobs.artifacts`` (docs/checkpoints.md, "Adapter artifacts").

An adapter is what ``[adapters]`` asks the engine to export every ``interval`` steps (0: only at
the end): the trained weights alone (a PEFT LoRA adapter, ``adapter_config.json`` +
``adapter_model.safetensors``, or for a full fine-tune the Hugging Face weights), without
optimizer or trainer state, as one uncompressed tar. Its lifecycle is ``jobs.artifacts``'s, with
what ``jobs.artifacts.kinds.ADAPTER`` declares: one row per (job, step), which a newer attempt's
export takes over (so a job's adapters are those of the run that produced its curve), archives
of at most ``MAX_ADAPTER_BYTES``, under the job's storage prefix (``<job id>/adapters/``, so
deleting a job deletes them with its checkpoints), ``keep_last`` of ``[adapters]`` (-1 or
absent: all). This module names its steps for the run pipeline.
"""

from __future__ import annotations

from jobs.artifacts.kinds import ADAPTER, MAX_ADAPTER_BYTES
from jobs.artifacts.lifecycle import fail_unfinished
from jobs.models import Job

__all__ = ["MAX_ADAPTER_BYTES", "adapter_download_url", "adapter_fail_unfinished"]


def adapter_download_url(adapter_public_id: str) -> str:
    """Return the public API URL that downloads an adapter (``GET /api/v1/adapters/{id}/download``)."""
    return ADAPTER.download_url(adapter_public_id)


def adapter_fail_unfinished(*, job: Job, attempt_number: int) -> list[str]:
    """Fail the ``uploading`` adapters of an attempt that has ended (``lifecycle.fail_unfinished``)."""
    return fail_unfinished(ADAPTER, job=job, attempt_number=attempt_number)
