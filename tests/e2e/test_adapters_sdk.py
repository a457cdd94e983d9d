"""``lab.adapters`` against the real endpoints on a live server: list and retrieve, a download
unpacked after its SHA-256 is checked, and each refusal leaving nothing behind (another
organization's or an unknown adapter, one not ready, a stored archive that no longer matches
Lab's record, a non-empty directory)."""

from __future__ import annotations

import hashlib

import pytest
from labsdk import Lab
from labsdk.errors import ConflictError, NotFoundError
from rest_framework.test import APIClient

from jobs import storage
from jobs.ingest.tokens import job_token
from jobs.models import Adapter
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from tests.support.tars import tar_of

pytestmark = [pytest.mark.usefixtures("no_broker"), pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FILES = {"adapter_config.json": b'{"peft_type": "LORA"}', "adapter_model.safetensors": bytes(range(256)) * 16}
SPEC = {"model": "lab/tiny-random-llama", "max_steps": 4, "env": [{"id": "lab/addition"}], "adapters": {"interval": 1}}


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path.parent / f"{tmp_path.name}-store")}},
    }


def adapter(tenant, step: int, *, complete: bool = True) -> tuple[str, str]:
    """Submit a job of ``tenant`` whose engine uploads an adapter of ``step``; return (job id, adapter id)."""
    job = job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=SPEC)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(job_claim_for_start(job_id=job.pk))}")
    base = f"/api/v1/ingest/jobs/{job.public_id}"
    body = engine.post(f"{base}/adapters", {"attempt": 1, "step": step, "format": "peft-lora"}, format="json").json()
    content = tar_of(FILES)
    storage.path_of(storage.upload_key(Adapter.objects.unscoped().get(public_id=body["id"]).storage_key)).write_bytes(content)
    if complete:
        done = engine.post(f"{base}/adapters/{body['id']}/complete",
                           {"size_bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}, format="json")
        assert done.json()["status"] == "ready"
    return job.public_id, body["id"]


def test_list_retrieve_and_download_unpack_a_ready_adapter(lab, tenant, tmp_path):
    job_id, adapter_id = adapter(tenant, 2)
    (listed,) = lab.adapters.list(job_id)
    assert (listed.id, listed.step, listed.status, listed.format) == (adapter_id, 2, "ready", "peft-lora")
    assert listed.sha256 == hashlib.sha256(tar_of(FILES)).hexdigest()
    assert lab.adapters.retrieve(adapter_id) == listed
    target = lab.adapters.download(adapter_id, tmp_path / "out" / "adapter", progress=False)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == FILES
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["adapter"]


def test_download_refuses_foreign_unknown_and_unready_adapters_and_leaves_nothing(lab, tenant, outsider, tmp_path):
    _, foreign = adapter(outsider, 1)
    _, unready = adapter(tenant, 1, complete=False)
    for adapter_id, error in ((foreign, NotFoundError), ("adp_missing", NotFoundError), (unready, ConflictError)):
        with pytest.raises(error) as raised:
            lab.adapters.download(adapter_id, tmp_path / adapter_id, progress=False)
        assert list(tmp_path.iterdir()) == []
        if error is ConflictError:
            assert raised.value.code == "adapter_not_ready"
    with pytest.raises(NotFoundError):
        lab.adapters.list(Adapter.objects.unscoped().get(public_id=foreign).job.public_id)


def test_an_archive_that_no_longer_matches_its_sha256_is_not_unpacked(lab, tenant, tmp_path):
    _, adapter_id = adapter(tenant, 1)
    stored = storage.path_of(Adapter.objects.unscoped().get(public_id=adapter_id).storage_key)
    stored.write_bytes(stored.read_bytes()[:-1] + b"\x01")  # same size, other bytes
    with pytest.raises(ConflictError, match="no longer matches the SHA-256") as refused:  # Lab reads it again first
        lab.adapters.download(adapter_id, tmp_path / "adapter", progress=False)
    assert refused.value.code == "adapter_corrupted"
    assert Adapter.objects.unscoped().get(public_id=adapter_id).status == "failed"
    assert list(tmp_path.iterdir()) == []


def test_download_refuses_a_non_empty_directory_and_changes_nothing(lab, tenant, tmp_path):
    _, adapter_id = adapter(tenant, 1)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="must be an empty directory"):
        lab.adapters.download(adapter_id, tmp_path / "busy", progress=False)
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["mine.txt"]


def test_another_organizations_key_lists_nothing(live_server, tenant, outsider):
    job_id, _ = adapter(tenant, 1)
    with Lab(api_key=outsider.key, base_url=live_server.url, timeout=10) as other:
        with pytest.raises(NotFoundError):
            other.adapters.list(job_id)
