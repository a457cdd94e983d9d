"""Pushed datasets over the REST API (``/datasets``): push a data file or a folder's archive,
replace it, list, get and delete it; refusals for names and files ``load_dataset`` could not use;
another organization's dataset is the 404 a missing one is, and nothing of it changes."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from environments.datasets import copy_snapshots
from environments.models import DatasetSnapshot
from lab import storage
from lab.audit import Actor
from lab.models import AuditLogEntry
from lab.services import api_key_create
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

ROWS = b'{"question": "1+1", "answer": "2"}\n{"question": "2+3", "answer": "5"}\n'


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    """An empty storage per test, so every stored object seen is this test's."""
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "store")},
        },
    }


def push(tenant, name, filename, data, key=None):
    return tenant.client(key).post(
        "/api/v1/datasets",
        {"name": name, "file": SimpleUploadedFile(filename, data, content_type="application/octet-stream")},
        format="multipart",
    )


def tar_of(files: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def stored_members(snapshot: DatasetSnapshot) -> dict[str, bytes]:
    with storage.open_object(snapshot.storage_key) as handle, tarfile.open(fileobj=handle, mode="r:") as archive:
        return {member.name: archive.extractfile(member).read() for member in archive}


def test_it_pushes_a_data_file_and_answers_the_dataset_object(owner):
    response = push(owner, "acme/arith", "train.jsonl", ROWS)
    assert response.status_code == 201, response.content
    snapshot = DatasetSnapshot.objects.unscoped().get()
    assert response.json() == {
        "id": "acme/arith",
        "object": "dataset",
        "owner": "acme",
        "name": "arith",
        "filename": "train.jsonl",
        "files": [{"path": "train.jsonl", "size_bytes": len(ROWS)}],
        "sha256": snapshot.sha256,
        "size_bytes": snapshot.size_bytes,
        "created_at": snapshot.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "updated_at": snapshot.updated_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    assert stored_members(snapshot) == {"train.jsonl": ROWS}
    assert (
        snapshot.storage_key == f"environments/datasets/{owner.organization.public_id}/acme/arith/{snapshot.sha256}.tar"
    )
    assert list(AuditLogEntry.objects.filter(action="dataset.push").values_list("target", flat=True)) == ["acme/arith"]
    assert owner.client().get("/api/v1/datasets/acme/arith").json() == response.json()
    listed = owner.client().get("/api/v1/datasets").json()
    assert (listed["object"], [item["id"] for item in listed["data"]], listed["has_more"]) == (
        "list",
        ["acme/arith"],
        False,
    )
    document = served_document()
    assert_matches(document, "Dataset", response.json())
    assert_matches(document, "DatasetList", listed)


def test_it_pushes_a_folders_archive_leaving_hidden_files_out_and_a_push_again_replaces_it(
    owner, django_capture_on_commit_callbacks
):
    archive = tar_of(
        {
            "data/train-0.jsonl": ROWS,
            "test.csv": b"question,answer\n3+3,6\n",
            "README.md": b"# arith\n",
            ".git/HEAD": b"x",
        }
    )
    first = push(owner, "openai/gsm8k", "gsm8k.tar.gz", archive)
    assert first.status_code == 201, first.content
    old = DatasetSnapshot.objects.unscoped().get()
    assert [item["path"] for item in first.json()["files"]] == ["README.md", "data/train-0.jsonl", "test.csv"]

    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as writer:
        writer.writestr("train.jsonl", ROWS[: ROWS.index(b"\n") + 1])
    with django_capture_on_commit_callbacks(execute=True):
        again = push(owner, "openai/gsm8k", "gsm8k.zip", zipped.getvalue())
    assert again.status_code == 200, again.content
    new = DatasetSnapshot.objects.unscoped().get()
    assert (new.pk, new.filename, new.files) == (
        old.pk,
        "gsm8k.zip",
        [{"path": "train.jsonl", "size_bytes": ROWS.index(b"\n") + 1}],
    )
    assert stored_members(new) == {"train.jsonl": ROWS[: ROWS.index(b"\n") + 1]}
    assert not storage.object_storage().exists(old.storage_key)  # the replaced snapshot's object is gone


@pytest.mark.parametrize(
    ("name", "filename", "data", "param", "says"),
    [
        ("arith", "train.jsonl", ROWS, "name", "'arith' is not a dataset name"),
        ("acme/ari--th", "train.jsonl", ROWS, "name", "is not a dataset name"),
        ("acme/../x", "train.jsonl", ROWS, "name", "is not a dataset name"),
        ("acme/arith", "model.bin", b"\x00\x01", "file", "'model.bin' is neither a data file"),
        (
            "acme/arith",
            "train.jsonl",
            b'{"a": 1}\nnot json\n',
            "file",
            "The data file 'train.jsonl' cannot be read: line 2 is not JSON",
        ),
        ("acme/arith", "train.jsonl", b"[1, 2]\n", "file", "line 1 is not a JSON object"),
        ("acme/arith", "train.csv", b"\xff\xfe\x00bad", "file", "it is not UTF-8 text"),
        ("acme/arith", "train.parquet", b"not parquet at all", "file", "it is not a Parquet file"),
        ("acme/arith", "train.json", b"", "file", "it is empty"),
        ("acme/arith", "data.tar.gz", b"not a tar", "file", "'data.tar.gz' is not a readable tar archive"),
        ("acme/arith", "data.zip", b"PK not a zip", "file", "'data.zip' is not a readable zip archive"),
        (
            "acme/arith",
            "data.tar",
            tar_of({"README.md": b"# none\n"}, "w"),
            "file",
            "holds no data file load_dataset reads",
        ),
        ("acme/arith", "data.tar", tar_of({"../escape.jsonl": ROWS}, "w"), "file", "is outside its folder"),
    ],
)
def test_it_refuses_a_bad_name_or_files_load_dataset_cannot_read_and_stores_nothing(
    owner, name, filename, data, param, says
):
    response = push(owner, name, filename, data)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert says in error["message"], error["message"]
    assert not DatasetSnapshot.objects.unscoped().exists()
    assert list(storage.iter_objects()) == []


def test_it_refuses_a_link_in_the_archive(owner):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        link = tarfile.TarInfo("train.jsonl")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    response = push(owner, "acme/arith", "data.tar", buffer.getvalue())
    assert response.status_code == 400
    assert "is a link or a device" in response.json()["error"]["message"]


def test_it_asks_for_the_file_and_the_name(owner):
    missing_file = owner.client().post("/api/v1/datasets", {"name": "acme/arith"}, format="multipart")
    assert (missing_file.status_code, missing_file.json()["error"]["param"]) == (400, "file")
    missing_name = owner.client().post(
        "/api/v1/datasets",
        {"file": SimpleUploadedFile("train.jsonl", ROWS)},
        format="multipart",
    )
    assert (missing_name.status_code, missing_name.json()["error"]["param"]) == (400, "name")


def test_it_deletes_a_dataset_and_its_object(owner, django_capture_on_commit_callbacks):
    push(owner, "acme/arith", "train.jsonl", ROWS)
    key = DatasetSnapshot.objects.unscoped().get().storage_key
    with django_capture_on_commit_callbacks(execute=True):
        assert owner.client().delete("/api/v1/datasets/acme/arith").status_code == 204
    assert not DatasetSnapshot.objects.unscoped().exists()
    assert not storage.object_storage().exists(key)
    assert owner.client().get("/api/v1/datasets/acme/arith").status_code == 404


def test_another_organizations_dataset_is_a_404_identical_to_a_missing_one_and_stays(owner, outsider):
    push(owner, "acme/arith", "train.jsonl", ROWS)
    missing = outsider.client().get("/api/v1/datasets/acme/nothing")
    for response in (
        outsider.client().get("/api/v1/datasets/acme/arith"),
        outsider.client().delete("/api/v1/datasets/acme/arith"),
    ):
        assert response.status_code == missing.status_code == 404
        assert response.json() == missing.json()
        assert (response.json()["error"]["code"], response.json()["error"]["message"]) == (
            "not_found",
            "No such dataset.",
        )
    assert outsider.client().get("/api/v1/datasets").json()["data"] == []
    # The outsider's own push of the same name is its own dataset; Acme's is unchanged.
    assert push(outsider, "acme/arith", "train.jsonl", ROWS[: ROWS.index(b"\n") + 1]).status_code == 201
    snapshots = {row.organization_id: row for row in DatasetSnapshot.objects.unscoped().all()}
    assert snapshots[owner.organization.pk].files == [{"path": "train.jsonl", "size_bytes": len(ROWS)}]
    assert storage.object_storage().exists(snapshots[owner.organization.pk].storage_key)


def test_a_build_gets_every_snapshot_unpacked_under_owner_and_name_and_goes_on_without_a_vanished_one(owner, outsider, tmp_path):
    push(owner, "acme/arith", "train.jsonl", ROWS)
    push(owner, "openai/gsm8k", "gsm8k.tar", tar_of({"data/test-0.jsonl": ROWS}, "w"))
    push(outsider, "globex/secret", "train.jsonl", ROWS)
    gone = DatasetSnapshot.objects.unscoped().get(owner="openai")
    storage.delete(gone.storage_key)
    kept = DatasetSnapshot.objects.unscoped().get(owner="acme")

    unpacked = copy_snapshots(owner.organization.pk, tmp_path / "datasets")

    assert unpacked == [{"id": "acme/arith", "sha256": kept.sha256}]
    files = sorted(path.relative_to(tmp_path / "datasets").as_posix() for path in (tmp_path / "datasets").rglob("*") if path.is_file())
    assert files == ["acme/arith/train.jsonl"]  # neither the vanished one nor another organization's
    assert (tmp_path / "datasets" / "acme" / "arith" / "train.jsonl").read_bytes() == ROWS


def test_a_read_only_key_lists_and_reads_but_cannot_push_or_delete(owner):
    push(owner, "acme/arith", "train.jsonl", ROWS)
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ro", scopes=["read"])
    assert owner.client(read_key).get("/api/v1/datasets/acme/arith").status_code == 200
    for response in (
        push(owner, "acme/arith", "train.jsonl", ROWS[: ROWS.index(b"\n") + 1], key=read_key),
        owner.client(read_key).delete("/api/v1/datasets/acme/arith"),
    ):
        assert (response.status_code, response.json()["error"]["code"]) == (403, "insufficient_scope")
    assert DatasetSnapshot.objects.unscoped().get().files == [{"path": "train.jsonl", "size_bytes": len(ROWS)}]


def test_an_archive_unpacking_past_the_limit_is_refused_before_its_files_are_read(owner, monkeypatch):
    monkeypatch.setattr("environments.datasets.MAX_UNPACKED_BYTES", len(ROWS) + 10)
    response = push(owner, "acme/arith", "data.tar", tar_of({"train.jsonl": ROWS, "test.jsonl": ROWS}, "w"))
    assert response.status_code == 400
    assert response.json()["error"]["message"] == f"The archive unpacks to more than 10000 files or {(len(ROWS) + 10) // 2**20} MB."
    assert not DatasetSnapshot.objects.unscoped().exists()
