"""Benchmarks ``sse_latency_p99_ms`` and ``sse_clients_200_lost_events`` (docs/architecture.md "Tests and benchmarks").

A real uvicorn serves ``GET /api/v1/jobs/{id}/stream`` on PostgreSQL and Redis; this process
plays the engine through the ingest API over HTTP (loopback) and reads the stream.

- ``sse_latency_p99_ms``: one client follows the job (``?from=now``); ``--steps`` metric points
  are posted one request each; the figure is the 99th percentile of (event read by the client
  - ingest POST returned), in milliseconds. Events may arrive before the POST's answer (Lab
  publishes on commit, before answering): those count as 0, and ``before_answer`` says how
  many did. ``p99_from_request_sent_ms`` measures from the moment the POST was sent instead
  (ingest, commit, Redis, server, client). Baseline: the goal, 100 ms.
- ``sse_clients_200_lost_events``: ``--clients`` clients follow one job while ``--burst`` steps
  and log lines are posted; the figure is the number of (client, record) pairs missing at the
  end (goal 0). ``memory_per_client_kib`` is the server's resident memory growth with all
  clients connected, divided by their number.

Usage: ``python bench/sse.py [--steps 1000] [--clients 200] [--burst 100]``. Redis database
``BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/13``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import _django
import httpx
from _proc import rss_kib

NOW = "2026-11-29T22:16:31Z"


class Follower(threading.Thread):
    """Reads a stream, noting when each numbered record arrived (monotonic seconds)."""

    def __init__(self, url: str, headers: dict[str, str]):
        super().__init__(daemon=True)
        self.url, self.headers = url, headers
        self.arrivals: dict[tuple[str, int | str], float] = {}
        self.connected = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.stream("GET", self.url, headers=self.headers, params={"from": "now"}, timeout=600) as response:
            event, data = "", ""
            for line in response.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = line[6:]
                elif line == "" and data:
                    arrived = time.monotonic()
                    value = json.loads(data)
                    if event == "status":
                        self.connected.set()
                    elif event == "metrics":
                        self.arrivals[("metrics", value["step"])] = arrived
                    elif event == "log":
                        self.arrivals[("log", value["line"])] = arrived
                    event, data = "", ""
        self.done.set()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000, help="metric points in the latency phase")
    parser.add_argument("--clients", type=int, default=200, help="concurrent clients in the fan-out phase")
    parser.add_argument("--burst", type=int, default=100, help="steps (and as many log lines) in the fan-out phase")
    args = parser.parse_args()
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
    os.environ["REDIS_URL"] = redis_url
    os.environ["CELERY_BROKER_URL"] = redis_url
    url = _django.setup()

    from django.conf import settings

    from jobs import dispatch
    from jobs.ingest.tokens import job_token
    from jobs.models import Job, JobStatus
    from jobs.processes import free_port
    from jobs.services import job_claim_for_start, job_submit, job_transition
    from lab.audit import Actor
    from lab.bootstrap import bootstrap_tenant
    from lab.models import Project
    from tests.support.stack import wait_for

    for name in ("enqueue_admission", "enqueue_launch", "enqueue_reconcile"):
        setattr(dispatch, name, lambda *a: None)  # no worker: this measures the stream alone
    result = bootstrap_tenant(organization_slug="bench", project_slug="bench", email="bench@example.com", password=None)
    project = Project.objects.get(slug="bench")
    api_headers = {"Authorization": f"Bearer {result['api_key']}"}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": settings.SECRET_KEY, "LAB_PUBLIC_URL": base,
           "LAB_INGEST_RATE_LIMIT_PER_MINUTE": "1000000"}
    web = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "lab.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        cwd=_django.REPO, env=env,
    )
    try:
        wait_for(lambda: _healthy(base), timeout=60, what="the web server")

        def running_job():
            spec = {"model": "lab/tiny-random-llama", "max_steps": 100_000, "batch_size": 8, "rollouts_per_example": 4,
                    "env": [{"id": "lab/addition"}], "resources": {"gpu_type": "cpu", "gpus": 0}}
            job = job_submit(project=project, actor=Actor.system(), data=spec)
            attempt = job_claim_for_start(job_id=job.pk)
            ingest = httpx.Client(base_url=f"{base}/api/v1/ingest/jobs/{job.public_id}",
                                  headers={"Authorization": f"Bearer {job_token(attempt)}"}, timeout=30)
            ingest.post("/status", json={"attempt": 1, "phase": "running", "step": 0}).raise_for_status()
            return Job.objects.unscoped().get(pk=job.pk), ingest

        def post_step(ingest: httpx.Client, step: int) -> tuple[float, float]:
            """Post one step; return when the request was sent and when its answer came."""
            point = {"step": step, "time": NOW, "values": {"reward/mean": 0.5, "loss/mean": 0.1}}
            sent = time.monotonic()
            ingest.post("/metrics", json={"attempt": 1, "points": [point]}).raise_for_status()
            return sent, time.monotonic()

        # Latency: one client, one request per step.
        job, ingest = running_job()
        follower = Follower(f"{base}/api/v1/jobs/{job.public_id}/stream", api_headers)
        follower.start()
        follower.connected.wait(30)
        returned = {step: post_step(ingest, step) for step in range(1, args.steps + 1)}
        wait_for(lambda: len(follower.arrivals) >= args.steps, timeout=60, what="every step at the client")
        arrivals = {s: follower.arrivals[("metrics", s)] for s in returned}
        latencies = sorted(max(0.0, arrivals[s] - returned[s][1]) * 1000 for s in returned)
        end_to_end = sorted((arrivals[s] - returned[s][0]) * 1000 for s in returned)
        job_transition(job=job, to=JobStatus.SUCCEEDED)
        _django.report(
            "sse_latency_p99_ms", _p99(latencies), "ms", 100.0,
            p50_ms=round(statistics.median(latencies), 3),
            before_answer=sum(arrivals[s] <= returned[s][1] for s in returned),
            p99_from_request_sent_ms=round(_p99(end_to_end), 3),
            p50_from_request_sent_ms=round(statistics.median(end_to_end), 3),
            steps=args.steps,
        )

        # Fan-out: many clients on one job.
        job, ingest = running_job()
        pid = web.pid
        before = rss_kib(pid)
        followers = [Follower(f"{base}/api/v1/jobs/{job.public_id}/stream", api_headers) for _ in range(args.clients)]
        for follower in followers:
            follower.start()
        for follower in followers:
            follower.connected.wait(60)
        time.sleep(1.0)
        with_clients = rss_kib(pid)
        for step in range(1, args.burst + 1):
            post_step(ingest, step)
            ingest.post("/logs", json={"attempt": 1, "lines": [
                {"seq": step, "time": NOW, "stream": "stdout", "line": f"line {step}"}]}).raise_for_status()
        job_transition(job=job, to=JobStatus.SUCCEEDED)
        for follower in followers:
            follower.done.wait(120)
        expected = 2 * args.burst
        lost = sum(expected - len(follower.arrivals) for follower in followers)
        _django.report(
            "sse_clients_200_lost_events", lost, "events", 0, clients=args.clients, records_per_client=expected,
            memory_per_client_kib=round((with_clients - before) / args.clients, 1),
        )
    finally:
        web.terminate()
        web.wait(30)


def _p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))]


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
