"""Serving an artifact's archive, and the check that it is still what Lab verified.

A ready artifact's stored archive must still have the size and SHA-256 it was verified with when
Lab serves it or a launcher resumes from it; one that changed is failed instead
(``verify_stored_archive``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import transaction
from django.http import FileResponse, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.utils.http import content_disposition_header

from jobs import storage
from jobs.artifacts.kinds import kind_of
from jobs.artifacts.lifecycle import mark_failed
from jobs.models import Artifact, Job
from lab.errors import LabError

# A redirect's signed URL only has to outlive the client following it (seconds).
DOWNLOAD_URL_EXPIRE_S = 300
#: The header of a download answer (the archive, or the redirect to it) that gives the hex
#: SHA-256 the archive was verified with, so whoever fetches it can check what arrived.
ARCHIVE_SHA256_HEADER = "X-Lab-Archive-SHA256"


def archive_filename(artifact: Artifact) -> str:
    """Return the file name a downloaded archive is saved as: ``<job id>-step-<step>-<id>.tar``."""
    return f"{artifact.job.public_id}-step-{artifact.step:06d}-{artifact.public_id}.tar"


def download_response(artifact: Artifact, *, request: Any) -> HttpResponse:
    """Return the HTTP answer to ``request`` that downloads ``artifact``'s archive (the caller
    checked access).

    On the filesystem: the tar itself, once it is found to still have the SHA-256 it was
    verified with (``verify_stored_archive``), streamed (``Content-Length``, ``Content-Disposition:
    attachment; filename="<job id>-step-<step>-<id>.tar"``) a megabyte at a time, as an
    asynchronous iterator under ASGI (Django would read a synchronous one whole into memory
    first) and as a FileResponse under WSGI. On S3: 302 to a pre-signed GET URL good for
    ``DOWNLOAD_URL_EXPIRE_S`` seconds, unread: the receiver checks the bytes against the SHA-256
    in ``ARCHIVE_SHA256_HEADER``, which both answers carry. Raises LabError ``<kind>_not_ready``
    (``checkpoint_not_ready``, ``adapter_not_ready``) for one that is not ``ready``, 409
    ``<kind>_corrupted`` when its archive changed (it is then failed), and 404 when its object
    has gone missing.
    """
    kind = kind_of(artifact)
    if artifact.status != kind.statuses.READY:
        raise LabError(
            f"{kind.name}_not_ready",
            f"{kind.title} {artifact.public_id} is {artifact.status}; only ready {kind.name}s can be downloaded.",
        )
    filename = archive_filename(artifact)
    if storage.is_filesystem():
        verify_stored_archive(artifact)
        try:
            handle = storage.open_archive(artifact.storage_key)
        except FileNotFoundError:
            raise _archive_gone(artifact) from None
        response = archive_file_response(handle, request=request, filename=filename, size_bytes=artifact.size_bytes)
    else:
        url = storage.download_url(artifact.storage_key, filename=filename, expires_s=DOWNLOAD_URL_EXPIRE_S)
        response = HttpResponseRedirect(url)
        response["Cache-Control"] = "no-store"
    response[ARCHIVE_SHA256_HEADER] = artifact.sha256
    return response


def archive_file_response(handle, *, request: Any, filename: str, size_bytes: int) -> HttpResponse:
    """Return the answer that streams the open tar ``handle`` (``size_bytes`` long) as the
    attachment ``filename``, a megabyte at a time: an asynchronous iterator under ASGI (Django
    would read a synchronous one whole into memory first), a FileResponse under WSGI. The
    answer closes ``handle``."""
    if isinstance(getattr(request, "_request", request), ASGIRequest):
        response = StreamingHttpResponse(_read_in_thread(handle), content_type=storage.ARCHIVE_CONTENT_TYPE)
        response["Content-Disposition"] = content_disposition_header(True, filename)
    else:
        response = FileResponse(handle, as_attachment=True, filename=filename, content_type=storage.ARCHIVE_CONTENT_TYPE)
    response["Content-Length"] = str(size_bytes)
    return response


def verify_stored_archive(artifact: Artifact) -> None:
    """Check that the ready ``artifact``'s stored archive still has the size and SHA-256 it was
    verified with when it became ready; read it whole (on S3: download it), holding no lock.

    A changed archive is never served or resumed from: the artifact (locked, with its job, if
    still ready with that SHA-256) is failed with a warning event (``lifecycle.mark_failed``),
    and LabError ``<kind>_corrupted`` (``checkpoint_corrupted``, ``adapter_corrupted``) is raised.
    Raises LabError ``not_found`` when the object has gone missing.
    """
    kind = kind_of(artifact)
    stored = storage.stored_size_and_sha256(artifact.storage_key, expected_size=artifact.size_bytes)
    if stored is None:
        raise _archive_gone(artifact)
    if stored == (artifact.size_bytes, artifact.sha256):
        return
    message = (
        f"{kind.title} of step {artifact.step} failed verification: its stored archive no longer matches the SHA-256 "
        f"recorded when it became ready ({artifact.sha256[:12]}…)."
    )
    with transaction.atomic():
        job = Job.objects.unscoped().select_for_update().get(pk=artifact.job_id)
        rows = kind.model.objects.unscoped().select_for_update()
        locked = rows.filter(pk=artifact.pk, status=artifact.status, sha256=artifact.sha256).first()
        if locked is not None:
            mark_failed(job, locked, message)
    raise LabError(
        f"{kind.name}_corrupted",
        f"{kind.title} {artifact.public_id} failed verification: its stored archive no longer matches the SHA-256 "
        "recorded when it became ready; it is now failed.",
    )


def _archive_gone(artifact: Artifact) -> LabError:
    """Return the 404 for a ready artifact whose archive is no longer in storage."""
    return LabError("not_found", f"This {kind_of(artifact).name}'s archive is no longer stored.")


async def _read_in_thread(handle, chunk_size: int = 1024 * 1024) -> AsyncIterator[bytes]:
    """Yield ``handle``'s bytes, each read in a worker thread; close it however the reading ends."""
    read = sync_to_async(handle.read, thread_sensitive=False)
    try:
        while chunk := await read(chunk_size):
            yield chunk
    finally:
        await sync_to_async(handle.close, thread_sensitive=False)()
