"""Server-side validation of job specs: the shared model, the catalogues, the pool, ``init_from``.

``labsdk.spec`` checks a spec's shape; here it is also checked against what this Lab has
installed (models, environments), what its pool can ever run, and the project's checkpoints.
Every problem is reported at once, as 400 ``invalid_spec`` with ``errors``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.db.models import Q
from labsdk.spec import (
    ParsedSpec,
    SpecError,
    SpecProblem,
    catalog_problems,
    fit_seq_len,
    parse_spec,
    secret_problems,
    translate_layout,
)

from engine.catalog import EnvironmentInfo, list_environments, list_models
from environments.arguments import argument_problems
from environments.builds import build_failure_message, latest_build
from environments.models import BuildStatus, EnvironmentPackage
from environments.services import EnvironmentRef, environment_catalogue, environment_find
from jobs.models import Checkpoint, CheckpointStatus, Model
from jobs.pool import pool_problems
from jobs.registry import registry_fields
from lab.errors import FieldError, LabError
from lab.models import Organization, Project


@dataclass(frozen=True)
class ValidatedSpec:
    """A spec that this Lab can run for this project."""

    parsed: ParsedSpec
    init_from: Checkpoint | None
    #: The uploaded packages the spec names, resolved to exact versions, by where: ``("env", N)``
    #: for ``env.N`` and ``("eval.env", N)`` for ``eval.env.N``.
    environment_packages: Mapping[tuple[str, int], EnvironmentPackage] = field(default_factory=dict)

    @property
    def canonical(self) -> dict[str, Any]:
        """The canonical JSON dict stored as ``Job.spec``: every default filled in, so readers of
        a job's spec index it directly and no default is restated outside ``labsdk.spec``; an
        uploaded environment's id names its exact version (``@latest`` resolved at submit)."""
        canonical = self.parsed.to_dict()
        for (section, index), package in self.environment_packages.items():
            blocks = canonical["env"] if section == "env" else canonical["eval"]["env"]
            blocks[index]["id"] = package.public_id
        return canonical


def installed_models(organization: Organization | None = None) -> dict[str, Model]:
    """Return the models ``organization`` may use, keyed by catalogue id: the registry's models
    offered to everyone and, with ``organization``, its own (``jobs.models.Model``; another
    organization's are absent, as a missing model is). A Hugging Face directory an operator placed
    in ``LAB_MODEL_DIR`` since the last ``manage.py models sync`` is listed too, as an unsaved row
    offered to everyone, unless the registry holds its id."""
    visible = Q(organization__isnull=True)
    if organization is not None:
        visible |= Q(organization=organization)
    models = {model.id: model for model in Model.objects.filter(visible).select_related("organization")}
    model_dir = Path(settings.LAB_MODEL_DIR)
    unsynced = {model_id: info for model_id, info in list_models(model_dir).items() if model_id not in models}
    if unsynced:
        registered = set(Model.objects.filter(id__in=unsynced).values_list("id", flat=True))
        models |= {model_id: Model(**registry_fields(info, model_dir)) for model_id, info in unsynced.items() if model_id not in registered}
    return models


def installed_environments(organization: Organization | None = None) -> dict[str, EnvironmentInfo]:
    """Return the environments installed on this Lab: the built-ins, and with ``organization`` its
    uploaded packages under every id that names one (``environments.services.environment_catalogue``)."""
    environments = list_environments()
    if organization is not None:  # an organization slugged "lab" cannot shadow a built-in
        environments = environment_catalogue(organization=organization) | environments
    return environments


def _resolve_packages(
    organization: Organization, spec, environments: Mapping[str, EnvironmentInfo], *, lock: bool
) -> tuple[dict[tuple[str, int], EnvironmentPackage], list[SpecProblem]]:
    """Find the package each uploaded ``env.N.id`` and ``eval.env.N.id`` names (its latest
    version when it names none), locking the rows with ``lock``; a package deleted meanwhile
    reads like a missing one. Ids that ``environments`` does not hold are left to
    ``catalog_problems``, which reports them; ``spec`` may be the stand-in that
    ``_raw_spec`` builds (no ``eval``). A block naming a package whose latest build is ready has
    its ``args`` checked against the arguments that build recorded, for every kind of package
    (``environments.arguments``)."""
    packages, problems = {}, []
    blocks = [("env", index, env) for index, env in enumerate(spec.env)]
    blocks += [("eval.env", index, env) for index, env in enumerate(getattr(getattr(spec, "eval", None), "env", None) or [])]
    for section, index, env in blocks:
        if env.id not in environments:
            continue
        ref = EnvironmentRef.parse(env.id) if env.id not in list_environments() else None
        if ref is None:
            continue
        package = environment_find(organization=organization, ref=ref, lock=lock)
        if package is None:
            installed = ", ".join(sorted(name for name in environments if name != env.id)) or "none"
            problems.append(SpecProblem(
                f"{section}.{index}.id", "unknown_environment",
                f"environment '{env.id}' is not installed; installed environments: {installed}",
            ))
        else:
            packages[(section, index)] = package
            build = latest_build(package)
            if build is not None and build.status == BuildStatus.FAILED:
                problems.append(SpecProblem(
                    f"{section}.{index}.id", "environment_build_failed", build_failure_message(package.public_id, build),
                ))
            elif build is not None and build.status == BuildStatus.READY:
                problems += argument_problems(f"{section}.{index}", env, package.public_id, build.summary)
    return packages, problems


def _raw_spec(data: Mapping[str, Any]) -> SimpleNamespace:
    """A stand-in for the spec of ``data`` that failed shape validation, with what the catalogue
    checks read (``model``, ``sampling.max_tokens``, each ``env`` block's ``id`` and ``args``);
    a field that is not usable is ``None`` (an id), ``0`` or ``{}``."""
    model = data.get("model")
    sampling = data.get("sampling") if isinstance(data.get("sampling"), Mapping) else {}
    max_tokens = sampling.get("max_tokens")
    envs = data.get("env") if isinstance(data.get("env"), list) else []
    return SimpleNamespace(
        model=model if isinstance(model, str) else None,
        sampling=SimpleNamespace(max_tokens=max_tokens if type(max_tokens) is int else 0),
        env=[
            SimpleNamespace(
                id=env.get("id") if isinstance(env, Mapping) and isinstance(env.get("id"), str) else None,
                args=env.get("args") if isinstance(env, Mapping) and isinstance(env.get("args"), Mapping) else {},
            )
            for env in envs
        ],
    )


def _raw_catalog_problems(spec_like: SimpleNamespace, models, environments, known: set[str]) -> list[SpecProblem]:
    """Catalogue checks on a spec that failed shape validation (``_raw_spec``), for the fields
    that are usable and have no shape problem (``known`` holds the params that have one)."""
    problems = catalog_problems(spec_like, models=models, environments=environments)
    unusable = {"model"} if spec_like.model is None else set()
    unusable |= {f"env.{index}.id" for index, env in enumerate(spec_like.env) if env.id is None}
    return [
        problem
        for problem in problems
        if problem.param not in known and problem.param not in unusable and not problem.param.startswith(
            tuple(f"{param}." for param in unusable)
        )
    ]


def _init_from_problems(project: Project, spec) -> tuple[Checkpoint | None, list[SpecProblem]]:
    """Find ``spec.init_from`` among the project's ready checkpoints and check that it fits the
    job: the same base model, and the same LoRA rank (0 = full weights), as the engine requires."""
    checkpoint_id = spec.init_from
    if checkpoint_id is None:
        return None, []
    checkpoint = (
        Checkpoint.objects.select_related("job")
        .filter(job__project=project, public_id=checkpoint_id, status=CheckpointStatus.READY)
        .first()
    )
    if checkpoint is None:
        # Another project's checkpoint reads exactly like a missing one.
        return None, [
            SpecProblem("init_from", "unknown_checkpoint", f"no ready checkpoint '{checkpoint_id}' in this project")
        ]
    source = checkpoint.job.spec
    problems = []
    if source.get("model") != spec.model:
        problems.append(
            SpecProblem(
                "init_from",
                "incompatible_checkpoint",
                f"checkpoint '{checkpoint_id}' was trained from {source.get('model')}; this job's model is {spec.model}",
            )
        )
    elif source.get("lora_rank") != spec.lora_rank:
        problems.append(
            SpecProblem(
                "lora_rank",
                "incompatible_checkpoint",
                f"checkpoint '{checkpoint_id}' has lora_rank {source.get('lora_rank')} (0 = full weights); "
                f"this job asks for {spec.lora_rank}",
            )
        )
    return checkpoint, problems


def validate_job_spec(
    *, project: Project, data: Any, lock_environments: bool = False, secret_names: Collection[str] | Mapping[str, str] = ()
) -> ValidatedSpec:
    """Validate ``data`` (decoded JSON) as a job spec for ``project``, whose job is given the
    secrets named ``secret_names`` (given the secrets themselves, a name -> value mapping, the
    values the teacher sends as headers are checked too: ``labsdk.spec.secret_problems``).

    Returns the ValidatedSpec, its uploaded environments resolved to exact versions (locked for
    the caller's transaction with ``lock_environments``, so that no delete slips in before the job
    exists). Raises LabError ``invalid_spec`` listing every problem with its dotted path:
    shape and cross-field rules, unknown model or environment (another organization's package is
    unknown), environment arguments, context length, pool capacity, ``init_from``, and secrets the
    spec names (``[teacher.client] api_key_var``) that the job is not given. The uploaded packages
    are looked up whatever else is wrong, so their problems come in the same answer; a spec that
    fails shape validation is still checked against the catalogues and the packages where its
    fields are usable.
    """
    models, environments = installed_models(project.organization), installed_environments(project.organization)
    try:
        parsed = parse_spec(data)
    except SpecError as exc:
        problems = list(exc.errors)
        # a spec refused as too deep is not read any further (translating it would recurse through it)
        if isinstance(data, Mapping) and not any(problem.code == "too_deep" and problem.param in data for problem in problems):
            known = {problem.param for problem in problems}
            spec_like = _raw_spec(translate_layout(data)[0])
            problems += _raw_catalog_problems(spec_like, models, environments, known)
            _, package_problems = _resolve_packages(project.organization, spec_like, environments, lock=False)
            problems += [problem for problem in package_problems if problem.param not in known]
        raise _invalid_spec(problems) from None
    if parsed.spec.model in models:
        parsed = fit_seq_len(parsed, models[parsed.spec.model].context_length)
    spec = parsed.spec
    problems = catalog_problems(spec, models=models, environments=environments)
    problems += pool_problems(spec)
    checkpoint, init_problems = _init_from_problems(project, spec)
    problems += init_problems
    problems += secret_problems(spec, secret_names)
    # a spec with other problems is refused anyway: its packages are only read, not locked
    packages, package_problems = _resolve_packages(
        project.organization, spec, environments, lock=lock_environments and not problems
    )
    problems += package_problems
    if problems:
        raise _invalid_spec(problems)
    return ValidatedSpec(parsed=parsed, init_from=checkpoint, environment_packages=packages)


def _invalid_spec(problems: list[SpecProblem]) -> LabError:
    errors = [FieldError(param=problem.param or None, code=problem.code, message=problem.message) for problem in problems]
    first = errors[0]
    message = f"{first.param}: {first.message}" if first.param else first.message
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return LabError("invalid_spec", message, errors=errors)
