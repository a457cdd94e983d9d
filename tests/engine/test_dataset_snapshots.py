"""``engine.dataset_snapshots``: the organization's pushed datasets unpacked where the bridge
starts, each checked against its SHA-256, and nothing unpacked outside its folder."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from engine.dataset_snapshots import unpack_snapshots
from engine.environments.base import InvalidEnvironment


def tar_bytes(files: dict[str, bytes], *, link: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo("escape")
            info.type, info.linkname = tarfile.SYMTYPE, link
            archive.addfile(info)
    return buffer.getvalue()


def reader(blobs: dict[str, bytes]):
    return lambda url: iter([blobs[url]])


def test_it_unpacks_each_snapshot_under_owner_and_name(tmp_path):
    first, second = tar_bytes({"train.jsonl": b'{"a": 1}\n'}), tar_bytes({"data/test-0.jsonl": b'{"a": 2}\n'})
    snapshots = [
        {"id": "acme/arith", "sha256": hashlib.sha256(first).hexdigest(), "url": "u1"},
        {"id": "openai/gsm8k", "sha256": hashlib.sha256(second).hexdigest(), "url": "u2"},
    ]
    root = unpack_snapshots(snapshots, tmp_path, reader({"u1": first, "u2": second}), package_id="acme/env@1")
    assert root == tmp_path / "environments" / "datasets"
    assert sorted(path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()) == [
        "acme/arith/train.jsonl", "openai/gsm8k/data/test-0.jsonl",
    ]


def test_without_snapshots_the_folder_exists_and_is_empty(tmp_path):
    root = unpack_snapshots([], tmp_path, reader({}), package_id="acme/env@1")
    assert root.is_dir() and list(root.iterdir()) == []


def test_it_refuses_a_snapshot_whose_bytes_are_not_the_pushed_ones_and_unpacks_nothing(tmp_path):
    data = tar_bytes({"train.jsonl": b"{}\n"})
    with pytest.raises(InvalidEnvironment, match="the fetched dataset acme/arith's SHA-256 is not the pushed one's"):
        unpack_snapshots([{"id": "acme/arith", "sha256": "0" * 64, "url": "u"}], tmp_path, reader({"u": data}), package_id="acme/env@1")
    assert list((tmp_path / "environments" / "datasets").iterdir()) == []


def test_it_refuses_a_link_out_of_its_folder(tmp_path):
    data = tar_bytes({"train.jsonl": b"{}\n"}, link="/etc/passwd")
    snapshot = {"id": "acme/arith", "sha256": hashlib.sha256(data).hexdigest(), "url": "u"}
    with pytest.raises(InvalidEnvironment, match="cannot fetch or unpack the dataset acme/arith"):
        unpack_snapshots([snapshot], tmp_path, reader({"u": data}), package_id="acme/env@1")
    assert not (tmp_path / "environments" / "datasets" / "acme" / "arith" / "escape").exists()


@pytest.mark.parametrize("dataset_id", ["arith", "acme/../x", "../arith", None])
def test_it_refuses_a_name_that_is_not_owner_and_name(tmp_path, dataset_id):
    with pytest.raises(InvalidEnvironment, match="package acme/env@1"):
        unpack_snapshots([{"id": dataset_id, "sha256": "0" * 64, "url": "u"}], tmp_path, reader({}), package_id="acme/env@1")
