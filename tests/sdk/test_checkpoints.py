"""``lab.checkpoints.download(extract=True)`` edge cases against the fake Lab: a body that is not
a tar, and a broken-off download, leave nothing behind; a redirected one unpacks too."""

from __future__ import annotations

import io
import tarfile

import pytest
from labsdk.errors import APIConnectionError, APIError


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_it_unpacks_a_redirected_download(fake_lab, lab_client, tmp_path):
    fake_lab.archives["ckpt_1"] = tar_of({"adapter_config.json": b"{}", "trainer_state/state.json": b'{"step": 1}'})
    fake_lab.redirect_downloads = True
    target = lab_client.checkpoints.download("ckpt_1", tmp_path / "adapter", progress=False)
    assert (target / "adapter_config.json").read_bytes() == b"{}"
    assert (target / "trainer_state" / "state.json").read_bytes() == b'{"step": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]


def test_a_body_that_is_not_a_tar_is_an_error_and_leaves_nothing(fake_lab, lab_client, tmp_path):
    fake_lab.archives["ckpt_1"] = b"<html>not a tar</html>" * 100
    with pytest.raises(APIError, match="cannot unpack the downloaded archive"):
        lab_client.checkpoints.download("ckpt_1", tmp_path / "adapter", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_member_escaping_the_directory_is_refused(fake_lab, lab_client, tmp_path):
    fake_lab.archives["ckpt_1"] = tar_of({"../escaped.txt": b"x"})
    with pytest.raises(APIError, match="outside the destination"):
        lab_client.checkpoints.download("ckpt_1", tmp_path / "out" / "adapter", progress=False)
    assert not (tmp_path / "out" / "escaped.txt").exists()
    assert list((tmp_path / "out").iterdir()) == []


def test_a_broken_off_download_leaves_nothing(fake_lab, lab_client, tmp_path):
    fake_lab.archives["ckpt_1"] = tar_of({"a": b"x" * 10_000})
    fake_lab.truncate_downloads = True
    with pytest.raises(APIConnectionError, match="broke off"):
        lab_client.checkpoints.download("ckpt_1", tmp_path / "adapter", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_empty_directory_receives_the_files(fake_lab, lab_client, tmp_path):
    fake_lab.archives["ckpt_1"] = tar_of({"a.json": b"1"})
    (tmp_path / "adapter").mkdir()
    target = lab_client.checkpoints.download("ckpt_1", tmp_path / "adapter", progress=False)
    assert [p.name for p in target.iterdir()] == ["a.json"]
