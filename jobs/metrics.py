"""Prometheus metrics of jobs: ingest volume (this process), queue gauges and admission time."""

from __future__ import annotations

from prometheus_client import Counter

INGESTED_VALUES = Counter("lab_ingest_values_total", "Metric values accepted through the ingest API")
