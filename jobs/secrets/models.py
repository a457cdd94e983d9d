"""The stored form of a job's secrets: one encrypted blob per job, and the names alone in clear."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from lab.tenancy import TenantManager


class JobSecrets(models.Model):
    """A job's secrets: ``ciphertext`` is a Fernet token of the JSON object ``{name: value}``
    (``jobs.secrets.services``); ``names`` lists the names, sorted, so checks and pages never
    need the values. Never serialized by the API."""

    tenant_path = "job__project"
    tenant_parents = ("job",)
    objects = TenantManager()

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="secrets")
    names = models.JSONField(default=list)
    ciphertext = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)
