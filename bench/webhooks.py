"""Benchmarks ``webhook_deliveries_per_s`` and ``webhook_latency_p99_ms``.

A real Celery worker (2 prefork processes, queue ``webhooks``) on PostgreSQL and Redis delivers
signed webhooks through the outbox to a local receiver (``labsdk.webhooks.WebhookReceiver``, an
HTTP server thread in this process that verifies every signature) with 10 endpoints.

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
import os
import statistics
import subprocess
import sys
import time

from labsdk.webhooks import WebhookReceiver

import _django

ENDPOINTS = 10


def wait_for_deliveries(receiver: WebhookReceiver, total: int, timeout: float) -> float:
    """Wait until ``total`` distinct deliveries (by webhook-id) arrived, each verified; return
    the last arrival time (Unix seconds). SystemExit when they do not arrive in ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        arrived = receiver.unique()
        if len(arrived) >= total:
            forged = [webhook.error for webhook in arrived if not webhook.verified]
            if forged:
                raise SystemExit(f"{len(forged)} deliveries failed the signature check: {forged[0]}")
            return max(webhook.arrived for webhook in arrived)
        time.sleep(0.02)
    raise SystemExit(f"only {len(receiver.unique())} of {total} deliveries arrived within {timeout} s")


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

    from jobs import dispatch
    from jobs.models import Job
    from jobs.services import job_record_event
    from jobs.webhooks.endpoints import endpoint_create
    from lab.audit import Actor
    from lab.bootstrap import bootstrap_tenant
    from lab.models import Project

    redis.Redis.from_url(broker).flushdb()
    dispatch.enqueue_admission = lambda: None  # no admission in this benchmark
    bootstrap_tenant(organization_slug="bench", project_slug="bench", email="bench@example.com", password=None)
    project = Project.objects.get(slug="bench")
    receiver = WebhookReceiver().start()
    for index in range(ENDPOINTS):
        endpoint = endpoint_create(
            project=project,
            actor=Actor.system(),
            data={"url": receiver.url(f"/e{index}"), "events": ["job.started"]},
        )
        receiver.expect(f"/e{index}", endpoint.secret)
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
        stdout=sys.stderr,  # its banner is not a figure: make bench's stdout is JSON lines only
    )
    try:
        # Warm up: the worker's processes connect to PostgreSQL and open their HTTP pools.
        with transaction.atomic():
            for _ in range(4):
                job_record_event(job=job, type="job.started")
        wait_for_deliveries(receiver, 4 * ENDPOINTS, timeout=120)
        before = len(receiver.unique())

        # Throughput: one commit, then everything it queued.
        with transaction.atomic():
            for _ in range(args.burst):
                job_record_event(job=job, type="job.started")
        committed = time.time()
        last = wait_for_deliveries(receiver, before + args.burst * ENDPOINTS, timeout=600)
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
        wait_for_deliveries(receiver, before + (args.burst + sent) * ENDPOINTS, timeout=300)
        latencies = sorted(
            (webhook.arrived - committed_at[webhook.event["id"]]) * 1000
            for webhook in receiver.unique()
            if webhook.event["id"] in committed_at
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
        receiver.stop()


if __name__ == "__main__":
    main()
