"""Pushing, finding and deleting an organization's environment packages.

An environment id reads ``<organization slug>/<name>[@<version>]`` (docs/api.md): without a
version, or with ``@latest``, it means the highest non-deleted version (PEP 440 order). A
package is read from its wheel's metadata only (``environments.wheels``); nothing here imports
it. Whether a job still uses a package is known only to ``jobs``, which checks that before it
calls ``environment_mark_deleted``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import BinaryIO

from django.db import IntegrityError, transaction
from django.utils import timezone
from lab_environments import EnvironmentInfo
from packaging.utils import canonicalize_name
from packaging.version import Version

from environments.builds import WHEELHOUSE_PREFIX, build_start
from environments.models import EnvironmentPackage
from environments.storage import WHEEL_CONTENT_TYPE, package_key
from environments.wheels import MAX_WHEEL_BYTES, InvalidWheel, read_wheel
from lab import storage
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import LabError, not_found
from lab.lib.locks import ENVIRONMENT_PUSH, advisory_xact_lock
from lab.models import Organization

_CHUNK = 1024 * 1024
#: Signed download URLs of packages handed to an engine on S3 live this long (seconds).
DOWNLOAD_URL_EXPIRE_S = 3600


@dataclass(frozen=True)
class EnvironmentRef:
    """A parsed environment id: ``version`` None means the latest."""

    organization: str
    name: str
    version: str | None

    @classmethod
    def parse(cls, environment_id: str) -> EnvironmentRef | None:
        """Parse ``<organization slug>/<name>[@<version>|@latest]``; None when it is not of that form."""
        owner, slash, rest = environment_id.partition("/")
        name, _, version = rest.partition("@")
        if not slash or not owner or not name or "/" in rest or len(environment_id) > 300:
            return None
        return cls(organization=owner, name=str(canonicalize_name(name)), version=None if version in ("", "latest") else version)


class AnyArguments(dict):
    """The ``args`` of an uploaded package in the catalogue: it takes every key with any JSON value
    (``labsdk.spec.catalog_problems`` reads a ``None`` default as "anything"), because only the
    package's own code, run by the engine, knows its arguments."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> None:
        return None


def _sha256(handle: BinaryIO) -> str:
    handle.seek(0)
    digest = hashlib.sha256()
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def environment_push(
    *, organization: Organization, actor: Actor, handle: BinaryIO, filename: str, size_bytes: int
) -> tuple[EnvironmentPackage, bool]:
    """Store the wheel in ``handle`` (seekable, ``size_bytes`` long, named ``filename``) as a new
    version of one of ``organization``'s environments.

    Returns ``(package, created)``: pushing the very bytes of a live version again returns it
    with ``created`` False. Raises LabError ``request_too_large`` above 100 MB, 400
    ``invalid_environment_package`` (param ``file``) for anything ``read_wheel`` refuses, and 409
    ``invalid_state`` when the version, or one equal to it under PEP 440 (``0.1`` and ``0.1.0``),
    exists with other bytes or was deleted (versions are never reused). No package row is written
    when it raises. A new version's first build (``environments.builds``) starts once it commits.
    """
    if size_bytes > MAX_WHEEL_BYTES:
        raise LabError("request_too_large", f"Environment wheels are limited to {MAX_WHEEL_BYTES // (1024 * 1024)} MB.", param="file")
    try:
        handle.seek(0)
        info = read_wheel(handle, filename=filename)
    except InvalidWheel as error:
        raise LabError("invalid_environment_package", f"Not an acceptable environment wheel: {error}.", param="file") from None
    sha256 = _sha256(handle)
    existing = _existing_version(organization, info.name, info.version, sha256)
    if existing is not None:
        return existing, False
    key = package_key(organization_public_id=organization.public_id, sha256=sha256, filename=filename)
    handle.seek(0)
    storage.put_stream(key, handle, content_type=WHEEL_CONTENT_TYPE)
    try:
        with transaction.atomic():
            # The unique constraint sees version strings only: pushes of one organization take
            # turns here, so that a concurrent push of an equal version (0.1 beside 0.1.0) is seen.
            advisory_xact_lock(ENVIRONMENT_PUSH, organization.pk)
            existing = _existing_version(organization, info.name, info.version, sha256)
            if existing is not None:
                return existing, False
            package = EnvironmentPackage.objects.create(
                organization=organization,
                name=info.name,
                version=info.version,
                kind=info.kind,
                filename=filename,
                module=info.module,
                entry_point=info.entry_point,
                summary=info.summary,
                dependencies=info.dependencies,
                verifiers_version=info.verifiers_version,
                requires_python=info.requires_python,
                sha256=sha256,
                size_bytes=size_bytes,
                storage_key=key,
                pushed_by=actor.user,
                pushed_by_key=actor.api_key,
            )
            audit_record(
                actor=actor,
                organization=organization,
                action=AuditAction.ENVIRONMENT_PUSH,
                target=package.public_id,
                data={"sha256": sha256, "size_bytes": size_bytes},
            )
            build_start(package)
    except IntegrityError:
        # Another push of this version committed first: answer as if it had come before ours.
        existing = _existing_version(organization, info.name, info.version, sha256)
        if existing is None:  # pragma: no cover - the unique row exists once IntegrityError is raised
            raise
        return existing, False
    return package, True


def _existing_version(organization: Organization, name: str, version: str, sha256: str) -> EnvironmentPackage | None:
    """Return the live version with these bytes, None when the version is new; raise the 409 otherwise.

    Versions are compared as PEP 440 compares them, so ``0.1`` is the version ``0.1.0`` already is
    (two rows of one version would make ``@0.1`` and ``@latest`` pick either)."""
    wanted = Version(version)
    same = [
        package
        for package in EnvironmentPackage.objects.for_organization(organization).filter(name=name).order_by("pk")
        if Version(package.version) == wanted
    ]
    if not same:
        return None
    existing = next((package for package in same if package.version == version), same[0])
    package_id = f"{organization.slug}/{name}@{existing.version}"
    if existing.deleted_at is not None:
        raise LabError(
            "invalid_state",
            f"{package_id} was deleted; versions are never reused: push it as a new version.",
            param="file",
        )
    if existing.version != version:
        raise LabError(
            "invalid_state",
            f"{package_id} exists, and {version} is the same version (PEP 440); versions are immutable: push a new version.",
            param="file",
        )
    if existing.sha256 != sha256:
        raise LabError(
            "invalid_state",
            f"{package_id} exists with other bytes; versions are immutable: push a new version.",
            param="file",
        )
    return existing


def environment_list(*, organization: Organization) -> list[EnvironmentPackage]:
    """Return ``organization``'s live packages, by name, then newest version first."""
    packages = list(
        EnvironmentPackage.objects.for_organization(organization).filter(deleted_at=None).select_related("organization", "pushed_by")
    )
    newest_first = sorted(packages, key=lambda package: Version(package.version), reverse=True)
    return sorted(newest_first, key=lambda package: package.name)  # stable: versions stay newest first


def _latest(packages: list[EnvironmentPackage]) -> EnvironmentPackage | None:
    return max(packages, key=lambda package: Version(package.version), default=None)


def environment_find(
    *, organization: Organization, ref: EnvironmentRef, lock: bool = False
) -> EnvironmentPackage | None:
    """Return the live package ``ref`` names in ``organization`` (the latest version when
    ``ref.version`` is None), or None: another organization's package is found by nobody else.
    With ``lock`` the row is locked for the caller's transaction (``select_for_update``)."""
    if ref.organization != organization.slug:
        return None
    queryset = EnvironmentPackage.objects.for_organization(organization).filter(name=ref.name, deleted_at=None)
    if ref.version is not None:
        try:
            version = str(Version(ref.version))
        except ValueError:
            return None
        queryset = queryset.filter(version=version)
    if lock:
        queryset = queryset.select_for_update(of=("self",))  # the package rows, not their organization
    return _latest(list(queryset.select_related("organization")))


def environment_get(*, organization: Organization, environment_id: str) -> EnvironmentPackage:
    """Return the live package ``environment_id`` names in ``organization``; raise the 404
    ``not_found`` that a missing package and another organization's share."""
    ref = EnvironmentRef.parse(environment_id)
    found = environment_find(organization=organization, ref=ref) if ref is not None else None
    if found is None:
        raise not_found("environment")
    return found


def environment_catalogue(*, organization: Organization) -> dict[str, EnvironmentInfo]:
    """Return ``organization``'s packages as catalogue entries (``engine.catalog.EnvironmentInfo``)
    keyed by every id that names one: ``<org>/<name>@<version>``, and for the latest version also
    ``<org>/<name>`` and ``<org>/<name>@latest``. Each entry's ``id`` is the exact version's."""
    catalogue: dict[str, EnvironmentInfo] = {}
    latest: dict[str, EnvironmentPackage] = {}
    for package in environment_list(organization=organization):
        catalogue[package.public_id] = _info(package)
        latest.setdefault(package.name, package)
    for name, package in latest.items():
        catalogue[f"{organization.slug}/{name}"] = catalogue[f"{organization.slug}/{name}@latest"] = _info(package)
    return catalogue


def _info(package: EnvironmentPackage) -> EnvironmentInfo:
    return EnvironmentInfo(id=package.public_id, name=package.name, description=package.summary, args=AnyArguments())


def environment_mark_deleted(*, package: EnvironmentPackage, actor: Actor) -> None:
    """Delete a package version the caller has locked and checked to be unused: its row stays
    (``deleted_at``), so the version is never pushed again; its object goes after commit."""
    package.deleted_at = timezone.now()
    package.save(update_fields=["deleted_at"])
    audit_record(actor=actor, organization=package.organization, action=AuditAction.ENVIRONMENT_DELETE, target=package.public_id)
    key = package.storage_key
    transaction.on_commit(lambda: storage.delete(key))


def package_download_url(package: EnvironmentPackage) -> str:
    """Return where an engine fetches ``package``'s wheel: a ``file://`` URL on the filesystem
    backend, else a pre-signed GET URL good for ``DOWNLOAD_URL_EXPIRE_S`` seconds."""
    if storage.is_filesystem():
        return storage.path_of(package.storage_key).as_uri()
    return storage.download_url(
        package.storage_key, filename=package.filename, content_type=WHEEL_CONTENT_TYPE, expires_s=DOWNLOAD_URL_EXPIRE_S
    )


def wheelhouse_download_url(entry: dict) -> str:
    """Return where an engine fetches one wheel of a build's lock (``{"sha256", "filename", ...}``)
    from the shared wheelhouse: a ``file://`` URL on the filesystem backend, else a pre-signed GET
    URL good for ``DOWNLOAD_URL_EXPIRE_S`` seconds."""
    key = f"{WHEELHOUSE_PREFIX}{entry['sha256']}/{entry['filename']}"
    if storage.is_filesystem():
        return storage.path_of(key).as_uri()
    return storage.download_url(key, filename=entry["filename"], content_type=WHEEL_CONTENT_TYPE, expires_s=DOWNLOAD_URL_EXPIRE_S)
