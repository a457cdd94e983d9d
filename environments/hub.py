"""Pushing through the Environments Hub's upload protocol (``prime env push`` of ``prime==0.18.0``).

The hub's client asks for an upload, ``PUT``s the bytes to the URL it is given (without its API
key), then finalizes. On Lab the upload is a signed ticket (``django.core.signing``) naming the
organization, the API key that asked, the environment, the file's name, size and SHA-256, and a
staging key in Lab's storage; it is good for ``UPLOAD_TICKET_MAX_AGE_S``. The ``PUT`` stores bytes
that match the ticket, nothing else; finalizing a wheel's ticket hands the staged wheel to
``environments.services.environment_push``, so the version is stored, checked and built exactly as
``lab envs push`` makes it. The hub's source archive is checked against its ticket and not kept:
Lab builds from the wheel.
"""

from __future__ import annotations

import hashlib
import secrets
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import BinaryIO

from django.core import signing
from django.utils import timezone
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from environments.models import EnvironmentPackage
from environments.services import _existing_version, environment_push
from environments.storage import KEY_PREFIX, WHEEL_CONTENT_TYPE
from environments.wheels import MAX_WHEEL_BYTES
from lab import storage
from lab.audit import Actor
from lab.errors import LabError, not_found
from lab.models import Organization

UPLOAD_TICKET_MAX_AGE_S = 3600
#: Where uploaded wheels wait for their finalize (``<organization>/<token>/<file name>``).
STAGING_PREFIX = f"{KEY_PREFIX}hub-uploads/"
#: A staged wheel this old can no longer be finalized (its ticket expired) and is deleted.
STAGED_MAX_AGE = timedelta(seconds=UPLOAD_TICKET_MAX_AGE_S + 600)
_SALT = "environments.hub-upload"
_CHUNK = 1024 * 1024
WHEEL, SOURCE = "wheel", "source"


@dataclass(frozen=True)
class UploadTicket:
    """What one hub upload may store: ``kind`` (``wheel`` or ``source``), for the environment
    ``name`` of the organization ``organization_id``, asked for with the API key ``api_key_id``."""

    kind: str
    organization_id: int
    api_key_id: int | None
    name: str
    filename: str
    size_bytes: int
    sha256: str
    staging_key: str

    def sign(self) -> str:
        return signing.dumps(
            [self.kind, self.organization_id, self.api_key_id, self.name, self.filename, self.size_bytes, self.sha256, self.staging_key],
            salt=_SALT, compress=True,
        )

    @classmethod
    def read(cls, upload_id: str) -> UploadTicket:
        """The ticket ``upload_id`` carries; raise the 404 ``not_found`` for one that is forged,
        expired or malformed (an upload URL is good for its one upload only)."""
        try:
            fields = signing.loads(upload_id, salt=_SALT, max_age=UPLOAD_TICKET_MAX_AGE_S)
            return cls(*fields)
        except (signing.BadSignature, TypeError, ValueError):
            raise not_found("upload") from None


def _refuse_existing(organization: Organization, name: str, version: str, sha256: str) -> None:
    """Refuse, before any upload, a wheel whose version exists with other bytes (or was deleted):
    the 409 ``environment_push`` would give at finalize, in the words the hub's CLI recognises."""
    try:
        _existing_version(organization, name, _normalized(version), sha256)
    except LabError as error:
        raise LabError(
            "invalid_state",
            f"{error.message} This content hash already exists as {name} {version}: bump the version (prime env push --auto-bump).",
            param="semantic_version",
        ) from None
    except InvalidVersion:
        return  # the wheel's own version is read, and checked, at finalize


def hub_upload_start(
    *, organization: Organization, actor: Actor, kind: str, name: str, filename: str, size_bytes: object, sha256: object,
    version: object = None,
) -> str:
    """Return the id of a new upload of ``filename`` (``size_bytes`` long, ``sha256``) for the
    environment ``name`` of ``organization`` (a wheel of the version ``version``). Raises 400
    ``invalid_request`` for a malformed field, ``request_too_large`` past the wheel limit, and 409
    ``invalid_state`` for a wheel whose version exists with other bytes."""
    if kind == WHEEL and not (isinstance(filename, str) and filename.endswith(".whl")):
        raise LabError("invalid_request", "filename must be the wheel's file name (*.whl).", param="filename")
    if not isinstance(filename, str) or not filename or "/" in filename or "\\" in filename or len(filename) > 200:
        raise LabError("invalid_request", "filename must be a file name without '/'.", param="filename")
    if kind == WHEEL and canonicalize_name(filename.split("-")[0]) != canonicalize_name(name):
        raise LabError(
            "invalid_environment_package",
            f"The wheel {filename!r} is not of the environment {name!r} being pushed.",
            param="filename",
        )
    if kind == SOURCE and size_bytes is None:
        size_bytes = 0  # the hub's source archive comes without its size: checked by its SHA-256 alone
    elif not isinstance(size_bytes, int) or isinstance(size_bytes, bool) or size_bytes < 1:
        raise LabError("invalid_request", "size must be the file's size in bytes.", param="size")
    if size_bytes > MAX_WHEEL_BYTES:
        raise LabError("request_too_large", f"Environment uploads are limited to {MAX_WHEEL_BYTES // (1024 * 1024)} MB.", param="size")
    if not (isinstance(sha256, str) and len(sha256) == 64 and all(char in "0123456789abcdef" for char in sha256)):
        raise LabError("invalid_request", "sha256 must be the file's SHA-256 in lower-case hex.", param="sha256")
    if kind == WHEEL and isinstance(version, str):
        _refuse_existing(organization, str(canonicalize_name(name)), version, sha256)
    staging_key = f"{STAGING_PREFIX}{organization.public_id}/{secrets.token_hex(16)}/{filename}"
    return UploadTicket(
        kind, organization.pk, actor.api_key.pk if actor.api_key else None, str(canonicalize_name(name)),
        filename, size_bytes, sha256, staging_key,
    ).sign()


def hub_upload_store(*, upload_id: str, handle: BinaryIO) -> UploadTicket:
    """Store the body in ``handle`` (read to its end) for the upload ``upload_id`` when its size
    and SHA-256 are the ticket's: 400 ``invalid_request`` otherwise, and nothing stored."""
    ticket = UploadTicket.read(upload_id)
    with tempfile.SpooledTemporaryFile(max_size=8 * _CHUNK) as spool:
        digest, size = hashlib.sha256(), 0
        while chunk := handle.read(_CHUNK):
            size += len(chunk)
            if size > (ticket.size_bytes or MAX_WHEEL_BYTES):
                raise LabError("invalid_request", f"The upload is larger than the {ticket.size_bytes or MAX_WHEEL_BYTES} bytes announced.")
            digest.update(chunk)
            spool.write(chunk)
        if size != (ticket.size_bytes or size) or digest.hexdigest() != ticket.sha256:
            raise LabError(
                "invalid_request",
                f"The upload ({size} bytes) is not the file announced ({ticket.size_bytes} bytes, sha256 {ticket.sha256[:12]}...).",
            )
        if ticket.kind == WHEEL:  # the source archive is checked, not kept: Lab builds from the wheel
            spool.seek(0)
            storage.put_stream(ticket.staging_key, spool, content_type=WHEEL_CONTENT_TYPE)
    return ticket


def _ticket_of(organization: Organization, upload_id: str, kind: str, name: str) -> UploadTicket:
    ticket = UploadTicket.read(upload_id)
    if ticket.organization_id != organization.pk or ticket.kind != kind or ticket.name != str(canonicalize_name(name)):
        raise not_found("upload")
    return ticket


def hub_wheel_finalize(*, organization: Organization, actor: Actor, upload_id: str, name: str) -> tuple[EnvironmentPackage, bool]:
    """Push the wheel uploaded for ``upload_id`` as a version of ``organization``'s environment
    ``name`` (``environment_push``: stored, checked, its build started); returns ``(package,
    created)``. A ticket of another organization or environment is the 404 ``not_found``; a
    wheel not uploaded yet is 409 ``invalid_state``."""
    ticket = _ticket_of(organization, upload_id, WHEEL, name)
    try:
        staged = storage.open_object(ticket.staging_key)
    except FileNotFoundError:
        raise LabError("invalid_state", "The wheel has not been uploaded: PUT it to the upload_url first.") from None
    with staged, tempfile.SpooledTemporaryFile(max_size=8 * _CHUNK) as spool:
        while chunk := staged.read(_CHUNK):
            spool.write(chunk)
        package, created = environment_push(
            organization=organization, actor=actor, handle=spool, filename=ticket.filename, size_bytes=ticket.size_bytes
        )
    storage.delete(ticket.staging_key)
    return package, created


def hub_version_find(*, organization: Organization, name: str, version: object) -> EnvironmentPackage:
    """The live version ``version`` of ``organization``'s environment ``name`` that a wheel push
    made; 409 ``invalid_state`` when there is none (the hub sends the wheel before the source)."""
    package = None
    if isinstance(version, str):
        package = (
            EnvironmentPackage.objects.for_organization(organization)
            .filter(name=str(canonicalize_name(name)), deleted_at=None)
            .filter(version=_normalized(version))
            .first()
        )
    if package is None:
        raise LabError("invalid_state", f"No version {version!r} of {name!r} was pushed: push its wheel first (prime env push).")
    return package


def _normalized(version: str) -> str:
    try:
        return str(Version(version))
    except InvalidVersion:
        return version


def hub_source_finalize(*, organization: Organization, upload_id: str, name: str) -> UploadTicket:
    """Check the source archive's upload ``upload_id`` belongs to ``organization``'s ``name``."""
    return _ticket_of(organization, upload_id, SOURCE, name)


def hub_uploads_sweep(*, now: datetime | None = None) -> int:
    """Delete staged wheels whose ticket expired (``STAGED_MAX_AGE`` past their upload) without a
    finalize that took them: an abandoned ``prime env push``, or a finalize that refused the
    bytes. Returns how many were deleted."""
    cutoff = (now or timezone.now()) - STAGED_MAX_AGE
    deleted = 0
    for key, modified in storage.iter_objects(STAGING_PREFIX):
        if modified < cutoff:
            storage.delete(key)
            deleted += 1
    return deleted
