"""Benchmark ``k8s_launch_reconcile_ms_1k``: one reconciler pass (``reconcile_all``) over 1,000
running jobs on the Kubernetes launcher, against the in-memory gateway fake (tests/k8s), on
PostgreSQL.

The 1,000 attempts are launched through the launcher (namespace, LocalQueue, JobSet, Secret
each), admitted by the fake's Kueue and running; each pass then catches the watch cache up
with one watch round per kind (the events of 20 jobs that exited since the last pass, so every
pass also finishes 20 jobs) and reconciles every active job. The figure is the median pass in
ms; ``observe_ms`` is the launcher's share of it (one watch round per kind, then reading 1,000
attempts from the cache), ``api_calls_per_pass`` the gateway calls a pass made (the watches,
and deletes of the finished JobSets), ``first_pass_ms`` includes the cache's first full
listing, ``queries_per_pass`` counts the SQL statements of the busiest pass and ``cpu_ms`` is the
median pass's CPU time in this process (both steadier than wall time on a shared machine). The rest of a pass is the reconciler's work in PostgreSQL: the jobs whose attempts ended
together are finished in one transaction (each in a savepoint of its own, usage closed in one
ledger batch), the others' totals raised in one statement.
Baseline: the goal, 500 ms.
Usage: ``python bench/k8s_reconcile.py [--jobs 1000] [--passes 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime, timezone

import _django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=5)
    arguments = parser.parse_args()
    _django.setup()
    from django.conf import settings
    from django.utils import timezone as django_timezone

    from jobs import reconciler
    from jobs.launchers.base import LaunchRequest
    from jobs.launchers.kubernetes.launcher import KubernetesLauncher
    from jobs.launchers.kubernetes.objects import PoolSettings
    from jobs.models import AttemptState, Job, JobAttempt, JobStatus
    from lab.models import Organization, Project
    from tests.k8s.fake_gateway import FakeGateway

    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_HEARTBEAT_TIMEOUT_S = 3600
    cluster = FakeGateway(history=100_000)
    launcher = KubernetesLauncher(gateway=cluster, settings=PoolSettings(), background=False,
                                  clock=lambda: datetime.now(timezone.utc))
    reconciler.get_launcher = lambda: launcher
    from jobs import dispatch, pool

    pool.get_launcher = lambda: launcher  # the pass reads the nodes through the same fake cluster

    dispatch.enqueue_admission = lambda: None  # no broker: the pass itself is measured

    organizations = Organization.objects.bulk_create([Organization(slug=f"org-{index}", name=f"Org {index}") for index in range(50)])
    projects = Project.objects.bulk_create([Project(organization=org, slug="default", name="Default") for org in organizations])
    now = django_timezone.now()
    spec = {"max_runtime_minutes": 600, "max_restarts": 2}
    jobs = Job.objects.bulk_create([
        Job(project=projects[index % len(projects)], status=JobStatus.RUNNING, spec=spec, model="lab/tiny-random-llama",
            max_steps=10, gpu_type="H100", gpus=1, attempt=1, started_at=now)
        for index in range(arguments.jobs)
    ], batch_size=1000)
    # The pods started a minute ago: each pass bills the seconds since the last one, as in steady state.
    pods_started = (now - django_timezone.timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    attempts = []
    for index, job in enumerate(jobs):
        slug = organizations[index % len(organizations)].slug
        handle = launcher.launch(LaunchRequest(
            job_id=job.public_id, attempt=1, spec=spec, lab_url="http://lab", token="t", bootstrap_token="ljb_t", organization=slug,
            namespace=f"lab-{slug}", gpu_type="H100", gpus=1))
        cluster.admit(handle["namespace"], handle["jobset"])
        cluster.run(handle["namespace"], handle["jobset"], started_at=pods_started)
        attempts.append(JobAttempt(job=job, number=1, state=AttemptState.LAUNCHED, launcher="kubernetes", handle=handle,
                                   launched_at=now, last_heartbeat_at=now))
    JobAttempt.objects.bulk_create(attempts, batch_size=1000)

    started = time.perf_counter()
    seen = reconciler.reconcile_all()
    first_ms = (time.perf_counter() - started) * 1000
    assert seen == arguments.jobs, seen
    from django.db import connection

    queries = [0]

    def count(execute, sql, params, many, context):
        queries[0] += 1
        return execute(sql, params, many, context)

    passes, observes, calls, cpu, counted = [], [], [], [], []
    finished = 0
    for number in range(arguments.passes):
        for attempt in attempts[number * 20:(number + 1) * 20]:
            cluster.exit(attempt.handle["namespace"], attempt.handle["jobset"], 0)
        calls_before, queries[0] = len(cluster.calls), 0
        started, cpu_started = time.perf_counter(), time.process_time()
        with connection.execute_wrapper(count):
            reconciler.reconcile_all()
        passes.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)
        counted.append(queries[0])
        calls.append(len(cluster.calls) - calls_before)
        finished += 20
        handles = [attempt.handle for attempt in attempts]
        started = time.perf_counter()
        launcher.observe_many(handles)
        observes.append((time.perf_counter() - started) * 1000)
    succeeded = Job.objects.unscoped().filter(status=JobStatus.SUCCEEDED).count()
    assert succeeded == finished, (succeeded, finished)
    _django.report(
        "k8s_launch_reconcile_ms_1k", statistics.median(passes), "ms", 500,
        jobs=arguments.jobs, observe_ms=round(statistics.median(observes), 1), first_pass_ms=round(first_ms, 1),
        api_calls_per_pass=max(calls), queries_per_pass=max(counted), cpu_ms=round(statistics.median(cpu), 1),
    )


if __name__ == "__main__":
    main()
