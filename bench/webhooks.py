"""Benchmarks ``webhook_deliveries_per_s`` and ``webhook_latency_p99_ms``.

A real Celery worker (2 prefork processes, queue ``webhooks``) on PostgreSQL and Redis delivers
signed webhooks through the outbox to a local receiver (an HTTP server thread in this process)
with 10 endpoints.

- ``webhook_deliveries_per_s``: ``--burst`` job events (each to all 10 endpoints) are recorded in
  one transaction; the figure is deliveries received / seconds from that commit to the last one
  received. Baseline: the goal, 300/s.
- ``webhook_latency_p99_ms``: events recorded one per transaction at ``--rate`` events/s for
  ``--seconds`` s; the figure is the 99th percentile of (received - committed). Baseline: the
  goal, 1,000 ms.

Usage: ``python bench/webhooks.py [--burst 300] [--rate 15] [--seconds 10]``. The broker is
``BENCH_CELERY_BROKER_URL`` (default ``redis://127.0.0.1:6379/14``): a Redis database of its own,
emptied first, so no other worker on ``CELERY_BROKER_URL`` can take the benchmark's tasks.
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import _django

ENDPOINTS = 10


class Receiver:
    """Records when each (endpoint path, event id) arrived; answers 200 at once."""

    def __init__(self) -> None:
        self.arrivals: dict[tuple[str, str], float] = {}
        self.count = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                arrived = time.time()
                event_id = json.loads(body)["id"]
                with receiver.lock:
                    receiver.arrivals.setdefault((self.path, event_id), arrived)
                    receiver.count += 1
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        class Server(ThreadingHTTPServer):
            request_queue_size = 512
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass  # workers closing kept-alive connections at exit

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, total: int, timeout: float) -> float:
        """Wait until ``total`` distinct deliveries arrived; return the last arrival time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.arrivals) >= total:
                    return max(self.arrivals.values())
            time.sleep(0.02)
        raise SystemExit(f"only {len(self.arrivals)} of {total} deliveries arrived within {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=300, help="events in the throughput burst")
    parser.add_argument("--rate", type=float, default=15.0, help="events per second in the latency phase")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the latency phase")
    args = parser.parse_args()
    os.environ["LAB_WEBHOOK_ALLOW_PRIVATE"] = "1"
    broker = os.environ.get("BENCH_CELERY_BROKER_URL", "redis://127.0.0.1:6379/14")
    os.environ["CELERY_BROKER_URL"] = broker
    url = _django.setup()

    import redis
    from django.db import transaction

    from jobs import tasks
    from jobs.models import Job
    from jobs.services import job_record_event
    from jobs.webhooks.services import endpoint_create
    from lab.audit import Actor
    from lab.models import Project
    from lab.services import bootstrap_tenant

    redis.Redis.from_url(broker).flushdb()
    tasks.admit.delay = lambda *a, **k: None  # no admission in this benchmark
    bootstrap_tenant(organization_slug="bench", project_slug="bench", email="bench@example.com", password=None)
    project = Project.objects.get(slug="bench")
    receiver = Receiver()
    for index in range(ENDPOINTS):
        endpoint_create(
            project=project,
            actor=Actor.system(),
            data={"url": f"http://127.0.0.1:{receiver.port}/e{index}", "events": ["job.started"]},
        )
    job = Job.objects.create(project=project, spec={}, model="lab/tiny-random-llama", max_steps=1, status="running")

    env = {**os.environ, "DATABASE_URL": url, "CELERY_BROKER_URL": broker}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "lab",
            "worker",
            "-Q",
            "webhooks",
            "--concurrency",
            "2",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=_django.REPO,
        env=env,
    )
    try:
        # Warm up: the worker's processes connect to PostgreSQL and open their HTTP pools.
        with transaction.atomic():
            for _ in range(4):
                job_record_event(job=job, type="job.started")
        receiver.wait_for(4 * ENDPOINTS, timeout=120)
        before = len(receiver.arrivals)

        # Throughput: one commit, then everything it queued.
        with transaction.atomic():
            for _ in range(args.burst):
                job_record_event(job=job, type="job.started")
        committed = time.time()
        last = receiver.wait_for(before + args.burst * ENDPOINTS, timeout=600)
        deliveries_per_s = args.burst * ENDPOINTS / (last - committed)

        # Latency: a steady stream below capacity.
        committed_at: dict[str, float] = {}
        interval = 1.0 / args.rate
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < args.seconds:
            with transaction.atomic():
                event = job_record_event(job=job, type="job.started")
            committed_at[event.public_id] = time.time()
            sent += 1
            pause = started + sent * interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        receiver.wait_for(before + (args.burst + sent) * ENDPOINTS, timeout=300)
        latencies = sorted(
            (arrived - committed_at[event_id]) * 1000
            for (path, event_id), arrived in receiver.arrivals.items()
            if event_id in committed_at
        )
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        _django.report(
            "webhook_deliveries_per_s",
            deliveries_per_s,
            "deliveries/s",
            300,
            deliveries=args.burst * ENDPOINTS,
            workers=2,
        )
        _django.report(
            "webhook_latency_p99_ms",
            p99,
            "ms",
            1000,
            deliveries=len(latencies),
            rate_per_s=args.rate * ENDPOINTS,
            p50_ms=round(statistics.median(latencies), 1),
        )
    finally:
        worker.terminate()
        worker.wait(timeout=30)


if __name__ == "__main__":
    main()
