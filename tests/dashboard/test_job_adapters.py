"""The job page lists a job's adapter artifacts with a download link; the download is the
project's own, another organization's adapter is a 404, one that is not ready is refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.support.jobs_helpers import Engine, submit

pytestmark = pytest.mark.django_db

PROJECT = "/o/acme/p/default/"


@pytest.fixture(autouse=True)
def _no_broker(no_broker):
    """Keep the run pipeline's tasks from reaching a broker: these tests look at pages, not at runs."""


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "objects")}},
    }


def adapter(engine: Engine, step: int, data: bytes, *, complete: bool = True) -> str:
    registered = engine.post("adapters", {"attempt": 1, "step": step, "format": "peft-lora"})
    Path(registered["upload"]["path"]).write_bytes(data)
    if complete:
        done = engine.post(f"adapters/{registered['id']}/complete", {"size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        assert done["status"] == "ready", done
    return registered["id"]


def test_the_job_page_lists_adapters_and_downloads_a_ready_one(owner, owner_client, spec):
    job = submit(owner, {**spec, "adapters": {"interval": 1}})
    engine = Engine(job)
    engine.running(0)
    ready = adapter(engine, 1, b"adapter weights")
    uploading = adapter(engine, 2, b"half", complete=False)
    page = owner_client.get(f"{PROJECT}jobs/{job.public_id}/").content.decode()
    listing = owner_client.get(f"{PROJECT}jobs/{job.public_id}/adapters/").content.decode()
    download = f"{PROJECT}adapters/{ready}/download/"
    for html in (page, listing):
        assert f'href="{download}"' in html
        assert ready in html and uploading in html
        assert f"{PROJECT}adapters/{uploading}/download/" not in html
    response = owner_client.get(download)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"adapter weights"
    refused = owner_client.get(f"{PROJECT}adapters/{uploading}/download/", follow=True)
    assert "only ready adapters can be downloaded" in refused.content.decode()


def test_a_job_without_adapters_says_so(owner, owner_client, spec):
    job = submit(owner, spec)
    page = owner_client.get(f"{PROJECT}jobs/{job.public_id}/").content.decode()
    assert "this job's spec has no <code>[adapters]</code> section" in page


def test_another_organizations_adapter_is_a_404(owner, outsider, outsider_client, spec):
    job = submit(owner, {**spec, "adapters": {"interval": 1}})
    engine = Engine(job)
    engine.running(0)
    ready = adapter(engine, 1, b"secret weights")
    assert outsider_client.get(f"/o/globex/p/default/adapters/{ready}/download/").status_code == 404
    assert outsider_client.get(f"{PROJECT}adapters/{ready}/download/").status_code == 404
