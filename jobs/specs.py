"""Server-side validation of job specs: the shared model, the catalogues, the pool, ``init_from``.

``labsdk.spec`` checks a spec's shape; here it is also checked against what this Lab has
installed (models, environments), what its pool can ever run, and the project's checkpoints.
Every problem is reported at once, as 400 ``invalid_spec`` with ``errors``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from lab_environments import EnvironmentInfo
from labsdk.spec import (
    JUDGE_ARGS,
    ParsedSpec,
    SpecError,
    SpecProblem,
    argument_problems,
    catalog_problems,
    fit_seq_len,
    parse_spec,
    secret_problems,
    translate_layout,
)
from labsdk.spec.warnings import single_turn_warnings

from engine.catalog import list_environments
from engine.egress import origin_of
from environments.builds import build_failure_message, environment_secrets, latest_build, missing_secrets_message
from environments.models import BuildStatus, EnvironmentPackage
from environments.services import EnvironmentRef, environment_catalogue, environment_find
from jobs.deployments import DeploymentUnusable, deployment_endpoint
from jobs.models import Adapter, AdapterStatus, Checkpoint, CheckpointFormat, CheckpointStatus, Model
from jobs.pool import model_gpu_problems, pool_problems
from jobs.registry.selectors import installed_models, latest_builds, model_list
from lab.errors import FieldError, LabError
from lab.lib.http import UnsafeURL, check_url
from lab.models import Organization, Project


@dataclass(frozen=True)
class ValidatedSpec:
    """A spec that this Lab can run for this project."""

    parsed: ParsedSpec
    init_from: Checkpoint | None
    #: The registry's row of the spec's model (what the estimate and admission read its size from).
    model: Model | None = None
    #: The uploaded packages the spec names, resolved to exact versions, by where: ``("env", N)``
    #: for ``env.N`` and ``("eval.env", N)`` for ``eval.env.N``.
    environment_packages: Mapping[tuple[str, int], EnvironmentPackage] = field(default_factory=dict)
    #: What Lab warns of beyond the spec's own warnings (``parsed.warnings``): the episode limits
    #: of an uploaded package whose build recorded it single-turn (``_package_warnings``).
    package_warnings: tuple[str, ...] = ()

    @property
    def warnings(self) -> list[str]:
        """Every warning of the spec, stored with its job and answered by an estimate."""
        return [*self.parsed.warnings, *self.package_warnings]

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


def installed_environments(organization: Organization | None = None) -> dict[str, EnvironmentInfo]:
    """Return the environments installed on this Lab: the built-ins, and with ``organization`` its
    uploaded packages under every id that names one (``environments.services.environment_catalogue``)."""
    environments = list_environments()
    if organization is not None:  # an organization slugged "lab" cannot shadow a built-in
        environments = environment_catalogue(organization=organization) | environments
    return environments


def _resolve_packages(
    organization: Organization, spec, environments: Mapping[str, EnvironmentInfo], *, lock: bool,
    secret_names: Collection[str] = (),
) -> tuple[dict[tuple[str, int], EnvironmentPackage], list[SpecProblem]]:
    """Find the package each uploaded ``env.N.id`` and ``eval.env.N.id`` names (its latest
    version when it names none), locking the rows with ``lock``; a package deleted meanwhile
    reads like a missing one. Ids that ``environments`` does not hold are left to
    ``catalog_problems``, which reports them; ``spec`` may be the stand-in that
    ``_raw_spec`` builds (no ``eval``). A block naming a package whose latest build is ready has
    its ``args`` checked against the arguments that build recorded, for every kind of package
    (``labsdk.spec.arguments``), and the secrets it reads (``environments.builds.environment_secrets``)
    against the job's ``secret_names``."""
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
                missing = [name for name in environment_secrets(build.summary, env.args) if name not in secret_names]
                if missing:
                    problems.append(SpecProblem(
                        f"{section}.{index}.id", "missing_secret", missing_secrets_message(package.public_id, missing, secret_names),
                    ))
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


def _deployment_problems(project: Project, spec) -> list[SpecProblem]:
    """Resolve, in place, each deployment the spec names as an endpoint into the endpoint of Lab's
    own OpenAI-compatible API (``jobs.deployments``): ``[teacher] deployment`` into
    ``teacher.model`` and ``teacher.client.base_url``, an ``[[env]] judge`` (and an
    ``[[eval.env]]`` one) into the environment's ``judge_model``, ``judge_base_url`` and
    ``judge_api_key_var`` args; a judge endpoint the block declares (``judge.base_url``) into the
    same args as given (``EnvJudgeConfig.declared_args``). Return a problem for a deployment the project does not have
    (another organization's reads the same) or that is no longer active, and for a resolved key
    the spec also gives with another value. Giving the resolved values again is accepted, so a
    stored spec submits again unchanged."""
    problems: list[SpecProblem] = []

    def resolve(param: str, deployment_id: str):
        try:
            return deployment_endpoint(project=project, deployment_id=deployment_id)
        except DeploymentUnusable as unusable:
            problems.append(SpecProblem(param, unusable.code, str(unusable)))
            return None

    def conflict(param: str, given: Any, resolved: str, called: str) -> bool:
        if given is None or given == resolved:
            return False
        problems.append(SpecProblem(
            param, "conflicting_keys",
            f"{called} is called as {resolved!r}; leave this key out (Lab sets it), or give that value",
        ))
        return True

    teacher = spec.teacher
    if teacher is not None and teacher.deployment is not None and spec.loss == "sft":
        endpoint = resolve("teacher.deployment", teacher.deployment)
        if endpoint is not None:
            clashes = [
                conflict("teacher.model", teacher.model, endpoint.model, f"deployment '{teacher.deployment}'"),
                conflict("teacher.client.base_url", teacher.client.base_url, endpoint.base_url, f"deployment '{teacher.deployment}'"),
            ]
            if not any(clashes):
                teacher.model, teacher.client.base_url = endpoint.model, endpoint.base_url
    blocks = [("env", index, env) for index, env in enumerate(spec.env)]
    blocks += [("eval.env", index, env) for index, env in enumerate(spec.eval.env or [])]
    for section, index, env in blocks:
        if env.judge is None:
            continue
        if env.judge.deployment is None:  # an endpoint the job declares: its args as given
            resolved, called = env.judge.declared_args(), f"judge {env.judge.base_url!r}"
        else:
            endpoint = resolve(f"{section}.{index}.judge.deployment", env.judge.deployment)
            if endpoint is None:
                continue
            resolved = dict(zip(JUDGE_ARGS, (endpoint.model, endpoint.base_url, env.judge.api_key_var), strict=True))
            called = f"deployment '{env.judge.deployment}'"
        clashes = [conflict(f"{section}.{index}.args.{name}", env.args.get(name), value, called) for name, value in resolved.items()]
        if not any(clashes):
            env.args = {**env.args, **resolved}
    return problems


def _eval_adapter_problems(project: Project, spec) -> list[SpecProblem]:
    """Find ``spec.eval.adapter`` among the project's ready adapters and check that it fits the
    evaluation: the same base model and LoRA rank (0 = full weights) as its job's."""
    adapter_id = spec.eval.adapter
    if adapter_id is None:
        return []
    adapter = (
        Adapter.objects.select_related("job")
        .filter(job__project=project, public_id=adapter_id, status=AdapterStatus.READY)
        .first()
    )
    if adapter is None:
        # Another project's adapter reads exactly like a missing one.
        return [SpecProblem("eval.adapter", "unknown_adapter", f"no ready adapter '{adapter_id}' in this project")]
    source = adapter.job.spec
    if source.get("model") != spec.model:
        return [SpecProblem(
            "eval.adapter", "incompatible_adapter",
            f"adapter '{adapter_id}' was trained from {source.get('model')}; this job's model is {spec.model}",
        )]
    rank = int(source.get("lora_rank") or 0) if adapter.format == CheckpointFormat.PEFT_LORA else 0
    if rank != spec.lora_rank:
        return [SpecProblem(
            "lora_rank", "incompatible_adapter",
            f"adapter '{adapter_id}' has lora_rank {rank} (0 = full weights); this job asks for {spec.lora_rank}",
        )]
    return []


def _endpoint_problems(spec) -> list[SpecProblem]:
    """The problems of the endpoints the job's engines would call on an address this pool's engines
    may not reach: an ``[eval.endpoint]``, a ``[teacher.client]`` and each ``[[env]]``/
    ``[[eval.env]]`` judge the block declares (``judge.base_url``). Each is judged by
    ``lab.lib.http.check_url`` as the launchers judge it again at launch: a loopback, private or
    shared address unless ``LAB_ENGINE_EGRESS_ALLOW_PRIVATE`` (``private_address``), a link-local
    or cloud-metadata address whatever the configuration (``blocked_address``). A host name is
    resolved now; one that does not resolve passes (the launch checks it again). Lab's own origin
    (``LAB_PUBLIC_URL``, where a deployment's endpoint is) passes, as the launchers relay it already."""
    endpoints = []
    if spec.eval.endpoint is not None:
        endpoints.append(("eval.endpoint.base_url", spec.eval.endpoint.base_url))
    if spec.teacher is not None and spec.teacher.client is not None and spec.teacher.client.base_url:
        endpoints.append(("teacher.client.base_url", spec.teacher.client.base_url))
    blocks = [("env", index, env) for index, env in enumerate(spec.env)]
    blocks += [("eval.env", index, env) for index, env in enumerate(spec.eval.env or [])]
    endpoints += [(f"{section}.{index}.judge.base_url", env.judge.base_url)
                  for section, index, env in blocks if env.judge is not None and env.judge.base_url]
    problems = []
    for param, url in endpoints:
        if origin_of(url) == origin_of(settings.LAB_PUBLIC_URL):
            continue
        try:
            check_url(url, allow_private=settings.LAB_ENGINE_EGRESS_ALLOW_PRIVATE)
        except UnsafeURL as error:
            message = error.message
            if error.code == "private_address":
                message += " This pool's engines reach loopback and private addresses only when Lab runs with LAB_ENGINE_EGRESS_ALLOW_PRIVATE=1."
            elif error.code == "blocked_address":
                message += " Link-local and cloud metadata addresses are refused whatever the configuration."
            problems.append(SpecProblem(param, error.code, message))
    return problems


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
    spec names (``[teacher.client] api_key_var``) that the job is not given, and the deployments
    it names as a teacher or a judge (resolved in place: ``_deployment_problems``), an
    ``[eval.endpoint]``, teacher or judge endpoint on an address the pool's engines may not reach
    (``_endpoint_problems``). The uploaded packages
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
            _, package_problems = _resolve_packages(project.organization, spec_like, environments, lock=False, secret_names=secret_names)
            problems += [problem for problem in package_problems if problem.param not in known]
        raise _invalid_spec(problems) from None
    if parsed.spec.model in models:
        parsed = fit_seq_len(parsed, models[parsed.spec.model].context_length)
    spec = parsed.spec
    deployment_problems = _deployment_problems(project, spec)
    problems = _not_ready(catalog_problems(spec, models=models, environments=environments), project.organization, spec.model)
    problems += deployment_problems
    problems += pool_problems(spec)
    if spec.model in models and not problems:
        problems += model_gpu_problems(spec, models[spec.model])
    checkpoint, init_problems = _init_from_problems(project, spec)
    problems += init_problems
    problems += _eval_adapter_problems(project, spec)
    problems += _endpoint_problems(spec)
    problems += secret_problems(spec, secret_names)
    # a spec with other problems is refused anyway: its packages are only read, not locked
    packages, package_problems = _resolve_packages(
        project.organization, spec, environments, lock=lock_environments and not problems, secret_names=secret_names
    )
    problems += package_problems
    if problems:
        raise _invalid_spec(problems)
    return ValidatedSpec(
        parsed=parsed, init_from=checkpoint, environment_packages=packages, model=models[spec.model],
        package_warnings=tuple(_package_warnings(spec, packages)),
    )


def _package_warnings(spec, packages: Mapping[tuple[str, int], EnvironmentPackage]) -> list[str]:
    """Warn of the episode limits (``max_turns``, ...) set on an uploaded package whose ready
    build recorded it single-turn (its summary's ``multi_turn`` false): they have no effect. A
    build that recorded nothing is not warned about."""
    warnings = []
    for (section, index), package in sorted(packages.items()):
        env = spec.env[index] if section == "env" else spec.eval.env[index]
        build = latest_build(package)
        if build is not None and build.status == BuildStatus.READY and (build.summary or {}).get("multi_turn") is False:
            warnings += single_turn_warnings(f"{section}.{index}", package.public_id, env.model_dump())
    return warnings


def _not_ready(problems: list[SpecProblem], organization: Organization, model_id: str) -> list[SpecProblem]:
    """``problems`` with the ``unknown_model`` of one of the organization's own models whose check
    has not passed replaced by ``model_not_ready``, saying where its check is."""
    if not any(problem.code == "unknown_model" for problem in problems):
        return problems
    model = model_list(organization).get(model_id)
    if model is None or model.organization_id != organization.pk:
        return problems
    build = latest_builds(organization).get(model_id)
    where = f"its check {build.number} is {build.status}" if build is not None else f"it is {model.status}"
    if build is not None and build.error:
        where += f": {build.error}"
    message = f"model '{model_id}' is not ready to train: {where} (see `lab models get {model_id}`)"
    return [SpecProblem("model", "model_not_ready", message) if problem.code == "unknown_model" else problem for problem in problems]


def _invalid_spec(problems: list[SpecProblem]) -> LabError:
    errors = [FieldError(param=problem.param or None, code=problem.code, message=problem.message) for problem in problems]
    first = errors[0]
    message = f"{first.param}: {first.message}" if first.param else first.message
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return LabError("invalid_spec", message, errors=errors)
