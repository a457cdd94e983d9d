"""Environment packages: one row per pushed version of an organization's environment wheel."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from lab.models import ApiKey, Organization, User
from lab.tenancy import TenantManager


class EnvironmentKind(models.TextChoices):
    """Which protocol a package speaks (environments.wheels): verifiers' tasksets, or Lab's own."""

    VERIFIERS = "verifiers"
    LAB = "lab"


class EnvironmentPackage(models.Model):
    """One version of an organization's environment wheel, usable by all its projects.

    Its id is ``<organization slug>/<name>@<version>``. Versions are immutable and never reused:
    a deleted version keeps its row (``deleted_at`` set, its object gone) so that the same
    version cannot be pushed again with other bytes. Everything but who pushed it and when is
    read from the wheel's metadata.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="environment_packages")
    name = models.CharField(max_length=100)  # normalized project name (PEP 503), e.g. "my-env"
    version = models.CharField(max_length=64)  # normalized version (PEP 440), e.g. "0.1.0"
    kind = models.CharField(max_length=16, choices=EnvironmentKind.choices)
    filename = models.CharField(max_length=200)
    module = models.CharField(max_length=100)
    entry_point = models.CharField(max_length=300)
    summary = models.CharField(max_length=500, blank=True)
    dependencies = models.JSONField(default=list)
    verifiers_version = models.CharField(max_length=200, blank=True)
    requires_python = models.CharField(max_length=100, blank=True)
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    storage_key = models.CharField(max_length=400)
    pushed_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    pushed_by_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)

    tenant_owner = "organization"
    tenant_path = "organization"
    objects = TenantManager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "name", "version"], name="environment_version_unique"),
        ]
        ordering = ["name", "created_at"]

    @property
    def public_id(self) -> str:
        """The id jobs name it by: ``<organization slug>/<name>@<version>``."""
        return f"{self.organization.slug}/{self.name}@{self.version}"

    def __str__(self) -> str:
        return self.public_id


class BuildStatus(models.TextChoices):
    """Where a build is: waiting for a worker, running, or done (``ready`` or ``failed``)."""

    QUEUED = "queued"
    RUNNING = "running"
    READY = "ready"
    FAILED = "failed"


class EnvironmentBuild(models.Model):
    """One build of a package version (environments.builds): its lock, its summary, its log.

    A version's first build starts at push, with the index as it was at the push
    (``index_snapshot_at`` = the version's ``created_at``); a rebuild is a new row with a later
    snapshot and the next ``number``. The latest build (highest number) is the one that counts.
    ``lock`` lists every installed distribution: ``[{"name", "version", "filename", "sha256"}]``
    (wheels in the shared wheelhouse, ``environments/wheelhouse/<sha256>/<filename>``);
    ``summary`` what loading it found (``engine.environments.probe``).
    """

    package = models.ForeignKey(EnvironmentPackage, on_delete=models.CASCADE, related_name="builds")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=BuildStatus.choices, default=BuildStatus.QUEUED)
    index_url = models.CharField(max_length=500)
    index_snapshot_at = models.DateTimeField()
    python = models.CharField(max_length=32, blank=True)
    lock = models.JSONField(default=list)
    summary = models.JSONField(default=dict)
    error = models.TextField(blank=True)
    log_key = models.CharField(max_length=400, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    tenant_owner = "organization"
    tenant_path = "package__organization"
    tenant_parents = ("package",)
    objects = TenantManager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["package", "number"], name="environment_build_number_unique")]
        ordering = ["package", "number"]

    def __str__(self) -> str:
        return f"{self.package_id} build {self.number}"


class DatasetSnapshot(models.Model):
    """A dataset an organization pushed under a Hugging Face name (``<owner>/<name>``), which
    ``datasets.load_dataset("<owner>/<name>")`` resolves to, offline, in its builds and jobs
    (environments.datasets).

    One live snapshot per name and organization: pushing the name again replaces it. The stored
    object is one uncompressed tar of the dataset's files as pushed (``files``:
    ``[{"path", "size_bytes"}]``), ``sha256`` and ``size_bytes`` that tar's. ``owner`` is any
    Hugging Face namespace (``openai`` for ``openai/gsm8k``), not necessarily the organization's slug.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="dataset_snapshots")
    owner = models.CharField(max_length=96)
    name = models.CharField(max_length=96)
    filename = models.CharField(max_length=200)  # what was pushed: "train.jsonl", "arith.tar.gz", or "<dir>.tar" from the CLI
    files = models.JSONField(default=list)
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    storage_key = models.CharField(max_length=400)
    pushed_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    pushed_by_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    tenant_owner = "organization"
    tenant_path = "organization"
    objects = TenantManager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "owner", "name"], name="dataset_snapshot_name_unique"),
        ]
        ordering = ["owner", "name"]

    @property
    def public_id(self) -> str:
        """The name ``load_dataset`` is called with: ``<owner>/<name>``."""
        return f"{self.owner}/{self.name}"

    def __str__(self) -> str:
        return self.public_id
