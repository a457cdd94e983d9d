"""Prometheus metrics of the web process, exposed at ``/metrics``."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUESTS = Counter("lab_http_requests_total", "HTTP requests served", ["method", "route", "status"])
REQUEST_LATENCY = Histogram(
    "lab_http_request_duration_seconds",
    "Time to produce the response (to its first byte for streams)",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
