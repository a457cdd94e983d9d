"""Where jobs meet environment packages: a package in use cannot be deleted, a launch carries
the packages its job's spec names, and a queued job waits for their builds (admission).

``environments`` never imports ``jobs``, so the checks that need jobs live here (docs/architecture.md "Layout").
A job's stored spec names each uploaded environment by its exact version (resolved at submit,
``jobs.specs``), so "in use" is "named by the spec of a job that is not finished".
"""

from __future__ import annotations

from collections import defaultdict

from django.db import transaction
from django.db.models import Q

from environments import hub_datasets
from environments.builds import build_failure_message, environment_secrets, missing_secrets_message
from environments.datasets import launch_datasets
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from environments.services import (
    EnvironmentRef,
    environment_find,
    environment_mark_deleted,
    package_download_url,
    wheelhouse_download_url,
)
from jobs.models import Job, JobKind, JobStatus
from jobs.secrets.models import JobSecrets
from lab.audit import Actor
from lab.errors import FieldError, LabError, not_found
from lab.models import Organization

#: Statuses of jobs that will still run their environments.
UNFINISHED_STATUSES = (JobStatus.QUEUED, JobStatus.STARTING, JobStatus.RUNNING, JobStatus.CANCELLING)


def _blocks(spec: dict) -> list[dict]:
    """The environment blocks of a stored spec: its ``env`` blocks and its ``[[eval.env]]`` blocks."""
    evaluation = spec.get("eval") if isinstance(spec.get("eval"), dict) else {}
    return [env for env in [*spec.get("env", []), *(evaluation.get("env") or [])] if isinstance(env, dict)]


def _environment_ids(spec: dict) -> list[str]:
    """The environment ids a stored spec names: its ``env`` blocks' and its ``[[eval.env]]`` blocks'."""
    return [env.get("id", "") for env in _blocks(spec)]


def _secrets_read(spec: dict, environment_id: str, summary: dict) -> list[str]:
    """The job secrets the package ``environment_id`` reads in the blocks of ``spec`` that name it
    (``environments.builds.environment_secrets`` of each block's args), each once."""
    names: list[str] = []
    for env in _blocks(spec):
        if env.get("id") == environment_id:
            args = env.get("args") if isinstance(env.get("args"), dict) else {}
            names += [name for name in environment_secrets(summary, args) if name not in names]
    return names


def _secret_names(job_ids) -> dict[int, list[str]]:
    """The names of the secrets each of ``job_ids`` was given (none for a job without). One query."""
    return dict(JobSecrets.objects.unscoped().filter(job_id__in=job_ids).values_list("job_id", "names"))


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
    versions are left out, and the engine then reports the environment as not installed), with
    ``build`` for a package whose latest build is ready and loaded it through ``load_environment``
    (API ``v0``): ``{"number", "api", "lock": [{"name", "version", "filename", "sha256", "url"}],
    "secrets": [name], "datasets": [{"id", "sha256", "url"}]}``, each ``url`` the wheel's in the shared wheelhouse (``engine.build_envs``
    installs them), ``secrets`` the names of the job's secrets the environment reads (the engine
    hands their values to its bridge, and nothing else of its environment), ``datasets`` the
    organization's pushed datasets (``environments.datasets``) as they are at launch, which the
    engine unpacks where ``load_dataset("owner/name")`` finds them (``engine.dataset_snapshots``),
    ``hub_datasets`` the Hugging Face datasets the build fetched (``{"sha256", "url"}``, or null:
    ``environments.hub_datasets``), which the engine loads offline."""
    ids = set(_environment_ids(job.spec))
    names = {ref.name for ref in map(EnvironmentRef.parse, ids) if ref is not None}
    packages = [
        package for package in EnvironmentPackage.objects.unscoped().filter(
            organization=job.project.organization_id, name__in=names, deleted_at=None
        ).select_related("organization")
        if package.public_id in ids
    ]
    builds = {
        build.package_id: build
        for build in EnvironmentBuild.objects.unscoped().filter(package__in=packages).order_by("package_id", "number")
    }  # the highest number wins
    given = set(_secret_names([job.pk]).get(job.pk, []))
    datasets = None  # the organization's pushed datasets, read once for every package that needs them
    launched = []
    for package in packages:
        item = {"id": package.public_id, "sha256": package.sha256, "url": package_download_url(package), "filename": package.filename}
        build = builds.get(package.pk)
        if build is not None and build.status == BuildStatus.READY and build.summary.get("api") == "v0":
            item["build"] = {
                "number": build.number,
                "api": "v0",
                "lock": [{**entry, "url": wheelhouse_download_url(entry)} for entry in build.lock],
                "secrets": [name for name in _secrets_read(job.spec, package.public_id, build.summary) if name in given],
                "datasets": datasets if datasets is not None else (datasets := launch_datasets(package.organization_id)),
                "hub_datasets": hub_datasets.launch_entry(package.organization.public_id, build.summary),
            }
        launched.append(item)
    return tuple(launched)


def environment_build_holds(job_ids: list[int]) -> tuple[set[int], dict[int, str]]:
    """Of the queued jobs ``job_ids``, return those that name a package version whose latest build
    is still queued or running (they wait: ``environment_building``), and ``{job id: message}``
    for those that name one whose latest build failed (the job fails with the build's error;
    this wins over waiting) or whose ready build reads a secret the job was not given (it fails
    naming it: the check a submit makes when the build is ready already), and a training job
    whose ``env`` names one whose ready build has no train dataset (``no_train_dataset_message``).
    A version with no build at all holds nothing. Three queries."""
    rows = list(Job.objects.unscoped().filter(pk__in=job_ids).values_list("pk", "project__organization_id", "spec", "kind"))
    named = {pk: (organization, sorted(set(_environment_ids(spec)))) for pk, organization, spec, _ in rows}
    names: dict[int, set[str]] = defaultdict(set)
    for organization, ids in named.values():
        names[organization].update(ref.name for ref in map(EnvironmentRef.parse, ids) if ref is not None)
    if not names:
        return set(), {}
    wanted = Q()
    for organization, package_names in names.items():
        wanted |= Q(package__organization=organization, package__name__in=package_names)
    builds = (
        EnvironmentBuild.objects.unscoped().filter(wanted).select_related("package__organization")
        .defer("lock").order_by("package_id", "number")
    )
    latest = {(build.package.organization_id, build.package.public_id): build for build in builds}  # the highest number wins
    given = _secret_names(list(named))
    specs = {pk: spec for pk, _, spec, _ in rows}
    trained = {pk: {env.get("id") for env in spec.get("env", []) if isinstance(env, dict)} for pk, _, spec, kind in rows if kind != JobKind.EVALUATION}
    building: set[int] = set()
    failed: dict[int, str] = {}
    for pk, (organization, ids) in named.items():
        for environment_id in ids:
            build = latest.get((organization, environment_id))
            if build is not None and build.status == BuildStatus.FAILED:
                failed[pk] = build_failure_message(environment_id, build)
                break
            missing = [] if build is None or build.status != BuildStatus.READY else [
                name for name in _secrets_read(specs[pk], environment_id, build.summary) if name not in given.get(pk, [])
            ]
            if missing:
                failed[pk] = missing_secrets_message(environment_id, missing, given.get(pk, []))
                break
            if environment_id in trained.get(pk, ()) and _without_train_dataset(build):
                failed[pk] = no_train_dataset_message(environment_id)
                break
            if build is not None and build.status in (BuildStatus.QUEUED, BuildStatus.RUNNING):
                building.add(pk)
    return building - failed.keys(), failed


def train_dataset_errors(packages) -> list[FieldError]:
    """The ``env.N.id`` blocks of a training job (``ValidatedSpec.environment_packages``) that name a
    package whose ready ``load_environment`` build recorded an eval dataset and no train dataset
    (its summary's ``train_dataset`` false; a build before it recorded that is taken): such an environment evaluates (``[[eval.env]]``, an
    evaluation) but has nothing to train on, so the submit is refused naming it. One query."""
    blocks = {key: package for key, package in packages.items() if key[0] == "env"}
    if not blocks:
        return []
    latest = {
        build.package_id: build
        for build in EnvironmentBuild.objects.unscoped().filter(package__in=set(blocks.values())).defer("lock").order_by("package_id", "number")
    }  # the highest number wins
    errors = []
    for (section, index), package in sorted(blocks.items(), key=lambda item: item[0]):
        if _without_train_dataset(latest.get(package.pk)):
            errors.append(FieldError(f"{section}.{index}.id", "no_train_dataset", no_train_dataset_message(package.public_id)))
    return errors


def _without_train_dataset(build: EnvironmentBuild | None) -> bool:
    """Whether ``build`` is a ready ``load_environment`` build that recorded no train dataset."""
    summary = (build.summary or {}) if build is not None and build.status == BuildStatus.READY else {}
    return summary.get("api") == "v0" and summary.get("train_dataset") is False


def no_train_dataset_message(environment_id: str) -> str:
    """What a training job naming ``environment_id``, whose build has an eval dataset only, is told."""
    return (
        f"environment '{environment_id}' has no train dataset: its load_environment returns an environment with an "
        "eval_dataset only, which evaluations use (POST /api/v1/evaluations, or an [[eval.env]] block of a job); "
        "training needs its dataset (vf.SingleTurnEnv(dataset=..., eval_dataset=...))"
    )
