"""Deployments and the inference servers that hold them (docs/serving.md).

A ``Deployment`` is tenant-owned: a project's name for something it may call through the
OpenAI-compatible API (a checkpoint, an adapter or a catalogue model). An ``InferenceServer`` is
Lab's own: one engine serving process (``python -m engine serve``) for one base model, shared by
every adapter deployed on that base whatever its project, or for one full checkpoint. Deployments
refer to their server; the server knows nothing of tenants.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from lab.ids import public_id
from lab.models import ApiKey, Organization, Project, User
from lab.tenancy import TenantManager


def _deployment_public_id() -> str:
    return public_id("dep")


def _server_public_id() -> str:
    return public_id("srv")


def _event_public_id() -> str:
    return public_id("evt")


class DeploymentStatus(models.TextChoices):
    """``pending`` (accepted, its weights being prepared) → ``deploying`` (waiting for its server
    to start and load it) → ``ready`` (callable) → ``unloading`` (deleted, leaving its server) →
    ``stopped``; ``failed`` (with ``status_reason``) when it could not be deployed."""

    PENDING = "pending"
    DEPLOYING = "deploying"
    READY = "ready"
    UNLOADING = "unloading"
    STOPPED = "stopped"
    FAILED = "failed"


#: Statuses that hold a name and count against the organization's cap.
ACTIVE_STATUSES = (DeploymentStatus.PENDING, DeploymentStatus.DEPLOYING, DeploymentStatus.READY, DeploymentStatus.UNLOADING)
#: Statuses a deployment never leaves.
TERMINAL_STATUSES = (DeploymentStatus.STOPPED, DeploymentStatus.FAILED)


class SourceType(models.TextChoices):
    """What a deployment serves: a job's checkpoint, a job's adapter, or a catalogue model."""

    CHECKPOINT = "checkpoint"
    ADAPTER = "adapter"
    MODEL = "model"


class ServingMode(models.TextChoices):
    """How it is served: ``adapter``, a LoRA adapter on its base model's shared server; ``base``,
    the base model itself on that server; ``dedicated``, full weights on a server of their own."""

    ADAPTER = "adapter"
    BASE = "base"
    DEDICATED = "dedicated"


class ServerStatus(models.TextChoices):
    """Where an inference server is: ``stopped`` (no process: never started, scaled to zero, or
    no deployment left), ``starting`` (its process is launched and loading), ``running``
    (answering, every deployment on it registered), ``stopping``, ``failed`` (its process ended
    while starting or running; the next request or deployment starts it again)."""

    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    FAILED = "failed"


#: The ``key`` prefix of a server of full weights (``weights:<checkpoint or adapter id>``), the
#: server of ``ServingMode.DEDICATED`` deployments.
DEDICATED_KEY_PREFIX = "weights:"


class InferenceServer(models.Model):
    """One engine serving process, started and stopped by Lab (``serving.servers``).

    ``key`` says what it serves: ``base:<model id>`` (the base model and adapters of it) or
    ``weights:<checkpoint or adapter id>`` (full weights of one checkpoint, in ``weights_dir``);
    ``served_model`` is the name requests give for what it serves besides adapters.
    ``generation`` counts its starts; ``handle`` is the runtime's handle of the current one;
    ``url`` where it answers; ``token`` what Lab presents to it (``LAB_SERVING_TOKEN``).
    ``last_request_at`` is touched by every request, and a running server idle for
    ``LAB_SERVING_IDLE_S`` is scaled to zero.
    """

    public_id = models.CharField(max_length=40, unique=True, default=_server_public_id)
    key = models.CharField(max_length=300, unique=True)
    model = models.CharField(max_length=200)
    served_model = models.CharField(max_length=200)
    weights_dir = models.CharField(max_length=1000, blank=True)
    status = models.CharField(max_length=10, choices=ServerStatus.choices, default=ServerStatus.STOPPED)
    status_reason = models.CharField(max_length=500, blank=True)
    generation = models.PositiveIntegerField(default=0)
    handle = models.JSONField(default=dict)
    url = models.CharField(max_length=200, blank=True)
    token = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    status_changed_at = models.DateTimeField(default=timezone.now)
    last_request_at = models.DateTimeField(null=True, blank=True)
    #: The current or last run of its process (one generation), as Lab launched and saw it end:
    #: what a dedicated server is billed for (``serving.usage``); ``run_billed`` once the run's
    #: last interval is on the ledger.
    run_started_at = models.DateTimeField(null=True, blank=True)
    run_ended_at = models.DateTimeField(null=True, blank=True)
    run_billed = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.public_id} ({self.key}, {self.status})"

    @property
    def dedicated(self) -> bool:
        """Whether it serves one deployment's full weights alone (``ServingMode.DEDICATED``)."""
        return self.key.startswith(DEDICATED_KEY_PREFIX)


class Deployment(models.Model):
    """One deployment of a project: ``name`` is what clients give as ``model``; ``source_type``
    and ``source_id`` what it serves; ``base_model`` the catalogue id under it; ``mode`` how
    (``ServingMode``); ``server`` the inference server that holds it (set once it is deploying);
    ``weights_dir`` where its weights were unpacked on this machine. ``organization`` repeats the
    project's, so the per-organization cap counts in one indexed query."""

    tenant_path = "project"
    objects = TenantManager()

    public_id = models.CharField(max_length=40, unique=True, default=_deployment_public_id)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="deployments")
    name = models.CharField(max_length=200)
    source_type = models.CharField(max_length=12, choices=SourceType.choices)
    source_id = models.CharField(max_length=200)
    base_model = models.CharField(max_length=200)
    mode = models.CharField(max_length=12, choices=ServingMode.choices)
    status = models.CharField(max_length=12, choices=DeploymentStatus.choices, default=DeploymentStatus.PENDING)
    status_reason = models.CharField(max_length=500, blank=True)
    server = models.ForeignKey(InferenceServer, null=True, blank=True, on_delete=models.PROTECT, related_name="deployments")
    weights_dir = models.CharField(max_length=1000, blank=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"], condition=Q(status__in=[status.value for status in ACTIVE_STATUSES]),
                name="deployment_name_unique_while_active",
            )
        ]
        indexes = [
            models.Index(fields=["project", "-id"], name="deployment_project"),
            models.Index(fields=["organization", "status"], name="deployment_organization_status"),
            models.Index(fields=["status"], name="deployment_status"),
        ]

    def __str__(self) -> str:
        return self.public_id

    def __repr__(self) -> str:
        return f"<Deployment {self.public_id} {self.status}>"


class DeploymentEventType(models.TextChoices):
    """What a deployment's events say: each status it reaches, as ``deployment.<status>``."""

    PENDING = "deployment.pending"
    DEPLOYING = "deployment.deploying"
    READY = "deployment.ready"
    UNLOADING = "deployment.unloading"
    STOPPED = "deployment.stopped"
    FAILED = "deployment.failed"


class DeploymentEvent(models.Model):
    """One status change of a deployment (``level`` ``info``, or ``error`` for ``failed``)."""

    tenant_path = "deployment__project"
    tenant_parents = ("deployment",)
    objects = TenantManager()

    public_id = models.CharField(max_length=40, unique=True, default=_event_public_id)
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")
    type = models.CharField(max_length=40, choices=DeploymentEventType.choices)
    level = models.CharField(max_length=8, default="info")
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["deployment", "-id"], name="deployment_event_order")]
