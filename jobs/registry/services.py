"""Adding models to the registry (docs/models.md): an operator's (``model_add``: from a Hugging
Face endpoint or a directory, checked and stored at once) and an organization's push
(``model_push``: the archive is stored and checked later by a worker, ``jobs.registry.builds``).

Both end the same way: the engine's check passed (``jobs.registry.checks``), the files are in
Lab's model store by revision (``jobs.registry.store``) and the registry row holds what the check
found (``checked_fields``). Ids are ``<owner>/<name>``; an organization's own models are named
``<organization slug>/<name>``, so no organization can take another's names.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from engine.catalog import LORA_TARGET_MODULES
from jobs.registry import TRAINING_MODES, family_of, memory_estimate_gb
from jobs.registry.checks import check_sandboxed, run_check
from jobs.registry.hub import hub_download
from jobs.registry.models import Model, ModelBuild, ModelBuildStatus, ModelSource, ModelStatus
from jobs.registry.store import KEY_PREFIX, content_revision, describe_files, revision_prefix, store_files
from lab import storage
from lab.audit import Actor, AuditAction, audit_record
from lab.celery import TaskName
from lab.dispatch import enqueue_on_commit
from lab.errors import FieldError, LabError
from lab.models import Organization

logger = logging.getLogger(__name__)

#: One part of a model id (its owner or its name), as the Hub allows them.
_ID_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_CHUNK = 1024 * 1024


def parse_model_id(model_id: str, *, param: str = "name") -> tuple[str, str]:
    """Split ``<owner>/<name>``; raise LabError ``invalid_request`` (at ``param``) when it is not
    of that form (each part: letters, digits, ``.``, ``_``, ``-``, at most 96, not starting with
    a punctuation mark)."""
    owner, slash, name = model_id.partition("/") if isinstance(model_id, str) else ("", "", "")
    if not slash or not _ID_PART.match(owner) or not _ID_PART.match(name) or name.endswith(".") or ".." in model_id:
        message = f"a model id is <owner>/<name> of letters, digits, '.', '_' and '-', not {str(model_id)[:200]!r}"
        raise LabError("invalid_request", message, errors=[FieldError(param, "invalid", message)])
    return owner, name


def checked_fields(report: dict[str, Any], *, files: list[dict], revision: str, prefix: str, source: str) -> dict[str, Any]:
    """The registry row's fields for a model whose check found ``report`` (``engine.model_check``),
    stored as ``files`` under ``revision`` at the storage ``prefix``; ready for jobs."""
    architecture = report["architecture"]
    return {
        "family": family_of(architecture),
        "architecture": architecture,
        "parameters": report["parameters"],
        "active_parameters": report.get("active_parameters"),
        "context_length": report["context_length"],
        "chat_template": report["chat_template"],
        "tool_call_format": report.get("tool_call_format", ""),
        "training_modes": list(TRAINING_MODES),
        "lora_target_modules": list(LORA_TARGET_MODULES[architecture]),
        "memory_gb": memory_estimate_gb(report["parameters"]),
        "revision": revision,
        "licence": report.get("licence", ""),
        "source": source,
        "status": ModelStatus.READY,
        "files": files,
        "storage_prefix": prefix,
    }


@dataclass
class AddedModel:
    """What ``model_add`` did: the row, the files the source held that Lab does not store, the
    bytes it wrote to storage (0 when the revision was there already) and the seconds it took."""

    model: Model
    left_out: list[str] = field(default_factory=list)
    stored_bytes: int = 0
    seconds: float = 0.0


def _refuse_taken(model_id: str, existing: Model, organization: Organization | None) -> None:
    """Refuse an operator's add over a row it may not replace: a built-in, a pushed model, or a
    model of someone else (offered to everyone, or another organization's)."""
    owner = "everyone" if organization is None else f"organization {organization.slug}"
    holder = "everyone" if existing.organization_id is None else f"organization {existing.organization.slug}"
    if existing.source == ModelSource.BUILTIN:
        raise LabError("invalid_state", f"{model_id} is one of Lab's built-in models")
    if existing.source == ModelSource.PUSH:
        raise LabError("invalid_state", f"{model_id} was pushed by organization {existing.organization.slug}; it is theirs to replace")
    if existing.organization_id != (organization.pk if organization else None):
        raise LabError("invalid_state", f"{model_id} is already offered to {holder}, not to {owner}: give this one another id")


def model_add(
    *, organization: Organization | None, model_id: str, revision: str | None = None, source_dir: Path | None = None,
) -> AddedModel:
    """Add the model ``model_id`` for ``organization`` (None: everyone): downloaded from the
    Hugging Face endpoint (``model_id`` is its Hub id; ``revision`` a branch, tag or commit,
    default the main branch), or, with ``source_dir``, read from that directory (``model_id`` is
    the id it gets). The engine's check must pass; the files then go to the model store under the
    Hub's commit (or their ``content_revision``) and the registry row is created or moved to
    that revision, ready for jobs. Adding the same files again changes nothing.

    Raises LabError ``invalid_request`` for a malformed id or a missing directory,
    ``invalid_state`` for an id a built-in, a pushed model or another owner holds, and
    ``invalid_model`` when the download or the check refuses it (the message names what is
    wrong). Nothing is stored when it raises."""
    started = time.monotonic()
    parse_model_id(model_id, param="model")
    existing = Model.objects.filter(id=model_id).select_related("organization").first()
    if existing is not None:
        _refuse_taken(model_id, existing, organization)
    if source_dir is not None and not (source_dir / "config.json").is_file():
        raise LabError("invalid_request", f"{source_dir} is not a Hugging Face model directory (it holds no config.json)")
    scratch_root = Path(settings.LAB_DATA_DIR) / "builds"
    scratch_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch_root, prefix="model-add-") as scratch_name:
        scratch = Path(scratch_name)
        left_out: list[str] = []
        commit = ""
        if source_dir is None:
            snapshot = hub_download(hub_id=model_id, revision=revision, target=scratch / "download")
            directory, commit, left_out = snapshot.directory, snapshot.commit, snapshot.left_out
        else:
            directory = source_dir.resolve()
        result = run_check(scratch=scratch, directory=directory, sandbox=check_sandboxed(), timeout_s=settings.LAB_MODEL_CHECK_TIMEOUT_S)
        for line in result.log.splitlines():
            logger.info("model check of %s: %s", model_id, line)
        if result.status != "ready":
            raise LabError("invalid_model", f"{model_id} cannot be offered: {result.error}")
        files = describe_files(result.directory, result.model["files"])
        revision_id = commit or content_revision(files)
        prefix = revision_prefix(model_id, revision_id)
        stored = store_files(result.directory, files, prefix)
    fields = checked_fields(result.model, files=files, revision=revision_id, prefix=prefix,
                            source=ModelSource.HUB if commit else ModelSource.DIRECTORY)
    fields["description"] = (
        f"{model_id} from {settings.LAB_HF_ENDPOINT}, revision {revision_id}." if commit else f"{model_id}, added from a directory."
    )
    with transaction.atomic():
        existing = Model.objects.select_for_update(of=("self",)).filter(id=model_id).select_related("organization").first()
        if existing is not None:
            _refuse_taken(model_id, existing, organization)
        model, _ = Model.objects.update_or_create(id=model_id, defaults={**fields, "organization": organization})
        if organization is not None:
            audit_record(actor=Actor(), organization=organization, action=AuditAction.MODEL_ADD, target=model_id,
                         data={"revision": revision_id, "source": fields["source"]})
    return AddedModel(model=model, left_out=left_out + result.model.get("left_out", []), stored_bytes=stored,
                      seconds=time.monotonic() - started)


def _sha256(handle: BinaryIO) -> str:
    handle.seek(0)
    digest = hashlib.sha256()
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def latest_build(model: Model) -> ModelBuild | None:
    """The latest check of a pushed ``model`` (its highest number), or None for one never pushed."""
    if model.organization_id is None:
        return None
    return ModelBuild.objects.for_organization(model.organization_id).filter(model=model).order_by("-number").first()


def model_push(
    *, organization: Organization, actor: Actor, model_id: str, handle: BinaryIO, size_bytes: int,
) -> tuple[ModelBuild, bool]:
    """Store the archive in ``handle`` (seekable, ``size_bytes`` long: a tar, or gzip'd tar, of a
    Hugging Face model directory) as a new version of ``organization``'s model ``model_id``, and
    have a worker check it (``jobs.registry.builds``). Until a check passes the model is
    ``checking``; a later push replaces a ready model's files only once its own check passes.

    Returns ``(build, created)``: the same bytes pushed again while their check is queued,
    running or passed return that build with ``created`` False. Raises LabError
    ``invalid_request`` (param ``name``) for an id not named ``<organization slug>/<name>``,
    ``request_too_large`` (param ``file``) above ``LAB_MODEL_MAX_BYTES``, and 409
    ``invalid_state`` when the id is a model offered to everyone, or while the model's latest
    check is still queued or running. Nothing is written when it raises."""
    owner, _ = parse_model_id(model_id)
    if owner != organization.slug:
        message = f"this organization's models are named {organization.slug}/<name>, not {model_id}"
        raise LabError("invalid_request", message, errors=[FieldError("name", "invalid", message)])
    limit = settings.LAB_MODEL_MAX_BYTES
    if size_bytes > limit:
        raise LabError("request_too_large", f"Model archives are limited to {limit // 1024**2} MB (LAB_MODEL_MAX_BYTES).", param="file")
    sha256 = _sha256(handle)
    with transaction.atomic():
        model = Model.objects.select_for_update().filter(id=model_id).first()
        if model is not None and model.organization_id != organization.pk:
            raise LabError("invalid_state", f"{model_id} is already a model of Lab's catalogue: push it under another name")
        build = latest_build(model) if model is not None else None
        if build is not None and build.archive_sha256 == sha256 and build.status != ModelBuildStatus.FAILED:
            return build, False
        if build is not None and build.status in (ModelBuildStatus.QUEUED, ModelBuildStatus.RUNNING):
            raise LabError("invalid_state", f"check {build.number} of {model_id} is still {build.status}; push again once it ends")
    key = f"{KEY_PREFIX}uploads/{organization.public_id}/{sha256}.tar"
    handle.seek(0)
    storage.put_stream(key, handle, content_type="application/x-tar")
    with transaction.atomic():
        model, _ = Model.objects.get_or_create(
            id=model_id,
            defaults={"organization": organization, "source": ModelSource.PUSH, "status": ModelStatus.CHECKING,
                      "context_length": 0, "description": f"Pushed by organization {organization.slug}."},
        )
        model = Model.objects.select_for_update().get(pk=model.pk)
        if model.organization_id != organization.pk:  # a concurrent operator's add took the id
            raise LabError("invalid_state", f"{model_id} is already a model of Lab's catalogue: push it under another name")
        latest = latest_build(model)
        if latest is not None and latest.status in (ModelBuildStatus.QUEUED, ModelBuildStatus.RUNNING):
            if latest.archive_sha256 == sha256:
                return latest, False
            raise LabError("invalid_state", f"check {latest.number} of {model_id} is still {latest.status}; push again once it ends")
        number = (ModelBuild.objects.for_organization(organization).filter(model=model).aggregate(last=Max("number"))["last"] or 0) + 1
        build = ModelBuild.objects.create(
            model=model, organization=organization, number=number, archive_key=key, archive_sha256=sha256,
            archive_size_bytes=size_bytes, pushed_by=actor.user, pushed_by_key=actor.api_key,
        )
        audit_record(actor=actor, organization=organization, action=AuditAction.MODEL_PUSH, target=model_id,
                     data={"sha256": sha256, "size_bytes": size_bytes, "build": number})
        enqueue_on_commit(TaskName.CHECK_MODEL, build.pk)
    return build, True


def copy_archive(key: str, target: Path) -> Path:
    """Return a local path of the stored archive ``key``: the file itself on the filesystem
    backend, else a copy at ``target``."""
    if storage.is_filesystem():
        return storage.path_of(key)
    with storage.open_object(key) as source, target.open("wb") as writer:
        shutil.copyfileobj(source, writer, _CHUNK)
    return target
