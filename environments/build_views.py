"""What a build's pod asks of Lab (``environments.builder.pod``), under
``/api/v1/environment-builds/<build id>/``, with the build's token (``Authorization: Bearer lbt_...``,
``environments.pod_builds.build_token``), only while that build runs:

- ``GET wheel``: the pushed wheel; ``GET datasets``: a tar of the organization's pushed datasets
  (``<owner>/<name>/...``, as ``copy_snapshots`` unpacks them);
- ``HEAD wheelhouse/<sha256>/<file name>``: 200 when the shared wheelhouse has it, else 404;
  ``PUT`` it there: Lab computes the body's SHA-256 and refuses one that is not the name's, so a
  pod stores nothing in the wheelhouse but the wheel that digest names;
- ``HEAD``/``PUT hub-datasets/<sha256>``: the tar of the Hugging Face datasets its loading
  fetched (``environments.hub_datasets``), checked as a wheel is;
- what one build's pod stores in the wheelhouse and as Hub datasets comes to at most
  ``LAB_ENVIRONMENT_BUILD_UPLOAD_MAX_BYTES`` (16 GiB; counted in the cache): past it, a 413;
- ``PUT log`` (its last ``MAX_LOG_BYTES``) and ``PUT result`` (the builder's result object, at
  most ``MAX_RESULT_BYTES``), each at that build's own key; the build sweep reads them.

Nothing here changes a build's state: the sweep decides from the Job's status and these objects.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.http import FileResponse, HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.views import APIView

from environments import hub_datasets
from environments.builds import MAX_LOG_BYTES, build_log_key
from environments.datasets import copy_snapshots
from environments.models import EnvironmentBuild
from environments.pod_builds import _SHA256, RUNNING_GRACE_S, build_for_token, result_key, wheelhouse_key
from environments.storage import WHEEL_CONTENT_TYPE
from environments.wheels import MAX_WHEEL_BYTES
from lab import storage
from lab.api.auth import bearer_token
from lab.config import env_int

#: The most one build's pod may store through these routes, in bytes, all its wheels and its
#: Hugging Face datasets tar together (``LAB_ENVIRONMENT_BUILD_UPLOAD_MAX_BYTES``): past it each
#: new upload is a 413, so a hostile package cannot fill Lab's storage one digest at a time.
DEFAULT_UPLOAD_MAX_BYTES = 16 * 1024**3
_INVALID = "Missing, malformed, expired or foreign build token, or the build is not running."
MAX_RESULT_BYTES = 4 * 1024 * 1024
_CHUNK = 1024 * 1024


class BuildTokenAuthentication(BaseAuthentication):
    """Authenticate ``Authorization: Bearer lbt_...`` for the running build named in the URL."""

    def authenticate(self, request):
        token = bearer_token(get_authorization_header(request))
        build = build_for_token(token, request.parser_context["kwargs"].get("build_id")) if token else None
        if build is None:
            raise AuthenticationFailed(_INVALID)
        return (None, build)

    def authenticate_header(self, request) -> str:
        return "Bearer"


class HasBuildToken(BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, EnvironmentBuild)


class BuildCallbackView(APIView):
    authentication_classes = [BuildTokenAuthentication]
    permission_classes = [HasBuildToken]
    throttle_classes: list = []
    parser_classes: list = []


def _spool(request, limit: int) -> tuple[tempfile._TemporaryFileWrapper, str, int] | None:
    """The request body in a temporary file, its SHA-256 and size; None past ``limit`` bytes."""
    spool = tempfile.NamedTemporaryFile(suffix=".upload")
    digest, size = hashlib.sha256(), 0
    while chunk := request.stream.read(_CHUNK) if request.stream is not None else b"":
        size += len(chunk)
        if size > limit:
            spool.close()
            return None
        digest.update(chunk)
        spool.write(chunk)
    spool.flush()
    return spool, digest.hexdigest(), size


def upload_max_bytes() -> int:
    """``LAB_ENVIRONMENT_BUILD_UPLOAD_MAX_BYTES`` (Django's setting when set there)."""
    value = getattr(settings, "LAB_ENVIRONMENT_BUILD_UPLOAD_MAX_BYTES", None)
    return value if value is not None else env_int("LAB_ENVIRONMENT_BUILD_UPLOAD_MAX_BYTES", DEFAULT_UPLOAD_MAX_BYTES, minimum=0)


def _counted(build: EnvironmentBuild, size: int) -> bool:
    """Count ``size`` more bytes stored by ``build``'s pod; False (nothing counted) past ``upload_max_bytes``."""
    key = f"environments:build-uploads:{build.pk}:{build.number}"
    cache.add(key, 0, timeout=settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S + RUNNING_GRACE_S)
    if cache.incr(key, size) <= upload_max_bytes():
        return True
    cache.decr(key, size)
    return False


def _store(request, key: str, sha256: str, limit: int, content_type: str, too_large: str) -> HttpResponse:
    """Store the request's body at the content-addressed ``key`` when its SHA-256 is ``sha256``,
    it is at most ``limit`` bytes and the build's uploads stay within ``upload_max_bytes``."""
    if storage.object_storage().exists(key):
        return HttpResponse(status=200)
    spooled = _spool(request, limit)
    if spooled is None:
        return _error(413, too_large)
    spool, digest, size = spooled
    with spool:
        if digest != sha256:
            return _error(400, f"the body's SHA-256 is {digest}, not {sha256}")
        if not _counted(request.auth, size):
            return _error(413, f"the build's uploads came to more than {upload_max_bytes()} bytes (LAB_ENVIRONMENT_BUILD_UPLOAD_MAX_BYTES)")
        storage.put_file(key, Path(spool.name), content_type=content_type)
    return HttpResponse(status=201)


class BuildWheelView(BuildCallbackView):
    @extend_schema(exclude=True)
    def get(self, request, build_id: int):
        package = request.auth.package
        response = FileResponse(storage.open_object(package.storage_key), content_type=WHEEL_CONTENT_TYPE)
        response["Content-Disposition"] = f'attachment; filename="{package.filename}"'
        return response


class BuildDatasetsView(BuildCallbackView):
    @extend_schema(exclude=True)
    def get(self, request, build_id: int):
        spool = tempfile.TemporaryFile()
        with tempfile.TemporaryDirectory(prefix="build-datasets-") as folder:
            copy_snapshots(request.auth.package.organization_id, Path(folder))
            with tarfile.open(fileobj=spool, mode="w:") as archive:
                for child in sorted(Path(folder).iterdir()):
                    archive.add(child, arcname=child.name)
        spool.seek(0)
        return FileResponse(spool, content_type="application/x-tar")


class BuildWheelhouseView(BuildCallbackView):
    @extend_schema(exclude=True)
    def head(self, request, build_id: int, sha256: str, filename: str):
        key = wheelhouse_key(sha256, filename)
        if key is None:
            return HttpResponse(status=400)
        return HttpResponse(status=200 if storage.object_storage().exists(key) else 404)

    @extend_schema(exclude=True)
    def put(self, request, build_id: int, sha256: str, filename: str):
        key = wheelhouse_key(sha256, filename)
        if key is None:
            return _error(400, "not a wheel's SHA-256 and file name")
        return _store(request, key, sha256, MAX_WHEEL_BYTES * 4, WHEEL_CONTENT_TYPE, "the wheel is too large")


def _hub_datasets_key(request, sha256: str) -> str:
    return hub_datasets.key(request.auth.package.organization.public_id, sha256)


class BuildHubDatasetsView(BuildCallbackView):
    """The tar of the Hugging Face datasets a build's loading fetched (``environments.hub_datasets``),
    content-addressed as the wheelhouse is, within the build's organization."""

    @extend_schema(exclude=True)
    def head(self, request, build_id: int, sha256: str):
        if not _SHA256.match(sha256):
            return HttpResponse(status=400)
        return HttpResponse(status=200 if storage.object_storage().exists(_hub_datasets_key(request, sha256)) else 404)

    @extend_schema(exclude=True)
    def put(self, request, build_id: int, sha256: str):
        if not _SHA256.match(sha256):
            return _error(400, "not a SHA-256")
        return _store(request, _hub_datasets_key(request, sha256), sha256, hub_datasets.max_bytes(), hub_datasets.CONTENT_TYPE,
                      "the datasets are larger than LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES")


class BuildLogView(BuildCallbackView):
    @extend_schema(exclude=True)
    def put(self, request, build_id: int):
        spooled = _spool(request, MAX_LOG_BYTES)
        if spooled is None:
            return _error(413, f"a build log is at most {MAX_LOG_BYTES} bytes (its end)")
        spool, _, _ = spooled
        with spool:
            storage.put_file(build_log_key(request.auth), Path(spool.name), content_type="text/plain")
        return HttpResponse(status=204)


class BuildResultView(BuildCallbackView):
    @extend_schema(exclude=True)
    def put(self, request, build_id: int):
        spooled = _spool(request, MAX_RESULT_BYTES)
        if spooled is None:
            return _error(413, f"a build result is at most {MAX_RESULT_BYTES} bytes")
        spool, _, _ = spooled
        with spool:
            try:
                json.loads(Path(spool.name).read_bytes())
            except (ValueError, RecursionError):
                return _error(400, "the result is not JSON (or nests too deeply)")
            storage.put_file(result_key(request.auth), Path(spool.name), content_type="application/json")
        return HttpResponse(status=204)


def _error(status: int, message: str) -> HttpResponse:
    return HttpResponse(json.dumps({"error": {"code": "invalid_request", "message": message}}), status=status,
                        content_type="application/json")
