"""Benchmark ``ingest_values_per_s``: numbers per second accepted by ``POST /metrics``.

A real uvicorn server on PostgreSQL; one engine client posts batches of 1,000 points × 20 values
(new steps each time, as a long run would) over loopback. The baseline is the goal, 50,000
values/s (for scale: MLflow's Python tracking server managed about 3,400 points/s in a published
test). Usage: ``python bench/ingest.py [--batches 30]``.

The pieces are importable: bench/k8s_reconcile.py measures the same figure while reconciler
passes run beside it (``ingest_job``, ``ingest_client``, ``post_batches``, ``values_per_s``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import _django

POINTS, NAMES = 1000, 20
STEPS = 100_000  # the job's max_steps


def ingest_job(*, project, resources: dict | None = None, launch: Callable | None = None):
    """Submit a job of ``STEPS`` steps to ``project`` (``resources`` its spec's section, default
    the CPU) and claim its first attempt, with no worker (the admission and launch tasks are not
    enqueued); with ``launch``, a function of the job returning a launcher handle, the attempt is
    created launched there (``job_claim_for_start``'s ``handle``). Return the job and its ingest
    token."""
    from jobs import dispatch
    from jobs.ingest.tokens import job_token
    from jobs.services import job_claim_for_start, job_submit
    from lab.audit import Actor

    dispatch.enqueue_admission = dispatch.enqueue_launch = lambda *a: None  # no worker in this benchmark
    spec = {"model": "lab/tiny-random-llama", "max_steps": STEPS, "env": [{"id": "lab/addition"}]}
    if resources is not None:
        spec["resources"] = resources
    job = job_submit(project=project, actor=Actor.system(), data=spec)
    attempt = job_claim_for_start(job_id=job.pk, handle=launch(job) if launch else None)
    return job, job_token(attempt)


@contextmanager
def ingest_client(*, url: str, job, token: str) -> Iterator:
    """Start uvicorn on the database ``url``, wait until it takes the job's first heartbeat (which
    makes the job running), and yield an ``httpx.Client`` for the job's ingest API; stop the
    server on the way out."""
    import httpx

    from jobs.processes import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "lab.asgi:application", "--port", str(port), "--log-level", "warning"],
        cwd=_django.REPO,
        env={**os.environ, "DATABASE_URL": url},
    )
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1/ingest/jobs/{job.public_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        ) as client:
            for _ in range(100):
                try:
                    client.post("/status", json={"attempt": 1, "phase": "running", "step": 0})
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            yield client
    finally:
        server.terminate()
        server.wait()


def post_batches(client, *, batches: int, first_step: int = 1) -> list[float]:
    """Post ``batches`` batches of ``POINTS`` new steps × ``NAMES`` values, from step
    ``first_step`` on, and return each ``POST /metrics``'s wall time in seconds (the body is
    built outside the timing, encoded inside it)."""
    names = [f"metric/{index}" for index in range(NAMES)]
    durations = []
    for batch in range(batches):
        first = first_step + batch * POINTS
        body = {
            "attempt": 1,
            "points": [
                {"step": step, "time": "2026-11-29T22:16:31Z", "values": {n: step * 0.001 for n in names}}
                for step in range(first, first + POINTS)
            ],
        }
        started = time.perf_counter()
        response = client.post("/metrics", json=body)
        durations.append(time.perf_counter() - started)
        assert response.status_code == 200 and response.json()["accepted"] == POINTS, response.text
    return durations


def values_per_s(durations: list[float]) -> float:
    """Values accepted per second of POSTing over the batches timed in ``durations`` (seconds)."""
    return POINTS * NAMES * len(durations) / sum(durations)


def batch_p50_ms(durations: list[float]) -> float:
    """The median batch's wall time in ms, rounded to 0.1."""
    return round(statistics.median(durations) * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    url = _django.setup()

    from lab.bootstrap import bootstrap_tenant
    from lab.models import Project

    bootstrap_tenant(organization_slug="bench", project_slug="bench", email="bench@example.com", password=None)
    job, token = ingest_job(project=Project.objects.get(slug="bench"))
    with ingest_client(url=url, job=job, token=token) as client:
        durations = post_batches(client, batches=args.batches)
    _django.report(
        "ingest_values_per_s",
        values_per_s(durations),
        "values/s",
        50_000,
        batches=args.batches,
        batch_p50_ms=batch_p50_ms(durations),
    )


if __name__ == "__main__":
    main()
