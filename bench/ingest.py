"""Benchmark ``ingest_values_per_s``: numbers per second accepted by ``POST /metrics``.

A real uvicorn server on PostgreSQL; one engine client posts batches of 1,000 points × 20 values
(new steps each time, as a long run would) over loopback. The baseline is the goal, 50,000
values/s (for scale: MLflow's Python tracking server managed about 3,400 points/s in a published
test). Usage: ``python bench/ingest.py [--batches 30]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import _django

POINTS, NAMES = 1000, 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    url = _django.setup()

    import httpx

    from jobs.ingest.tokens import job_token
    from jobs.processes import free_port
    from jobs.services import job_claim_for_start, job_submit
    from lab.audit import Actor
    from lab.models import Project
    from lab.services import bootstrap_tenant

    bootstrap_tenant(organization_slug="bench", project_slug="bench", email="bench@example.com", password=None)
    project = Project.objects.get(slug="bench")
    spec = {"model": "lab/tiny-random-llama", "max_steps": 100_000, "env": [{"id": "lab/addition"}]}
    from jobs import tasks

    tasks.admit.delay = tasks.launch_attempt.delay = lambda *a, **k: None  # no worker in this benchmark
    job = job_submit(project=project, actor=Actor.system(), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    token = job_token(attempt)

    port = free_port()
    env = {**os.environ, "DATABASE_URL": url}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "lab.asgi:application", "--port", str(port), "--log-level", "warning"],
        cwd=_django.REPO,
        env=env,
    )
    try:
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1/ingest/jobs/{job.public_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
        for _ in range(100):
            try:
                client.post("/status", json={"attempt": 1, "phase": "running", "step": 0})
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        names = [f"metric/{index}" for index in range(NAMES)]
        durations = []
        for batch in range(args.batches):
            first = batch * POINTS + 1
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
        total = sum(durations)
        _django.report(
            "ingest_values_per_s",
            POINTS * NAMES * args.batches / total,
            "values/s",
            50_000,
            batches=args.batches,
            batch_p50_ms=round(statistics.median(durations) * 1000, 1),
        )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
