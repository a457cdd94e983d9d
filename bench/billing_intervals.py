"""Benchmark ``billing_close_intervals_per_s``: usage ledger intervals closed and charged per
second by 8 concurrent worker processes on PostgreSQL, billing on, every organization prepaid.

800 running attempts of 16 organizations (H100 and CPU jobs); each attempt is closed by two
workers at once, interval after interval, so every interval is contended. Each worker closes its
200 attempts as a reconciler pass does (``jobs.pipeline.reconciler.RECONCILE_BATCH``, 200 jobs): one
``usage_close_many(skip_locked=True)`` call per step, in which one interval of each attempt is
due, so a worker never waits for an organization the other one is closing; 12 steps
(``--per-interval``: one ``usage_close`` call per attempt, the path before batching). A rate of
1,000 intervals/s is what 60,000 running attempts need at the default 60 s interval, so the
bench runs many attempts for a few intervals; ``--attempts 64 --intervals 60`` is the shape it
had before batching (16 attempts a worker, 60 steps).
Afterwards the run checks that the ledger holds each interval once and that every balance is
exact: the starting balance less each attempt's exact cost (rounded once per attempt, to the
micro-dollar). Baseline: the goal, 1,000 intervals/s.
Usage: ``python bench/billing_intervals.py [--per-interval] [--attempts N] [--intervals N]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal

import _django

WORKERS, ORGANIZATIONS = 8, 16
T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)


def attempt_usage(attempt: int, organizations: list[tuple[int, int]]):
    from billing.ledger import AttemptUsage

    organization_id, project_id = organizations[attempt % len(organizations)]
    gpu = attempt % 2 == 0
    return AttemptUsage(
        organization_id=organization_id, project_id=project_id, job_public_id=f"job_bench{attempt}",
        attempt_id=attempt + 1, attempt_number=1, resource_type="H100" if gpu else "cpu", gpus=2 if gpu else 0,
        started_at=T0,
    )


def work(
    worker: int, organizations: list[tuple[int, int]], start_at: float, options: argparse.Namespace, queue
) -> None:
    from django.db import connections

    connections.close_all()  # a forked worker opens its own connection
    from billing.ledger import usage_close, usage_close_many

    mine = [attempt for attempt in range(options.attempts) if attempt % WORKERS in (worker, (worker + 1) % WORKERS)]
    usages = [attempt_usage(attempt, organizations) for attempt in mine]
    while time.time() < start_at:
        time.sleep(0.001)
    closed = 0
    for step in range(1, options.intervals + 1):
        now = T0 + timedelta(seconds=60 * step)
        if options.per_interval:
            for usage in usages:
                closed += len(usage_close(usage=usage, now=now).closed)
        else:
            closed += len(usage_close_many(usages=usages, now=now, skip_locked=True).closed)
    queue.put(closed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-interval", action="store_true", help="one usage_close call per attempt and step")
    parser.add_argument("--attempts", type=int, default=800, help="running attempts (default 800)")
    parser.add_argument("--intervals", type=int, default=12, help="intervals closed per attempt (default 12)")
    options = parser.parse_args()
    os.environ["STRIPE_API_KEY"] = "sk_bench_no_stripe_call_is_made_for_prepaid"
    _django.setup()
    from django.db import connections
    from django.db.models import Sum

    from billing.accounts import account_for
    from billing.models import BillingAccount, UsageInterval
    from lab.models import Organization, Project

    made = Organization.objects.bulk_create([Organization(slug=f"bench-{i}", name=f"Bench {i}") for i in range(ORGANIZATIONS)])
    projects = Project.objects.bulk_create([Project(organization=o, slug="default", name="Default") for o in made])
    organizations = [(project.organization_id, project.pk) for project in projects]
    for organization_id, _ in organizations:
        account_for(organization_id)
    BillingAccount.objects.update(balance_micro_usd=1_000_000_000)  # $1,000 each: enough for the run
    connections.close_all()

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    start_at = time.time() + 1.0
    processes = [context.Process(target=work, args=(w, organizations, start_at, options, queue)) for w in range(WORKERS)]
    for process in processes:
        process.start()
    reported = [queue.get() for _ in processes]
    elapsed = time.time() - start_at
    for process in processes:
        process.join()

    rows = UsageInterval.objects.unscoped()
    unique = rows.values("attempt_id", "index").distinct().count()
    total = rows.count()
    assert total == sum(reported) == unique == options.attempts * options.intervals, (total, sum(reported), unique)
    exact = True
    for organization_id, _ in organizations:
        expected = 1_000_000_000
        for attempt in range(options.attempts):
            usage = attempt_usage(attempt, organizations)
            if usage.organization_id != organization_id:
                continue
            usd_per_hour, units = (Decimal("2.50"), 2) if usage.resource_type == "H100" else (Decimal("0.10"), 1)
            cost = usd_per_hour * units * options.intervals * 60 * 1_000_000 / 3600
            expected -= int(cost.quantize(Decimal(1), rounding=ROUND_HALF_UP))
        balance = BillingAccount.objects.get(organization_id=organization_id).balance_micro_usd
        charged = rows.filter(organization_id=organization_id).aggregate(total=Sum("charged_micro_usd"))["total"]
        exact = exact and balance == expected and 1_000_000_000 - balance == charged
    assert exact, "a balance is not exact"
    _django.report(
        "billing_close_intervals_per_s", total / elapsed, "intervals/s", 1000,
        path="per_interval" if options.per_interval else "batch", attempts=options.attempts, workers=WORKERS,
        intervals=total, duplicates=total - unique, balances_exact=exact, seconds=round(elapsed, 2),
    )


if __name__ == "__main__":
    main()
