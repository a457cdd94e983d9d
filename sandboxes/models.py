"""A sandbox: a project's isolated work directory and limits, where commands run (docs/sandboxes.md)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from lab.ids import public_id
from lab.models import ApiKey, Organization, Project, User
from lab.tenancy import TenantManager


def _sandbox_public_id() -> str:
    return public_id("sbx")


class SandboxStatus(models.TextChoices):
    """Where a sandbox is: ``pending`` until its runtime holds it, ``running`` while commands may
    run, ``stopped`` once deleted or past its lifetime, ``failed`` if its runtime could not start it."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"
    FAILED = "failed"


#: The statuses that count against the organization's cap on concurrent sandboxes.
ACTIVE_STATUSES = (SandboxStatus.PENDING, SandboxStatus.RUNNING)


class NetworkPolicy(models.TextChoices):
    """``none``: only the sandbox's own loopback; ``egress``: the network the runtime allows out."""

    NONE = "none"
    EGRESS = "egress"


class Sandbox(models.Model):
    """One sandbox of a project.

    Limits: ``cpu_cores`` (cores; CPU time of a command is capped at cores × its timeout),
    ``memory_gb`` (address space of each process), ``disk_gb`` (the work directory),
    ``timeout_s`` (the sandbox's lifetime from creation, seconds). ``environment`` holds the
    variables every command starts with. ``organization`` repeats the project's organization so
    the per-organization cap counts in one indexed query. ``attempt`` is the job attempt that
    made it, if any (docs/sandboxes.md "Sandboxes of a job").
    """

    tenant_path = "project"
    objects = TenantManager()

    public_id = models.CharField(max_length=40, unique=True, default=_sandbox_public_id)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="sandboxes")
    name = models.CharField(max_length=100, blank=True)
    image = models.CharField(max_length=100)
    cpu_cores = models.FloatField()
    memory_gb = models.FloatField()
    disk_gb = models.FloatField()
    timeout_s = models.PositiveIntegerField()
    network = models.CharField(max_length=16, choices=NetworkPolicy.choices, default=NetworkPolicy.NONE)
    environment = models.JSONField(default=dict)
    labels = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=SandboxStatus.choices, default=SandboxStatus.PENDING)
    error = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    #: The job attempt whose engine made it (an environment scoring rollouts), or None: Lab
    #: deletes it when that attempt ends, however it ends.
    attempt = models.ForeignKey("jobs.JobAttempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="sandboxes")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    #: The pod of the Kubernetes pool that holds it, its uid (its agent's key is derived from it)
    #: and that pod's agent (``sandboxes.placement``); all empty when the one agent at
    #: ``LAB_SANDBOX_AGENT_URL`` holds it.
    pod_name = models.CharField(max_length=253, blank=True)
    pod_uid = models.CharField(max_length=64, blank=True)
    agent_url = models.CharField(max_length=300, blank=True)
    #: Whether its usage is on the billing ledger to its end (``sandboxes.usage``): a sandbox that
    #: ran is billed to the earlier of its stop and the end of its lifetime, once.
    usage_closed = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["project", "-id"], name="sandbox_project"),
            models.Index(fields=["organization", "status"], name="sandbox_organization_status"),
        ]

    def __str__(self) -> str:
        return self.public_id

    def __repr__(self) -> str:
        return f"<Sandbox {self.public_id} {self.status}>"
