"""What a job holds of the pool, in one rule shared by admission, the queue, usage and prices.

A CPU job (``gpu_type "cpu"``) takes one slot of the local CPU pool and is priced per job-hour;
a GPU job takes ``gpus`` GPUs of its type and is priced per GPU-hour (docs/spec.md).
"""

from __future__ import annotations

CPU = "cpu"


def resource_units(*, gpu_type: str, gpus: int) -> int:
    """Return the units of capacity (and of price) a job of ``gpu_type`` with ``gpus`` GPUs holds:
    1 slot for a CPU job, else its GPU count."""
    return 1 if gpu_type == CPU else int(gpus)
