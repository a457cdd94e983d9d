"""The model registry's rows: ``Model`` (what jobs may name) and ``ModelBuild`` (the check of an
organization's pushed model), models of the ``jobs`` app (imported by ``jobs.models``)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from lab.models import ApiKey, Organization, User
from lab.tenancy import TenantManager


class ModelStatus(models.TextChoices):
    """Whether jobs may use a model: ``ready``; ``checking`` while the first check of a pushed
    model runs; ``failed`` when that check refused it (a later push that passes makes it ready)."""

    READY = "ready"
    CHECKING = "checking"
    FAILED = "failed"


class ModelSource(models.TextChoices):
    """Where a model came from: shipped with Lab, a directory an operator placed in
    ``LAB_MODEL_DIR``, added by an operator from a Hugging Face endpoint or a directory
    (``manage.py models add``), or pushed by an organization (``lab models push``)."""

    BUILTIN = "builtin"
    LOCAL = "local"
    HUB = "hub"
    DIRECTORY = "directory"
    PUSH = "push"


class Model(models.Model):
    """One model of the registry: what ``GET /models`` lists and a job's ``model`` may name.

    ``id`` is the catalogue id (``owner/name``). ``family`` is the architecture's family (the
    transformers ``model_type`` less a ``_moe`` suffix); ``parameters`` is the total count and
    ``active_parameters`` the count each token uses (mixture-of-experts only; null otherwise or
    when unknown). ``context_length`` is in tokens (0 until a pushed model's check has passed).
    ``training_modes`` is a JSON list of "lora" and "full"; ``lora_target_modules`` peft's
    ``target_modules`` (a list of module names, or "all-linear"); ``memory_gb`` the estimated GPU
    memory per mode in GB (``jobs.registry``: bytes per parameter × parameters × 1.2, empty when
    the size is unknown). ``tool_call_format`` is the chat template's (``hermes``, ``llama3_json``)
    or "". ``revision``, ``licence`` are "" when unknown. ``organization`` null offers the model to
    everyone; otherwise only that organization sees and uses it (another one gets
    ``unknown_model``, as for a missing model). ``source`` is a ``ModelSource``. A model in Lab's
    model store (``jobs.registry.store``) has its ``files`` there under ``storage_prefix``:
    ``[{"path", "size", "sha256"}]`` (bytes, hex); the built-ins and placed directories have none.
    Built-ins and placed directories are kept in step with the engine's catalogue by
    ``jobs.registry.sync_models`` (after every migrate, and ``manage.py models sync``).
    """

    id = models.CharField(primary_key=True, max_length=200)
    family = models.CharField(max_length=64, blank=True)
    architecture = models.CharField(max_length=64, blank=True)
    parameters = models.BigIntegerField(null=True)
    active_parameters = models.BigIntegerField(null=True)
    context_length = models.PositiveIntegerField()
    chat_template = models.BooleanField(default=False)
    tool_call_format = models.CharField(max_length=32, blank=True)
    training_modes = models.JSONField(default=list)
    lora_target_modules = models.JSONField(default=list)
    memory_gb = models.JSONField(default=dict)
    revision = models.CharField(max_length=64, blank=True)
    licence = models.CharField(max_length=64, blank=True)
    description = models.TextField(blank=True)
    source = models.CharField(max_length=16, default=ModelSource.BUILTIN)
    status = models.CharField(max_length=16, choices=ModelStatus.choices, default=ModelStatus.READY)
    files = models.JSONField(default=list)
    storage_prefix = models.CharField(max_length=400, blank=True)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, null=True, blank=True, related_name="models")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.id

    @property
    def size_bytes(self) -> int:
        """The bytes of its stored files (0 for a model Lab does not store)."""
        return sum(int(file["size"]) for file in self.files)


class ModelBuildStatus(models.TextChoices):
    """Where the check of a pushed model is: waiting for a worker, running, or done."""

    QUEUED = "queued"
    RUNNING = "running"
    READY = "ready"
    FAILED = "failed"


class ModelBuild(models.Model):
    """One check of an archive an organization pushed as ``model`` (``jobs.registry.builds``).

    ``number`` counts the model's builds from 1; the highest is the latest. The archive is kept in
    storage at ``archive_key`` until its build ends; ``revision`` is the stored revision a passed
    check made (its files are the model's then); ``error`` says why a failed one was refused, and
    ``log_key`` holds its log.
    """

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="builds")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=ModelBuildStatus.choices, default=ModelBuildStatus.QUEUED)
    archive_key = models.CharField(max_length=400)
    archive_sha256 = models.CharField(max_length=64)
    archive_size_bytes = models.BigIntegerField()
    revision = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    log_key = models.CharField(max_length=400, blank=True)
    pushed_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    pushed_by_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    tenant_owner = "organization"
    tenant_path = "organization"
    objects = TenantManager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "number"], name="model_build_number_unique")]
        ordering = ["model", "number"]

    def __str__(self) -> str:
        return f"{self.model_id} build {self.number}"
