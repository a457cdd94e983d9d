"""Benchmark ``admission_pass_ms_10k``: one admission pass over 10,000 queued jobs from 500
organizations, on PostgreSQL. The pool is full (one CPU slot, taken), so the pass weighs every
job and records why each waits. The first pass also writes 10,000 ``status_reason`` changes; the
reported figure is the median of the passes after it (the steady state a busy queue sees every
few seconds). Baseline: the goal, 200 ms. Usage: ``python bench/admission.py``.
"""

from __future__ import annotations

import statistics
import time

import _django

JOBS, ORGANIZATIONS = 10_000, 500


def main() -> None:
    _django.setup()
    from django.conf import settings
    from django.utils import timezone

    from jobs.admission import admission_pass
    from jobs.models import Job, JobStatus
    from lab.models import Organization, Project

    settings.LAB_LOCAL_SLOTS = 1
    organizations = Organization.objects.bulk_create(
        [Organization(slug=f"org-{index}", name=f"Org {index}") for index in range(ORGANIZATIONS)]
    )
    projects = Project.objects.bulk_create(
        [Project(organization=organization, slug="default", name="Default") for organization in organizations]
    )
    now = timezone.now()
    common = {"spec": {}, "model": "lab/tiny-random-llama", "max_steps": 10, "gpu_type": "cpu", "gpus": 0}
    Job.objects.create(project=projects[0], status=JobStatus.RUNNING, **common)
    Job.objects.bulk_create(
        [
            Job(
                project=projects[index % ORGANIZATIONS],
                status=JobStatus.QUEUED,
                priority=index % 3,
                queued_at=now - timezone.timedelta(seconds=JOBS - index),
                **common,
            )
            for index in range(JOBS)
        ],
        batch_size=2000,
    )
    started = time.perf_counter()
    first = admission_pass()
    first_ms = (time.perf_counter() - started) * 1000
    assert first.considered == JOBS and not first.started
    passes = []
    for _ in range(5):
        started = time.perf_counter()
        admission_pass()
        passes.append((time.perf_counter() - started) * 1000)
    _django.report("admission_pass_ms_10k", statistics.median(passes), "ms", 200, first_pass_ms=round(first_ms, 1))


if __name__ == "__main__":
    main()
