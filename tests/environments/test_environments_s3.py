"""Environment wheels on S3 (``LAB_STORAGE_URL=s3://...``) against a real moto server: the push
stores the wheel under the environments prefix, the engine fetches it through a signed URL and
checks its SHA-256, the checkpoint orphan sweep leaves it alone, and a delete removes it."""

from __future__ import annotations

import hashlib

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from engine.packages import Package, _fetch
from environments.models import EnvironmentPackage
from environments.services import package_download_url
from jobs.artifacts.lifecycle import sweep_orphans
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker", "commit_callbacks")]
PREFIX = "lab/checkpoints"


def test_a_wheel_on_s3_is_fetched_by_signed_url_survives_the_sweep_and_goes_on_delete(owner, s3_server, bucket, tmp_path, settings):
    filename, data = build_wheel()
    response = owner.client().post(
        "/api/v1/environments", {"file": SimpleUploadedFile(filename, data)}, format="multipart"
    )
    assert response.status_code == 201, response.content
    package = EnvironmentPackage.objects.unscoped().get()
    assert s3_server.keys(bucket) == [f"{PREFIX}/{package.storage_key}"]
    assert package.storage_key.startswith("environments/")

    url = package_download_url(package)
    assert url.startswith(s3_server.endpoint_url) and "X-Amz-Signature=" in url
    fetched = _fetch(Package(id=package.public_id, sha256=package.sha256, url=url, filename=filename), tmp_path)
    assert hashlib.sha256(fetched.read_bytes()).hexdigest() == package.sha256 == hashlib.sha256(data).hexdigest()

    settings.LAB_ORPHAN_GRACE_S = 0
    sweep_orphans()
    assert s3_server.keys(bucket) == [f"{PREFIX}/{package.storage_key}"]

    assert owner.client().delete("/api/v1/environments/acme/my-env").status_code == 204
    assert s3_server.keys(bucket) == []
