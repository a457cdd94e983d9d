"""The SDK's ``lab.checkpoints`` and the ``lab checkpoints`` CLI against the real endpoints on a
live server: filesystem storage (the tar streamed by Lab) and S3 on a moto server (a redirect
to a signed URL, fetched without Lab's key)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from labsdk import Lab
from labsdk.errors import ConflictError, NotFoundError
from rest_framework.test import APIClient

from jobs.ingest.tokens import job_token
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from tests.support.cli import lab_cli
from tests.support.s3server import use_s3_storage
from tests.support.tars import tar_of

pytestmark = [pytest.mark.usefixtures("no_broker"), pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FILES = {
    "adapter_config.json": b'{"peft_type": "LORA"}',
    "adapter_model.safetensors": bytes(range(256)) * 64,
    "trainer_state/state.json": b'{"step": 2}',
}


class Engine:
    """Drives the ingest API as the engine of one job does."""

    def __init__(self, tenant, spec):
        self.job = job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=spec)
        attempt = job_claim_for_start(job_id=self.job.pk)
        self.token = job_token(attempt)
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token}")
        self.base = f"/api/v1/ingest/jobs/{self.job.public_id}"

    def checkpoint(self, step: int, content: bytes, tmp_path: Path, *, complete: bool = True) -> str:
        from engine.http_transport import HttpTransport

        body = self.client.post(f"{self.base}/checkpoints", {"attempt": 1, "step": step, "format": "peft-lora"}, format="json").json()
        archive = tmp_path / f"upload-{step}.tar"
        archive.write_bytes(content)
        HttpTransport("http://127.0.0.1:9", self.job.public_id, self.token).upload(body["upload"], archive)
        if complete:
            answer = self.client.post(
                f"{self.base}/checkpoints/{body['id']}/complete",
                {"size_bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()},
                format="json",
            )
            assert answer.json()["status"] == "ready"
        return body["id"]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


@pytest.fixture
def job_spec() -> dict:
    return {"model": "lab/tiny-random-llama", "max_steps": 4, "env": [{"id": "lab/addition"}],
            "checkpoints": {"interval": 1, "keep_last": 5}}


def test_list_gives_a_jobs_checkpoints_newest_first(lab, tenant, outsider, job_spec, tmp_path):
    engine = Engine(tenant, job_spec)
    first = engine.checkpoint(1, tar_of(FILES), tmp_path)
    second = engine.checkpoint(2, tar_of(FILES), tmp_path)
    pending = engine.checkpoint(3, b"partial", tmp_path, complete=False)
    listed = lab.checkpoints.list(engine.job.public_id)
    assert [(c.id, c.step, c.status) for c in listed] == [(pending, 3, "uploading"), (second, 2, "ready"), (first, 1, "ready")]
    assert listed[1].sha256 == hashlib.sha256(tar_of(FILES)).hexdigest()
    assert listed[1].size_bytes == len(tar_of(FILES))
    with Lab(api_key=outsider.key, base_url=lab._http.base_url.removesuffix("/api/v1/"), timeout=10) as other:
        with pytest.raises(NotFoundError):
            other.checkpoints.list(engine.job.public_id)


def test_download_unpacks_into_a_directory_with_a_progress_bar(lab, tenant, job_spec, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # tqdm draws its bar on a terminal only
    ckpt = Engine(tenant, job_spec).checkpoint(1, tar_of(FILES), tmp_path)
    target = tmp_path / "out" / "adapter"
    assert lab.checkpoints.download(ckpt, target) == target
    assert {str(p.relative_to(target)): p.read_bytes() for p in target.rglob("*") if p.is_file()} == FILES
    assert sorted(p.name for p in target.parent.iterdir()) == ["adapter"]  # no archive or staging left
    bar = capsys.readouterr().err
    assert "adapter.tar.download: 100%" in bar
    assert f"{len(tar_of(FILES)) / 1000:.1f}k/{len(tar_of(FILES)) / 1000:.1f}k" in bar


def test_download_without_extract_saves_the_tar(lab, tenant, job_spec, tmp_path):
    ckpt = Engine(tenant, job_spec).checkpoint(1, tar_of(FILES), tmp_path)
    saved = lab.checkpoints.download(ckpt, tmp_path / "ckpt.tar", extract=False, progress=False)
    assert saved.read_bytes() == tar_of(FILES)


def test_download_refuses_foreign_unknown_and_unready_checkpoints_and_leaves_nothing(lab, tenant, outsider, job_spec, tmp_path):
    foreign = Engine(outsider, job_spec).checkpoint(1, tar_of(FILES), tmp_path)
    unready = Engine(tenant, job_spec).checkpoint(1, tar_of(FILES), tmp_path, complete=False)
    for ckpt_id, error in ((foreign, NotFoundError), ("ckpt_missing", NotFoundError), (unready, ConflictError)):
        target = tmp_path / f"out-{ckpt_id}"
        with pytest.raises(error) as raised:
            lab.checkpoints.download(ckpt_id, target, progress=False)
        assert not target.exists()
        assert list(tmp_path.glob(f"out-{ckpt_id}*")) == []
        if error is ConflictError:
            assert raised.value.code == "checkpoint_not_ready"


def test_download_refuses_a_non_empty_directory_and_changes_nothing(lab, tenant, job_spec, tmp_path):
    ckpt = Engine(tenant, job_spec).checkpoint(1, tar_of(FILES), tmp_path)
    target = tmp_path / "busy"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="must be an empty directory"):
        lab.checkpoints.download(ckpt, target, progress=False)
    assert [p.name for p in target.iterdir()] == ["mine.txt"]


def test_download_follows_the_s3_redirect(lab, tenant, job_spec, tmp_path, s3_server, settings, monkeypatch):
    bucket = s3_server.new_bucket()
    use_s3_storage(settings, monkeypatch, s3_server, bucket)
    ckpt = Engine(tenant, job_spec).checkpoint(2, tar_of(FILES), tmp_path)
    target = lab.checkpoints.download(ckpt, tmp_path / "from-s3", progress=False)
    assert {str(p.relative_to(target)): p.read_bytes() for p in target.rglob("*") if p.is_file()} == FILES
    saved = lab.checkpoints.download(ckpt, tmp_path / "from-s3.tar", extract=False, progress=False)
    assert saved.read_bytes() == tar_of(FILES)


def test_the_cli_lists_and_downloads(live_server, tenant, outsider, job_spec, tmp_path):
    engine = Engine(tenant, job_spec)
    ckpt = engine.checkpoint(2, tar_of(FILES), tmp_path)
    listed = lab_cli("checkpoints", "list", engine.job.public_id, "--json", key=tenant.key, base_url=live_server.url)
    assert listed.returncode == 0, listed.stderr
    assert [(c["id"], c["step"], c["status"]) for c in json.loads(listed.stdout)] == [(ckpt, 2, "ready")]
    table = lab_cli("checkpoints", "list", engine.job.public_id, key=tenant.key, base_url=live_server.url)
    assert ckpt in table.stdout and "ready" in table.stdout
    unpacked = lab_cli("checkpoints", "download", ckpt, "-o", str(tmp_path / "cli-dir"), "--json", key=tenant.key, base_url=live_server.url)
    assert unpacked.returncode == 0, unpacked.stderr
    assert json.loads(unpacked.stdout) == {"id": ckpt, "path": str(tmp_path / "cli-dir"), "extracted": True}
    assert (tmp_path / "cli-dir" / "trainer_state" / "state.json").read_bytes() == FILES["trainer_state/state.json"]
    tar = lab_cli("checkpoints", "download", ckpt, "-o", str(tmp_path / "cli.tar"), "--tar", key=tenant.key, base_url=live_server.url)
    assert tar.returncode == 0, tar.stderr
    assert tar.stdout.strip() == str(tmp_path / "cli.tar")
    assert (tmp_path / "cli.tar").read_bytes() == tar_of(FILES)
    foreign = lab_cli("checkpoints", "download", ckpt, "-o", str(tmp_path / "x"), key=outsider.key, base_url=live_server.url)
    assert foreign.returncode == 1
    assert "(not_found)" in foreign.stderr
    assert not (tmp_path / "x").exists()
    busy = lab_cli("checkpoints", "download", ckpt, "-o", str(tmp_path / "cli.tar"), key=tenant.key, base_url=live_server.url)
    assert busy.returncode == 2
    assert "must be an empty directory" in busy.stderr
