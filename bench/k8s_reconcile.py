"""Benchmark ``k8s_launch_reconcile_ms_1k``: one reconciler pass (``reconcile_all``) over 1,000
running jobs on the Kubernetes launcher, against the in-memory gateway fake (tests/k8s), on
PostgreSQL; and ``k8s_reconcile_ingest_values_per_s``: the ingest throughput of
bench/ingest.py while such passes run at the Celery beat's cadence (and
``k8s_reconcile_ingest_values_per_s_back_to_back`` while they run with no pause).

The 1,000 attempts are launched through the launcher (namespace, LocalQueue, JobSet, NetworkPolicy, Secret
each), admitted by the fake's Kueue and running; each pass then catches the watch cache up
with one watch round per kind (the events of 20 jobs that exited since the last pass, so every
pass also finishes 20 jobs) and reconciles every active job. The figure is the median pass in
ms; ``observe_ms`` is the launcher's share of it (one watch round per kind, then reading 1,000
attempts from the cache), ``api_calls_per_pass`` the gateway calls a pass made (the watches,
and deletes of the finished JobSets), ``first_pass_ms`` includes the cache's first full
listing, ``queries_per_pass`` counts the SQL statements of the busiest pass and ``cpu_ms`` is the
median pass's CPU time in this process (both steadier than wall time on a shared machine). The rest of a pass is the reconciler's work in PostgreSQL: the jobs whose attempts ended
together are finished in one transaction (usage closed in one ledger batch, attempts ended in
one statement, events stored together, one UPDATE of each job's row), the others' totals raised
in one statement.
Baseline: the goal, 500 ms.

Then the jobs finished are replaced by new running ones, one of them the job bench/ingest.py
posts to (launched on the cluster like the others, so the passes reconcile it too), to make
1,000 active jobs again. bench/ingest.py's ``POST /metrics`` batches (uvicorn, 1,000 points ×
20 values) are timed alone, then while a forked process runs such passes (each finishing 20
more jobs) at the deployed cadence, then while it runs them back to back, then alone again.
The cadence is the interval of the Celery beat entry that runs ``jobs.reconcile``
(``CELERY_BEAT_SCHEDULE`` in lab/settings.py, from ``LAB_RECONCILE_INTERVAL_S``), read from the
settings: a pass starts at the window's start and then every interval, or as soon as the one
before ends if that is later (beat enqueues on time; one worker runs them in turn).
``k8s_reconcile_ingest_values_per_s`` is the values/s beside passes at that cadence, as in a
deployment; ``k8s_reconcile_ingest_values_per_s_back_to_back`` beside passes with no pause, the
harshest neighbour. Their baseline is not a goal but the same figure measured alone (both alone
runs together, also given apart), so each ``ratio`` is the share of the throughput left while
the passes run (1 is unchanged). ``interval_s`` is the cadence (null back to back), ``passes``,
``pass_p50_ms`` and ``pass_cpu_p50_ms`` tell how many passes ran beside the batches and the
median's wall and CPU time; ``cpus`` is the machine's CPU count. The passes take no lock an
ingest request waits for (the ingest job is idle to them: its row is locked only by the one
statement that raises usage totals, once every ``LAB_USAGE_INTERVAL_S``), so what they take
from ingest is CPU: a pass keeps about a core busy (its process and its PostgreSQL backend)
while it runs, and where the uvicorn server, PostgreSQL and the client have no core to spare
(two CPUs) passes back to back cost about as much as a busy loop in their place; at the
cadence they take it for as long as a pass lasts, which on a starved machine is most of each
interval (docs/ingest-api.md "Throughput").
Usage: ``python bench/k8s_reconcile.py [--jobs 1000] [--passes 5] [--ingest-batches 24]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from datetime import datetime, timezone
from typing import Self

import _django
import ingest

FINISHED_PER_PASS = 20
INGEST_RUNS = 4  # alone, beside passes at the cadence, beside passes back to back, alone


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--ingest-batches", type=int, default=24, help="batches in each ingest run; 0 skips them")
    arguments = parser.parse_args()
    if (INGEST_RUNS * arguments.ingest_batches + 1) * ingest.POINTS > ingest.STEPS:
        most = (ingest.STEPS // ingest.POINTS - 1) // INGEST_RUNS
        parser.error(f"--ingest-batches: at most {most} (the ingest job's steps)")
    url = _django.setup()
    from django.conf import settings
    from django.utils import timezone as django_timezone

    from jobs.launchers import registry

    from jobs.pipeline import reconciler
    from jobs.launchers.base import LaunchRequest
    from jobs.launchers.kubernetes.launcher import KubernetesLauncher
    from jobs.launchers.kubernetes.objects import PoolSettings
    from jobs.models import AttemptState, Job, JobAttempt, JobStatus
    from lab.models import Organization, Project
    from tests.k8s.fake_gateway import FakeGateway

    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_HEARTBEAT_TIMEOUT_S = 3600
    cluster = FakeGateway(history=100_000)
    for index in range(arguments.jobs // 8 + 1):  # the pool's H100 nodes, read by the pass (jobs.pool)
        allocatable = {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"}
        cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"h100-{index}", "labels": {
            "kubernetes.io/hostname": f"h100-{index}", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"allocatable": allocatable, "capacity": allocatable}})
    launcher = KubernetesLauncher(gateway=cluster, settings=PoolSettings(), background=False,
                                  clock=lambda: datetime.now(timezone.utc))
    registry.get_launcher = lambda: launcher
    from jobs import dispatch, pool

    pool.get_launcher = lambda: launcher  # the pass reads the nodes through the same fake cluster
    pool.cluster_inventory_refresh(force=True)  # not a copy an earlier run left in the cache

    dispatch.enqueue_admission = lambda: None  # no broker: the pass itself is measured

    organizations = Organization.objects.bulk_create([Organization(slug=f"org-{index}", name=f"Org {index}") for index in range(50)])
    projects = Project.objects.bulk_create([Project(organization=org, slug="default", name="Default") for org in organizations])
    spec = {"max_runtime_minutes": 600, "max_restarts": 2}

    def launch_running(job_public_id: str, slug: str) -> dict:
        """Launch a job's attempt 1 on the fake cluster, admitted and running since a minute
        ago (each pass bills the seconds since the last one, as in steady state); return its handle."""
        handle = launcher.launch(LaunchRequest(
            job_id=job_public_id, attempt=1, spec=spec, lab_url="http://lab", token="t", bootstrap_token="ljb_t",
            organization=slug, namespace=f"lab-{slug}", gpu_type="H100", gpus=1))
        cluster.admit(handle["namespace"], handle["jobset"])
        pods_started = (django_timezone.now() - django_timezone.timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
        cluster.run(handle["namespace"], handle["jobset"], started_at=pods_started)
        return handle

    def running_jobs(count: int, offset: int) -> list[JobAttempt]:
        """Create ``count`` running jobs spread over the organizations, each with its attempt
        launched by ``launch_running``; return the attempts."""
        now = django_timezone.now()
        jobs = Job.objects.bulk_create([
            Job(project=projects[index % len(projects)], status=JobStatus.RUNNING, spec=spec, model="lab/tiny-random-llama",
                max_steps=10, gpu_type="H100", gpus=1, attempt=1, started_at=now)
            for index in range(offset, offset + count)
        ], batch_size=1000)
        attempts = [
            JobAttempt(job=job, number=1, state=AttemptState.LAUNCHED, launcher="kubernetes",
                       handle=launch_running(job.public_id, organizations[index % len(organizations)].slug),
                       launched_at=now, last_heartbeat_at=now)
            for index, job in zip(range(offset, offset + count), jobs)
        ]
        return JobAttempt.objects.bulk_create(attempts, batch_size=1000)

    attempts = running_jobs(arguments.jobs, 0)

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
        for attempt in attempts[number * FINISHED_PER_PASS:(number + 1) * FINISHED_PER_PASS]:
            cluster.exit(attempt.handle["namespace"], attempt.handle["jobset"], 0)
        calls_before, queries[0] = len(cluster.calls), 0
        started, cpu_started = time.perf_counter(), time.process_time()
        with connection.execute_wrapper(count):
            reconciler.reconcile_all()
        passes.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)
        counted.append(queries[0])
        calls.append(len(cluster.calls) - calls_before)
        finished += FINISHED_PER_PASS
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
    if arguments.ingest_batches <= 0:
        return

    from lab.bootstrap import bootstrap_tenant

    bootstrap_tenant(organization_slug="bench", project_slug="bench", email="bench@example.com", password=None)
    job, token = ingest.ingest_job(
        project=Project.objects.get(slug="bench"), resources={"gpu_type": "H100", "gpus": 1},
        launch=lambda job: launch_running(job.public_id, "bench"))
    running = attempts[finished:] + running_jobs(max(finished - 1, 0), arguments.jobs)
    with ingest.ingest_client(url=url, job=job, token=token) as client:  # its first heartbeat makes the job running
        active = reconciler.reconcile_all()  # the cache catches up with the new jobs
        assert active == len(running) + 1, active
        step = 1
        ingest.post_batches(client, batches=1, first_step=step)  # the server's first request, not timed
        step += ingest.POINTS
        alone_first = ingest.post_batches(client, batches=arguments.ingest_batches, first_step=step)
        step += arguments.ingest_batches * ingest.POINTS
        beside_runs, exited = [], 0
        for name, interval_s in (("k8s_reconcile_ingest_values_per_s", _beat_interval_s(settings)),
                                 ("k8s_reconcile_ingest_values_per_s_back_to_back", None)):
            with _PassesBeside(running[exited:], cluster, reconciler, interval_s=interval_s) as beside:
                during = ingest.post_batches(client, batches=arguments.ingest_batches, first_step=step)
                step += arguments.ingest_batches * ingest.POINTS
            exited += beside.exited  # finished in the database: the next neighbour starts past them
            beside_runs.append((name, interval_s, during, beside))
        alone_last = ingest.post_batches(client, batches=arguments.ingest_batches, first_step=step)
    alone = alone_first + alone_last
    for name, interval_s, during, beside in beside_runs:
        _django.report(
            name, ingest.values_per_s(during), "values/s",
            round(ingest.values_per_s(alone), 1), jobs=active, batches=arguments.ingest_batches, interval_s=interval_s,
            batch_p50_ms=ingest.batch_p50_ms(during), alone_batch_p50_ms=ingest.batch_p50_ms(alone),
            alone_first_values_per_s=round(ingest.values_per_s(alone_first), 1),
            alone_last_values_per_s=round(ingest.values_per_s(alone_last), 1),
            passes=len(beside.durations), pass_p50_ms=_median(beside.durations), pass_cpu_p50_ms=_median(beside.cpu),
            cpus=os.cpu_count(),
        )


def _beat_interval_s(settings) -> float:
    """The seconds between reconciler passes in a deployment: the schedule of the Celery beat
    entry that runs ``jobs.reconcile`` in ``settings.CELERY_BEAT_SCHEDULE``."""
    beat = settings.CELERY_BEAT_SCHEDULE
    (schedule,) = [entry["schedule"] for entry in beat.values() if entry["task"] == "jobs.reconcile"]
    return float(schedule)


def _median(values: list[float]) -> float | None:
    """The median of ``values`` rounded to 0.1, None for none."""
    return round(statistics.median(values), 1) if values else None


class _PassesBeside:
    """Run reconciler passes in a forked process (its own interpreter lock and PostgreSQL
    connection, the parent's fake cluster and launcher as they stand) while the ``with`` block
    runs: back to back, or with ``interval_s`` as Celery beat would, pass ``k`` starting
    ``k × interval_s`` after the first or as soon as pass ``k - 1`` ends, whichever is later.
    Before each pass, ``FINISHED_PER_PASS`` more of the attempts ``running`` exit (while any
    are left). On exit, ``durations`` holds the passes' wall times and ``cpu`` their CPU times
    in the forked process, in ms, and ``exited`` how many of ``running`` were made to exit (their
    jobs finished, their JobSets then deleted from the parent's cluster too); a pass that
    failed raises its error here."""

    def __init__(self, running, cluster, reconciler, *, interval_s: float | None = None) -> None:
        self.running, self.cluster, self.reconciler, self.interval_s = running, cluster, reconciler, interval_s
        self.durations: list[float] = []
        self.cpu: list[float] = []
        self.exited = 0

    def __enter__(self) -> Self:
        from django.db import connections

        connections.close_all()  # the child must not share the parent's connection
        context = multiprocessing.get_context("fork")
        self.stop = context.Event()
        self.receive, send = context.Pipe(duplex=False)
        self.process = context.Process(target=self._run, args=(send,), daemon=True)
        self.process.start()
        return self

    def _run(self, send) -> None:
        durations, cpu, index = [], [], 0
        first = time.perf_counter()
        try:
            while not self.stop.is_set():
                if self.interval_s is not None and self.stop.wait(
                        max(first + len(durations) * self.interval_s - time.perf_counter(), 0.0)):
                    break
                for attempt in self.running[index:index + FINISHED_PER_PASS]:
                    self.cluster.exit(attempt.handle["namespace"], attempt.handle["jobset"], 0)
                index += FINISHED_PER_PASS
                started, cpu_started = time.perf_counter(), time.process_time()
                self.reconciler.reconcile_all()
                durations.append((time.perf_counter() - started) * 1000)
                cpu.append((time.process_time() - cpu_started) * 1000)
        except Exception as error:
            send.send(error)
            raise
        send.send((durations, cpu, min(index, len(self.running))))

    def __exit__(self, *exc) -> None:
        self.stop.set()
        received = self.receive.recv()
        self.process.join()
        if isinstance(received, Exception):
            raise received
        self.durations, self.cpu, self.exited = received
        from jobs.launchers.kubernetes.kinds import JOBSET

        for attempt in self.running[:self.exited]:  # as the passes left it; else the next ones sweep them as orphans
            self.cluster.delete(JOBSET, attempt.handle["jobset"], attempt.handle["namespace"])


if __name__ == "__main__":
    main()
