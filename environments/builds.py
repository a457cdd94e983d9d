"""Environment builds: every pushed version is built once, as of its push time; a rebuild may be asked for.

A build runs the builder (``environments.builder``) as a subprocess of the worker that runs the
task ``TaskName.BUILD_ENVIRONMENT`` (on the Kubernetes pool, as a Job of its own instead:
``environments.pod_builds``), so no package code runs in Lab's own processes, and stores
what it made in Lab's storage (``lab.storage``):

- the wheels of its lock in the wheelhouse shared by every build, ``environments/wheelhouse/
  <sha256>/<file name>`` (content-addressed: a wheel another build fetched is not fetched again);
- its log, ``environments/<organization public id>/<package sha256>/build-<number>.log``.

The organization's pushed datasets (``environments.datasets``) are unpacked into the build's
scratch folder, where loading the environment runs, so ``load_dataset("owner/name")`` finds them;
a dataset of the Hugging Face Hub that loading fetches is kept beside the build (``environments.hub_datasets``).

On the filesystem backend the builder writes the wheelhouse in place; on an object store it works
in ``LAB_DATA_DIR/cache/wheelhouse`` and the wheels it fetched are uploaded after it ends.
The index is ``LAB_PACKAGE_INDEX_URL``.

A build takes at most ``LAB_ENVIRONMENT_BUILD_TIMEOUT_S`` (its builder and everything the builder
started are killed then). ``build_sweep``, run by beat, finishes what a lost worker left: a build
still ``running`` past that limit and the task's grace fails, a build ``queued`` for longer than
``REQUEUE_AFTER_S`` is sent to a worker again (running a build twice is a no-op, ``_claim``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from environments import hub_datasets
from environments.builder.steps import NETWORK_VARIABLES
from environments.datasets import copy_snapshots
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from environments.storage import KEY_PREFIX, WHEEL_CONTENT_TYPE
from lab import storage
from lab.celery import TaskName
from lab.dispatch import enqueue_on_commit, send
from lab.errors import LabError

logger = logging.getLogger(__name__)

#: Where the shared wheelhouse lives in storage.
WHEELHOUSE_PREFIX = f"{KEY_PREFIX}wheelhouse/"
#: How long past ``LAB_ENVIRONMENT_BUILD_TIMEOUT_S`` the build task may run (storing the log) before
#: Celery kills it; a build still ``running`` after both has lost its worker (``build_sweep``).
TASK_GRACE_S = 180
#: How long a build may stay ``queued`` before ``build_sweep`` sends it to a worker again, and
#: the least time between two sends of the same build, in seconds.
REQUEUE_AFTER_S = 300
#: The longest build log kept, in bytes (its end: where a failure is).
MAX_LOG_BYTES = 4 * 1024 * 1024
_REPOSITORY = Path(__file__).resolve().parents[1]


def build_start(package: EnvironmentPackage, *, snapshot_at: datetime | None = None) -> EnvironmentBuild:
    """Create the next build of ``package`` (queued) and send it to a worker once the caller's
    transaction commits. ``snapshot_at`` is the time the index is read as of: the version's push
    time by default, now for a rebuild."""
    number = (EnvironmentBuild.objects.filter(package=package).aggregate(last=Max("number"))["last"] or 0) + 1
    build = EnvironmentBuild.objects.create(
        package=package,
        number=number,
        index_url=settings.LAB_PACKAGE_INDEX_URL,
        index_snapshot_at=snapshot_at or package.created_at,
    )
    enqueue_on_commit(TaskName.BUILD_ENVIRONMENT, build.pk)
    return build


def build_again(package: EnvironmentPackage) -> EnvironmentBuild:
    """Start a rebuild of ``package``: the same wheel, the index as it is now. Raises LabError 409
    ``invalid_state`` while its latest build is still queued or running."""
    latest = latest_build(package)
    if latest is not None and latest.status in (BuildStatus.QUEUED, BuildStatus.RUNNING):
        raise LabError("invalid_state", f"build {latest.number} of {package.public_id} is still {latest.status}; ask again once it ends.")
    return build_start(package, snapshot_at=timezone.now())


def latest_build(package: EnvironmentPackage) -> EnvironmentBuild | None:
    """The build of ``package`` that counts (its highest number), or None before its first."""
    return EnvironmentBuild.objects.filter(package=package).order_by("-number").first()


def latest_builds(organization) -> dict[str, EnvironmentBuild]:
    """The latest build of each of ``organization``'s live packages, by the package's public id
    (``<organization slug>/<name>@<version>``); a package with no build yet is left out. One query."""
    builds = (
        EnvironmentBuild.objects.for_organization(organization).filter(package__deleted_at=None)
        .select_related("package__organization").defer("lock").order_by("package_id", "number")
    )
    return {build.package.public_id: build for build in builds}  # the highest number wins


def build_failure_message(environment_id: str, build: EnvironmentBuild) -> str:
    """What a job naming the version ``environment_id`` whose build ``build`` failed is told (its
    400 at submit, or its error when the build failed while it waited), naming the fixes."""
    return (
        f"environment '{environment_id}' did not build (build {build.number}): {build.error} "
        f"(push a fixed version, or rebuild it: lab envs rebuild {environment_id}, or POST /api/v1/environments/<id>/builds)"
    )


def environment_secrets(summary: dict, args: dict | None) -> list[str]:
    """The job secrets an environment reads, by its build's ``summary``, for a block with ``args``
    (its ``load_environment`` arguments): each key it declared while loading with its defaults
    (``summary["secrets"]``: ``vf.ensure_keys``, or OpenAI's default key), where a key that is the
    default of a parameter the block sets to another name (``judge_api_key_var = "MY_KEY"``, the
    Hub's way to name a judge's key) is that name instead. In the build's order, each once."""
    defaults = {
        parameter.get("name"): parameter.get("default")
        for parameter in summary.get("parameters") or [] if isinstance(parameter, dict)
    }
    names: list[str] = []
    for key in summary.get("secrets") or []:
        renamed = [
            (args or {})[name] for name, default in defaults.items()
            if default == key and isinstance((args or {}).get(name), str) and (args or {})[name]
        ]
        name = renamed[0] if renamed else key
        if name not in names:
            names.append(name)
    return names


def missing_secrets_message(environment_id: str, missing: list[str], given) -> str:
    """What a job naming ``environment_id`` without the secrets ``missing`` it reads is told (a
    400 at submit, or its error when its build turned ready while it waited), naming the fix."""
    return (
        f"environment '{environment_id}' reads the secret{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
        f"(it declares {'them' if len(missing) > 1 else 'it'} with vf.ensure_keys, or makes an OpenAI client on it), "
        f"which the job is not given (given: {', '.join(sorted(given)) or 'none'}): pass each as a job secret, "
        f"with -e {missing[0]}=... or an env file, or as secrets.{missing[0]} in the request"
    )


def build_log_key(build: EnvironmentBuild) -> str:
    package = build.package
    return f"{KEY_PREFIX}{package.organization.public_id}/{package.sha256}/build-{build.number}.log"


def build_log(build: EnvironmentBuild) -> str:
    """The build's log as text: ``""`` while it has none yet."""
    return storage.read_text(build.log_key)


def _claim(build_id: int) -> EnvironmentBuild | None:
    """Mark the queued build ``build_id`` running and return it; None when it is not queued (run already, or gone)."""
    with transaction.atomic():
        build = (
            EnvironmentBuild.objects.unscoped().select_for_update(of=("self",))
            .select_related("package__organization").filter(pk=build_id).first()
        )
        if build is None or build.status != BuildStatus.QUEUED:
            return None
        build.status, build.started_at = BuildStatus.RUNNING, timezone.now()
        build.save(update_fields=["status", "started_at"])
    return build


def _wheelhouse() -> Path:
    if storage.is_filesystem():
        return storage.path_of(WHEELHOUSE_PREFIX + "x").parent
    return Path(settings.LAB_DATA_DIR) / "cache" / "wheelhouse"


def _upload_wheels(wheelhouse: Path, lock: list[dict]) -> None:
    """On an object store, put the lock's wheels that it lacks into the shared wheelhouse."""
    for entry in lock:
        key = f"{WHEELHOUSE_PREFIX}{entry['sha256']}/{entry['filename']}"
        if not storage.object_storage().exists(key):
            storage.put_file(key, wheelhouse / entry["sha256"] / entry["filename"], content_type=WHEEL_CONTENT_TYPE)


def builder_command(
    *, wheel: Path, build: EnvironmentBuild, wheelhouse: Path, workdir: Path, result: Path, datasets: Path | None = None,
    python: str = sys.executable, cache: Path | None = None, sandbox: str | None = None, hub_datasets_tar: Path | None = None,
) -> list[str]:
    """The builder's command line for ``build`` (``python -m environments.builder build ...``);
    ``datasets`` the folder of the organization's pushed datasets (``environments.datasets.copy_snapshots``).
    ``python``, ``cache`` (uv's) and ``sandbox`` are the worker's unless given (a pod's: ``environments.pod_builds``).
    ``hub_datasets_tar``: where the builder packs the Hugging Face datasets loading fetched (``environments.hub_datasets``)."""
    if sandbox is None:
        sandbox = "bubblewrap" if settings.LAB_LOCAL_ISOLATION == "bubblewrap" else "none"
    return [
        python, "-m", "environments.builder", "build",
        "--wheel", str(wheel),
        "--index-url", build.index_url,
        "--exclude-newer", build.index_snapshot_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "--wheelhouse", str(wheelhouse),
        "--workdir", str(workdir),
        "--result", str(result),
        "--cache", str(cache or Path(settings.LAB_DATA_DIR) / "cache" / "uv"),
        "--sandbox", sandbox,
        *(["--datasets", str(datasets)] if datasets is not None else []),
        *(hub_datasets.builder_arguments(hub_datasets_tar) if hub_datasets_tar is not None else []),
    ]


def builder_environment(home: str) -> dict[str, str]:
    """The builder's environment: its ``PATH``, ``HOME`` (``home``) and locale, and of the worker's own
    only how it reaches the package index (``NETWORK_VARIABLES``: a CA bundle such as a company proxy's,
    the proxies), so that uv verifies the index as the worker's host does; no ``LAB_*`` variable, no secret."""
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
    environment.update({name: os.environ[name] for name in NETWORK_VARIABLES if os.environ.get(name)})
    return environment


def _run_builder(command: list[str], *, env: dict[str, str], timeout: float) -> tuple[int | None, bytes]:
    """Run the builder ``command`` in a process group of its own and return its exit status and
    output (stdout and stderr together); the status is None when it ran past ``timeout`` seconds.
    Past the timeout, or when the task is interrupted (its soft time limit), the whole group is
    killed: the builder, uv and the import probe it started."""
    process = subprocess.Popen(
        command, cwd=_REPOSITORY, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        _kill_group(process)
        output, _ = process.communicate()
        return None, output
    except BaseException:
        _kill_group(process)
        process.wait()
        raise


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def build_run(build_id: int) -> EnvironmentBuild | None:
    """Run the queued build ``build_id`` to its end (``ready`` or ``failed``) and store its lock,
    summary and log; return it, or None when it was not queued (a second delivery of the task).

    The builder runs in a scratch folder under ``LAB_DATA_DIR/builds`` with a minimal environment
    (no ``LAB_*`` variable, no secret); it imports the package in bubblewrap (no network, nothing
    of Lab's files) unless ``LAB_LOCAL_ISOLATION`` is ``none``. Its stdout and stderr are the log.
    """
    build = _claim(build_id)
    if build is None:
        return None
    package = build.package
    scratch_root = Path(settings.LAB_DATA_DIR) / "builds"
    scratch_root.mkdir(parents=True, exist_ok=True)
    wheelhouse = _wheelhouse()
    with tempfile.TemporaryDirectory(dir=scratch_root, prefix=f"build-{build.pk}-") as scratch:
        workdir = Path(scratch)
        if storage.is_filesystem():
            wheel = storage.path_of(package.storage_key)
        else:
            wheel = workdir / package.filename
            with storage.open_object(package.storage_key) as source, wheel.open("wb") as target:
                shutil.copyfileobj(source, target)
        result_path = workdir / "result.json"
        datasets = workdir / "datasets"
        copy_snapshots(package.organization_id, datasets)
        command = builder_command(
            wheel=wheel, build=build, wheelhouse=wheelhouse, workdir=workdir / "work", result=result_path, datasets=datasets,
            hub_datasets_tar=workdir / hub_datasets.FILENAME,
        )
        environment = builder_environment(scratch)
        timeout = settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S
        returncode, output = _run_builder(command, env=environment, timeout=timeout)
        if returncode is None:
            result = {"status": BuildStatus.FAILED, "error": f"the build took longer than {timeout} s (LAB_ENVIRONMENT_BUILD_TIMEOUT_S)"}
        else:
            result = json.loads(result_path.read_text()) if result_path.is_file() else None
            if result is None:
                result = {"status": BuildStatus.FAILED, "error": f"the builder crashed (exit {returncode}): see the build log"}
        if result["status"] == BuildStatus.READY and not storage.is_filesystem():
            _upload_wheels(wheelhouse, result.get("lock", []))
        if result["status"] == BuildStatus.READY:
            hub_datasets.store(build.package.organization.public_id, result.get("summary") or {}, workdir / hub_datasets.FILENAME)
    return finish_build(build, result, log=output)


def store_log(build: EnvironmentBuild, output: bytes) -> None:
    """Store ``output`` (its last ``MAX_LOG_BYTES``) as the log of ``build``."""
    scratch_root = Path(settings.LAB_DATA_DIR) / "builds"
    scratch_root.mkdir(parents=True, exist_ok=True)
    log_path = Path(tempfile.mkstemp(dir=scratch_root, suffix=".log")[1])
    try:
        log_path.write_bytes(output[-MAX_LOG_BYTES:])
        storage.put_file(build_log_key(build), log_path, content_type="text/plain")
    finally:
        log_path.unlink(missing_ok=True)


def finish_build(build: EnvironmentBuild, result: dict, *, log: bytes | None) -> EnvironmentBuild | None:
    """End the running ``build`` as ``result`` says (the builder's result object), its log
    ``log`` stored (None: stored already); return it, or None when it was not running any more
    (ended by another pass meanwhile)."""
    if log is not None:
        store_log(build, log)
    build.log_key = build_log_key(build)
    build.status = BuildStatus.READY if result.get("status") == BuildStatus.READY else BuildStatus.FAILED
    build.error = _text(result.get("error") or "")
    build.python = _text(result.get("python", ""))
    build.lock, build.summary = result.get("lock", []), result.get("summary", {})
    if not (_storable(build.lock) and _storable(build.summary)):
        build.status, build.lock, build.summary = BuildStatus.FAILED, [], {}
        build.error = "the build's result holds what Lab cannot store (a NUL character, an unpaired surrogate, NaN or Infinity)"
    build.finished_at = timezone.now()
    fields = ["status", "error", "python", "lock", "summary", "log_key", "finished_at"]
    if not EnvironmentBuild.objects.unscoped().filter(pk=build.pk, status=BuildStatus.RUNNING).update(
        **{field: getattr(build, field) for field in fields}
    ):
        return None
    logger.info("environment build %s of %s: %s", build.number, build.package.public_id, build.status)
    return build


def _text(value: object) -> str:
    """``value`` as text PostgreSQL stores: without NUL characters or unpaired surrogates."""
    return str(value).replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def _storable(value: object) -> bool:
    """Whether ``value`` (a builder's, or a build pod's, lock or summary) is JSON PostgreSQL stores:
    no NaN or Infinity, no NUL character, no unpaired surrogate."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (ValueError, TypeError, RecursionError):
        return False
    return "\\u0000" not in text


def build_sweep(*, running_grace_s: int = TASK_GRACE_S) -> dict[str, int]:
    """Finish what lost workers left (beat's periodic pass; safe to run any time, from any process):

    - a build ``running`` for longer than ``LAB_ENVIRONMENT_BUILD_TIMEOUT_S`` + ``running_grace_s``
      (``TASK_GRACE_S``: no worker can still be running it, Celery's hard time limit has passed;
      a pod build's: ``environments.pod_builds``) ends ``failed``
      with an error saying so and how to build it again;
    - a build ``queued`` for longer than ``REQUEUE_AFTER_S`` (its message lost with a broker or a
      worker) is sent to a worker again, at most once per ``REQUEUE_AFTER_S``.

    Returns ``{"failed": n, "resent": n}``.
    """
    now = timezone.now()
    limit = settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S
    stale = EnvironmentBuild.objects.unscoped().filter(
        status=BuildStatus.RUNNING, started_at__lt=now - timedelta(seconds=limit + running_grace_s)
    )
    failed = stale.update(
        status=BuildStatus.FAILED,
        finished_at=now,
        error=(
            f"the build did not finish within {limit} s (LAB_ENVIRONMENT_BUILD_TIMEOUT_S): the worker running it stopped "
            "or it hung; build it again (POST /api/v1/environments/<id>/builds, or `lab envs rebuild ID`)"
        ),
    )
    if failed:
        logger.warning("environment builds: %d left running past %d s marked failed", failed, limit)
    resent = 0
    waiting = EnvironmentBuild.objects.unscoped().filter(
        status=BuildStatus.QUEUED, created_at__lt=now - timedelta(seconds=REQUEUE_AFTER_S)
    ).values_list("pk", flat=True)
    for build_id in waiting:
        if cache.add(f"environments:build-resent:{build_id}", 1, timeout=REQUEUE_AFTER_S):
            send(TaskName.BUILD_ENVIRONMENT, build_id)
            resent += 1
    if resent:
        logger.info("environment builds: %d queued for over %d s sent again", resent, REQUEUE_AFTER_S)
    return {"failed": failed, "resent": resent}
