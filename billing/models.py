"""Prices: USD per hour for each resource type (each GPU type, and CPU for local runs)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Price(models.Model):
    """The hourly list price of one resource type.

    For a GPU type the unit is one GPU for one hour (a job pays ``gpus × hours × usd_per_hour``);
    for ``cpu`` it is one CPU-only job for one hour. Editable in the admin; seeded by a migration.
    """

    resource_type = models.CharField(max_length=32, unique=True)
    usd_per_hour = models.DecimalField(max_digits=10, decimal_places=4)
    description = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["resource_type"]

    def __str__(self) -> str:
        return f"{self.resource_type}: ${self.usd_per_hour}/h"
