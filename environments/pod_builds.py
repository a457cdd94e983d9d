"""Environment builds on a cluster (``LAB_LAUNCHER=kubernetes``): a batch Job per build in the
engine image, instead of the worker's subprocess (``environments.builds``).

The build task claims the build and starts its Job (``BuildCluster.start``: created once, named
by the build); the Job's pod runs the same builder with the same arguments
(``environments.builder.pod``), reading the wheel and the organization's datasets from Lab and
storing the wheels of its lock, its log and its result through Lab's callback
(``environments.build_views``), authenticated by the build's token: a signed, expiring id of
that build, good only while it runs, for these calls only. The pod gets nothing else of Lab's:
no database, no secret, no storage credential, no service-account token.

``pod_build_sweep`` (beat's build sweep) reads each running build's Job: completed, the build ends
as the result the pod stored says (its lock's wheels checked present in the wheelhouse); failed
past its deadline, OOM-killed, crashed, or its Job gone, it ends ``failed`` saying which.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta
from pathlib import PurePosixPath

from django.conf import settings
from django.core import signing
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from environments import build_clusters, hub_datasets
from environments.build_clusters import (
    DEADLINE,
    FAILED,
    GONE,
    OUT_OF_MEMORY,
    REPORT_GRACE_S,
    RUNNING,
    SUCCEEDED,
    BuildCluster,
    BuildPod,
)
from environments.builder import pod as pod_paths
from environments.builds import WHEELHOUSE_PREFIX, _claim, build_log_key, builder_command, finish_build
from environments.conf import setting
from environments.models import BuildStatus, EnvironmentBuild
from lab import storage

logger = logging.getLogger(__name__)

_SALT = "environments.pod-build"
#: How long past ``LAB_ENVIRONMENT_BUILD_TIMEOUT_S`` a build still ``running`` is left to its Job's
#: outcome (the Job's own deadline is ``REPORT_GRACE_S`` past it) before the build sweep fails it anyway.
RUNNING_GRACE_S = REPORT_GRACE_S + 600
#: How long a claimed build may have no Job (the task creating it) before its Job counts as gone.
CREATE_GRACE_S = 120
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_WHEEL_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.whl$")


def cluster() -> BuildCluster | None:
    """The cluster builds run on (``LAB_LAUNCHER``'s), or None with the local launcher: they run as
    the worker's subprocesses. Raises ImproperlyConfigured for a launcher that registered none."""
    if settings.LAB_LAUNCHER == "local":
        return None
    found = build_clusters.for_launcher(settings.LAB_LAUNCHER)
    if found is None:
        raise ImproperlyConfigured(f"LAB_LAUNCHER={settings.LAB_LAUNCHER}: no cluster registered to run environment builds on")
    return found


def build_token(build: EnvironmentBuild) -> str:
    """The callback token of ``build``: its id and number, signed (``SECRET_KEY``, this module's salt)."""
    return "lbt_" + signing.dumps({"build": build.pk, "number": build.number}, salt=_SALT, compress=True)


def build_for_token(token: str, build_id: int) -> EnvironmentBuild | None:
    """The running build ``build_id`` when ``token`` is its token and not expired, else None."""
    if not token.startswith("lbt_"):
        return None
    max_age = settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S + RUNNING_GRACE_S
    try:
        claims = signing.loads(token[4:], salt=_SALT, max_age=max_age)
    except signing.BadSignature:
        return None
    if not isinstance(claims, dict) or claims.get("build") != build_id:
        return None
    build = (
        EnvironmentBuild.objects.unscoped().select_related("package__organization")
        .filter(pk=build_id, number=claims.get("number"), status=BuildStatus.RUNNING).first()
    )
    return build


def result_key(build: EnvironmentBuild) -> str:
    """Where a pod build's result object is stored (beside its log)."""
    return build_log_key(build).removesuffix(".log") + ".result.json"


def wheelhouse_key(sha256: str, filename: str) -> str | None:
    """The wheelhouse key of a wheel, or None for a digest or file name that is not one."""
    if not _SHA256.match(sha256) or not _WHEEL_FILENAME.match(filename) or ".." in filename:
        return None
    return f"{WHEELHOUSE_PREFIX}{sha256}/{filename}"


def pod_of(build: EnvironmentBuild) -> BuildPod:
    """What the build's Job runs: the builder's arguments for the pod's paths (as the worker's
    ``builder_command``, its import step unsandboxed: the pod is the sandbox)."""
    root = PurePosixPath(pod_paths.BUILD_DIR)
    command = builder_command(
        wheel=PurePosixPath(pod_paths.IN_DIR) / build.package.filename, build=build,
        wheelhouse=PurePosixPath(pod_paths.WHEELHOUSE_DIR), workdir=PurePosixPath(pod_paths.WORK_DIR),
        result=root / "out" / "result.json", datasets=PurePosixPath(pod_paths.DATASETS_DIR),
        python="python", cache=PurePosixPath(pod_paths.CACHE_DIR), sandbox="none",
        hub_datasets_tar=PurePosixPath(pod_paths.OUT_DIR) / hub_datasets.FILENAME,
    )
    return BuildPod(
        build_id=build.pk, organization=build.package.organization.slug, lab_url=settings.LAB_PUBLIC_URL,
        token=build_token(build), wheel_filename=build.package.filename, builder_args=tuple(command[3:]),
        timeout_s=settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S,
    )


def pod_build_start(build_id: int, on: BuildCluster) -> EnvironmentBuild | None:
    """Claim the queued build ``build_id`` and start its Job on ``on``; return it (``running``),
    or None when it was not queued. A Job that cannot be created fails the build saying why."""
    build = _claim(build_id)
    if build is None:
        return None
    try:
        name = on.start(pod_of(build))
    except Exception as error:  # the cluster refused or did not answer: say so, a rebuild tries again
        logger.exception("environment build %s: its Job was not created", build.pk)
        message = f"the build's Kubernetes Job could not be created ({error}); build it again (lab envs rebuild)"
        return finish_build(build, {"status": BuildStatus.FAILED, "error": message}, log=message.encode())
    logger.info("environment build %s of %s: Job %s", build.number, build.package.public_id, name)
    return build


def _stored_result(build: EnvironmentBuild) -> dict:
    """The result the build's pod stored, checked: its shape, and every wheel of a ready build's
    lock present in the wheelhouse (the pod uploaded it, or another build had)."""
    text = storage.read_text(result_key(build))
    try:
        result = json.loads(text) if text else None
    except (ValueError, RecursionError):
        result = None
    if not isinstance(result, dict) or result.get("status") not in (BuildStatus.READY, BuildStatus.FAILED):
        return {"status": BuildStatus.FAILED, "error": "the build's pod ended without storing its result: see the build log"}
    lock = result.get("lock") if isinstance(result.get("lock"), list) else []
    entries = []
    for entry in lock:
        fields = {key: entry.get(key) for key in ("name", "version", "filename", "sha256")} if isinstance(entry, dict) else {}
        if not all(isinstance(value, str) for value in fields.values()) or not fields:
            return {"status": BuildStatus.FAILED, "error": "the build's pod stored a malformed lock"}
        key = wheelhouse_key(fields["sha256"], fields["filename"])
        if result["status"] == BuildStatus.READY and (key is None or not storage.object_storage().exists(key)):
            return {"status": BuildStatus.FAILED, "error": f"the build's pod did not store {fields['filename']} of its lock"}
        entries.append(fields)
    summary = result.get("summary") if isinstance(result.get("summary"), dict) else {}
    fetched = summary.get("hub_datasets")
    if result["status"] == BuildStatus.READY and fetched and not (
        isinstance(fetched, dict) and _SHA256.match(str(fetched.get("sha256"))) and storage.object_storage().exists(hub_datasets.key(build.package.organization.public_id, fetched["sha256"]))
    ):
        return {"status": BuildStatus.FAILED, "error": "the build's pod did not store the Hugging Face datasets its loading fetched"}
    return {
        "status": result["status"], "error": str(result.get("error") or "")[:10_000], "python": str(result.get("python") or "")[:32],
        "lock": entries, "summary": summary,
    }


def _failure(build: EnvironmentBuild, reason: str, message: str) -> str:
    limit = settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S
    if reason == DEADLINE:
        return f"the build took longer than {limit} s (LAB_ENVIRONMENT_BUILD_TIMEOUT_S): its Kubernetes Job passed its deadline"
    if reason == OUT_OF_MEMORY:
        return (f"the build ran out of memory: its pod was OOM-killed at its limit of {setting('LAB_K8S_BUILD_MEMORY_GIB')} GiB "
                f"(LAB_K8S_BUILD_MEMORY_GIB; {message})")
    return f"the build's pod failed ({message or 'no message'}): see the build log"


def pod_build_sweep(on: BuildCluster) -> dict[str, int]:
    """End every running build whose Job has ended or is gone; return ``{"ended": n}``."""
    ended = 0
    running = EnvironmentBuild.objects.unscoped().filter(status=BuildStatus.RUNNING).select_related("package__organization")
    for build in running.order_by("pk"):
        try:
            ended += _sweep_one(build, on)
        except Exception:  # one build's pod stored what cannot be read or kept: the others still end
            logger.exception("environment build %s: its end could not be recorded", build.pk)
    return {"ended": ended}


def _sweep_one(build: EnvironmentBuild, on: BuildCluster) -> int:
    """End ``build`` when its Job has ended or is gone; return 1 when it ended, else 0."""
    outcome = on.outcome(build.pk)
    if outcome.state == RUNNING or (
        outcome.state == GONE and build.started_at > timezone.now() - timedelta(seconds=CREATE_GRACE_S)
    ):
        return 0
    log = None
    if outcome.state == SUCCEEDED:
        result = _stored_result(build)
    elif outcome.state == GONE:
        result = {"status": BuildStatus.FAILED, "error": (
            "the build's Kubernetes Job was deleted before it finished (or never created); build it again (lab envs rebuild)")}
    else:
        assert outcome.state == FAILED
        result = {"status": BuildStatus.FAILED, "error": _failure(build, outcome.reason, outcome.message)}
    if not storage.read_text(build_log_key(build)):
        log = f"{result.get('error') or ''}\n".encode()  # the pod stored none: the log says at least why
    return int(finish_build(build, result, log=log) is not None)

