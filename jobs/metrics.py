"""Prometheus metrics of jobs: ingest volume, queue gauges and the last admission pass time.

Queue gauges are read from the database when ``/metrics`` is scraped, so every web process
reports the same numbers; the admission pass runs in workers and leaves its duration in the
shared cache for the same reason.
"""

from __future__ import annotations

from django.core.cache import cache
from django.db.models import Count
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from jobs.models import Job, JobStatus

INGESTED_POINTS = Counter("lab_ingest_points_total", "Metric points (steps) accepted through the ingest API")
INGESTED_VALUES = Counter("lab_ingest_values_total", "Metric values accepted through the ingest API")

ADMISSION_CACHE_KEY = "jobs:admission:last_pass_ms"


def record_admission_pass(elapsed_ms: float) -> None:
    """Remember how long the latest admission pass took (milliseconds)."""
    cache.set(ADMISSION_CACHE_KEY, elapsed_ms, timeout=3600)


class JobsCollector(Collector):
    """Queued and running jobs by status, and the latest admission pass time."""

    def describe(self):
        # Registering calls describe(); without it the registry would call collect(), which reads
        # the database while Django is still starting.
        yield GaugeMetricFamily("lab_jobs", "Jobs by status (queued and active ones)", labels=["status"])
        yield GaugeMetricFamily("lab_admission_last_pass_milliseconds", "Duration of the latest admission pass")

    def collect(self):
        jobs = GaugeMetricFamily("lab_jobs", "Jobs by status (queued and active ones)", labels=["status"])
        counts = dict(
            Job.objects.unscoped().filter(
                status__in=[JobStatus.QUEUED, JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELLING]
            )
            .values_list("status")
            .annotate(n=Count("id"))
        )
        for status in (JobStatus.QUEUED, JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELLING):
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs
        last = cache.get(ADMISSION_CACHE_KEY)
        if last is not None:
            yield GaugeMetricFamily(
                "lab_admission_last_pass_milliseconds", "Duration of the latest admission pass", value=float(last)
            )
