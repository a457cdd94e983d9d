"""The SDK's ``lab.datasets`` and the CLI's ``lab datasets`` against the real API on a live HTTP server."""

from __future__ import annotations

import tarfile

import pytest
from labsdk import BadRequestError, Lab, NotFoundError

from environments.models import DatasetSnapshot
from lab import storage
from tests.support.cli import lab_cli

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = '{"question": "1+1", "answer": "2"}\n{"question": "2+3", "answer": "5"}\n'


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def test_the_sdk_pushes_a_folder_lists_gets_and_deletes_and_an_outsider_sees_nothing(live_server, owner, outsider, tmp_path):
    folder = tmp_path / "arith"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "train-00000.jsonl").write_text(ROWS)
    (folder / "test.jsonl").write_text(ROWS.splitlines()[0] + "\n")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    pushed = lab.datasets.push("acme/arith", folder)
    assert (pushed.id, pushed.filename, [item["path"] for item in pushed.files]) == (
        "acme/arith", "arith.tar", ["data/train-00000.jsonl", "test.jsonl"],
    )
    snapshot = DatasetSnapshot.objects.unscoped().get()
    with storage.open_object(snapshot.storage_key) as handle, tarfile.open(fileobj=handle) as archive:
        assert archive.extractfile("data/train-00000.jsonl").read().decode() == ROWS
    assert [item.id for item in lab.datasets.list()] == ["acme/arith"]
    assert lab.datasets.get("acme/arith").sha256 == snapshot.sha256

    stranger = Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0)
    with pytest.raises(NotFoundError):
        stranger.datasets.get("acme/arith")
    with pytest.raises(NotFoundError):
        stranger.datasets.delete("acme/arith")
    assert stranger.datasets.list() == []

    bad = tmp_path / "train.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(BadRequestError, match="The data file 'train.jsonl' cannot be read: line 1 is not JSON"):
        lab.datasets.push("acme/arith", bad)
    with pytest.raises(ValueError, match="holds no file"):
        (tmp_path / "empty").mkdir()
        lab.datasets.push("acme/arith", tmp_path / "empty")
    lab.datasets.delete("acme/arith")
    assert lab.datasets.list() == []


def test_the_cli_pushes_a_file_and_says_what_is_wrong_with_a_bad_name(live_server, owner, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(ROWS)
    pushed = lab_cli("datasets", "push", "acme/arith", str(data), key=owner.key, base_url=live_server.url)
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.strip() == "acme/arith: 1 file (train.jsonl)"
    listed = lab_cli("datasets", key=owner.key, base_url=live_server.url)
    assert "acme/arith" in listed.stdout, listed.stdout
    refused = lab_cli("datasets", "push", "arith", str(data), key=owner.key, base_url=live_server.url)
    assert refused.returncode != 0
    assert "'arith' is not a dataset name" in refused.stderr, refused.stderr
