"""Where jobs meet environment packages: a package in use cannot be deleted, and a launch carries
the packages its job's spec names.

``environments`` never imports ``jobs``, so the checks that need jobs live here (docs/architecture.md "Layout").
A job's stored spec names each uploaded environment by its exact version (resolved at submit,
``jobs.specs``), so "in use" is "named by the spec of a job that is not finished".
"""

from __future__ import annotations

from django.db import transaction

from environments.models import EnvironmentPackage
from environments.services import EnvironmentRef, environment_find, environment_mark_deleted, package_download_url
from jobs.models import Job, JobStatus
from lab.audit import Actor
from lab.errors import LabError, not_found
from lab.models import Organization

#: Statuses of jobs that will still run their environments.
UNFINISHED_STATUSES = (JobStatus.QUEUED, JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELLING)


def _environment_ids(spec: dict) -> list[str]:
    """The environment ids a stored spec names: its ``env`` blocks' and its ``[[eval.env]]`` blocks'."""
    evaluation = spec.get("eval") if isinstance(spec.get("eval"), dict) else {}
    blocks = [*spec.get("env", []), *(evaluation.get("env") or [])]
    return [env.get("id", "") for env in blocks if isinstance(env, dict)]


def jobs_using(package: EnvironmentPackage) -> list[str]:
    """Return the public ids of the unfinished jobs of the package's organization whose spec names it."""
    jobs = Job.objects.unscoped().filter(project__organization=package.organization_id, status__in=UNFINISHED_STATUSES)
    return [public_id for public_id, spec in jobs.values_list("public_id", "spec") if package.public_id in _environment_ids(spec)]


@transaction.atomic
def environment_delete(*, organization: Organization, actor: Actor, environment_id: str) -> EnvironmentPackage:
    """Delete the package version ``environment_id`` names in ``organization`` (no version: the latest).

    Returns the deleted package. Raises LabError ``not_found`` for a missing or another
    organization's package, and 409 ``invalid_state`` naming the jobs while a queued or running
    job uses it; nothing changes then. The row is locked while checking, and a submit locks the
    rows it resolves (``jobs.specs.validate_job_spec``), so no job can start using it meanwhile.
    """
    ref = EnvironmentRef.parse(environment_id)
    package = environment_find(organization=organization, ref=ref, lock=True) if ref is not None else None
    if package is None:
        raise not_found("environment")
    using = jobs_using(package)
    if using:
        raise LabError(
            "invalid_state",
            f"{package.public_id} is used by {len(using)} queued or running job{'s' if len(using) > 1 else ''} "
            f"({', '.join(sorted(using)[:5])}); delete it once they have finished.",
        )
    environment_mark_deleted(package=package, actor=actor)
    return package


def launch_packages(job: Job) -> tuple[dict, ...]:
    """Return the packages an attempt of ``job`` installs, for ``LaunchRequest.environment_packages``:
    ``{"id", "sha256", "url", "filename"}`` per uploaded environment its spec names (deleted
    versions are left out, and the engine then reports the environment as not installed)."""
    ids = set(_environment_ids(job.spec))
    names = {ref.name for ref in map(EnvironmentRef.parse, ids) if ref is not None}
    packages = EnvironmentPackage.objects.unscoped().filter(
        organization=job.project.organization_id, name__in=names, deleted_at=None
    ).select_related("organization")
    return tuple(
        {"id": package.public_id, "sha256": package.sha256, "url": package_download_url(package), "filename": package.filename}
        for package in packages
        if package.public_id in ids
    )
