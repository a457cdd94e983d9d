"""Checks of pushed models (``ModelBuild``): run by a worker (``TaskName.CHECK_MODEL``), never in
the web process.

A check unpacks the pushed archive and runs the engine's check on it in bubblewrap
(``jobs.registry.checks``); when it passes, the model's files go to the model store under their
content revision and the registry row moves to it (``ready``); when it is refused, the build is
``failed`` with the reason, and a model that never passed is ``failed`` too (one that passed
before keeps its files). Either way the log (``models/logs/<organization>/<id>/build-<n>.log``)
is kept and the pushed archive deleted.

A check takes at most ``LAB_MODEL_CHECK_TIMEOUT_S`` (it is killed then). ``build_sweep``, run by
beat, finishes what a lost worker left, as environment builds' sweep does: a build ``running``
past that limit and the task's grace fails, one ``queued`` for longer than ``REQUEUE_AFTER_S`` is
sent to a worker again (running a build twice is a no-op, ``_claim``).
"""

from __future__ import annotations

import logging
import tempfile
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from jobs.registry.checks import check_sandboxed, run_check
from jobs.registry.models import Model, ModelBuild, ModelBuildStatus, ModelSource, ModelStatus
from jobs.registry.services import checked_fields, copy_archive
from jobs.registry.store import KEY_PREFIX, content_revision, describe_files, revision_prefix, store_files
from lab import storage
from lab.celery import TaskName
from lab.dispatch import send

logger = logging.getLogger(__name__)

#: How long past ``LAB_MODEL_CHECK_TIMEOUT_S`` the task may run (storing files and log) before
#: Celery kills it; a build still ``running`` after both has lost its worker (``build_sweep``).
TASK_GRACE_S = 600
#: How long a build may stay ``queued`` before ``build_sweep`` sends it again (seconds).
REQUEUE_AFTER_S = 300
#: The longest log kept, in bytes (its end: where a refusal is).
MAX_LOG_BYTES = 1024 * 1024


def build_log_key(build: ModelBuild) -> str:
    """Where a build's log is stored."""
    return f"{KEY_PREFIX}logs/{build.organization.public_id}/{build.model_id}/build-{build.number}.log"


def build_log(build: ModelBuild) -> str:
    """The build's log as text: ``""`` while it has none yet."""
    return storage.read_text(build.log_key)


def _claim(build_id: int) -> ModelBuild | None:
    """Mark the queued build ``build_id`` running and return it; None when it is not queued."""
    with transaction.atomic():
        build = (
            ModelBuild.objects.unscoped().select_for_update(of=("self",))
            .select_related("organization").filter(pk=build_id).first()
        )
        if build is None or build.status != ModelBuildStatus.QUEUED:
            return None
        build.status, build.started_at = ModelBuildStatus.RUNNING, timezone.now()
        build.save(update_fields=["status", "started_at"])
    return build


def _store_log(build: ModelBuild, text: str) -> None:
    build.log_key = build_log_key(build)
    data = text.encode("utf-8")[-MAX_LOG_BYTES:]
    with tempfile.NamedTemporaryFile(dir=Path(settings.LAB_DATA_DIR), suffix=".log") as handle:
        handle.write(data)
        handle.flush()
        storage.put_file(build.log_key, Path(handle.name), content_type="text/plain")


def build_run(build_id: int) -> ModelBuild | None:
    """Run the queued check ``build_id`` to its end (see the module docstring); return the build,
    or None when it was not queued (a second delivery of the task)."""
    build = _claim(build_id)
    if build is None:
        return None
    scratch_root = Path(settings.LAB_DATA_DIR) / "builds"
    scratch_root.mkdir(parents=True, exist_ok=True)
    lines = [f"check {build.number} of {build.model_id}: archive of {build.archive_size_bytes} bytes, sha256 {build.archive_sha256}"]
    fields: dict | None = None
    with tempfile.TemporaryDirectory(dir=scratch_root, prefix=f"model-{build.pk}-") as scratch_name:
        scratch = Path(scratch_name)
        try:
            archive = copy_archive(build.archive_key, scratch / "archive.tar")
        except FileNotFoundError:
            error = "the pushed archive is gone from storage: push the model again"
        else:
            result = run_check(
                scratch=scratch, directory=scratch / "model", archive=archive, sandbox=check_sandboxed(),
                timeout_s=settings.LAB_MODEL_CHECK_TIMEOUT_S, max_bytes=settings.LAB_MODEL_MAX_BYTES,
            )
            lines.append(result.log.rstrip())
            error = result.error
            if result.status == "ready":
                files = describe_files(result.directory, result.model["files"])
                revision = content_revision(files)
                prefix = revision_prefix(build.model_id, revision)
                written = store_files(result.directory, files, prefix)
                lines.append(f"stored {len(files)} files ({written} bytes new) as revision {revision}")
                fields = checked_fields(result.model, files=files, revision=revision, prefix=prefix, source=ModelSource.PUSH)
    lines.append(f"check {build.number}: {'passed' if fields else 'refused: ' + error}")
    _store_log(build, "\n".join(line for line in lines if line) + "\n")
    with transaction.atomic():
        model = Model.objects.select_for_update().get(pk=build.model_id)
        if fields is not None:
            for name, value in fields.items():
                setattr(model, name, value)
            model.save()
            build.status, build.revision = ModelBuildStatus.READY, fields["revision"]
        else:
            if not model.files:
                model.status = ModelStatus.FAILED
                model.save(update_fields=["status"])
            build.status, build.error = ModelBuildStatus.FAILED, error or "the check refused it"
        build.finished_at = timezone.now()
        build.save(update_fields=["status", "revision", "error", "log_key", "finished_at"])
    storage.delete(build.archive_key)
    logger.info("model check %s of %s: %s", build.number, build.model_id, build.status)
    return build


def build_sweep() -> dict[str, int]:
    """Finish what lost workers left (beat's periodic pass; safe to run any time):

    - a build ``running`` for longer than ``LAB_MODEL_CHECK_TIMEOUT_S`` + ``TASK_GRACE_S`` ends
      ``failed`` with an error saying so (and its model, if it never passed, too), its pushed
      archive deleted;
    - a build ``queued`` for longer than ``REQUEUE_AFTER_S`` is sent to a worker again, at most
      once per ``REQUEUE_AFTER_S``.

    Returns ``{"failed": n, "resent": n}``.
    """
    now = timezone.now()
    limit = settings.LAB_MODEL_CHECK_TIMEOUT_S
    with transaction.atomic():
        stale = list(
            ModelBuild.objects.unscoped().select_for_update().filter(
                status=ModelBuildStatus.RUNNING, started_at__lt=now - timedelta(seconds=limit + TASK_GRACE_S)
            )
        )
        for build in stale:
            build.status, build.finished_at = ModelBuildStatus.FAILED, now
            build.error = f"the check did not finish within {limit} s (LAB_MODEL_CHECK_TIMEOUT_S): its worker stopped or it hung; push the model again"
            build.save(update_fields=["status", "finished_at", "error"])
        Model.objects.filter(pk__in=[build.model_id for build in stale], files=[]).update(status=ModelStatus.FAILED)
    for build in stale:
        storage.delete(build.archive_key)
    resent = 0
    waiting = ModelBuild.objects.unscoped().filter(
        status=ModelBuildStatus.QUEUED, created_at__lt=now - timedelta(seconds=REQUEUE_AFTER_S)
    ).values_list("pk", flat=True)
    for build_id in waiting:
        if cache.add(f"models:build-resent:{build_id}", 1, timeout=REQUEUE_AFTER_S):
            send(TaskName.CHECK_MODEL, build_id)
            resent += 1
    return {"failed": len(stale), "resent": resent}
