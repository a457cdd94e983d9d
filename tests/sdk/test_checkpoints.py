"""``lab.checkpoints.download(extract=True)`` edge cases against the fake Lab: a body that is not
a tar, and a broken-off download, leave nothing behind; a redirected one unpacks too."""

from __future__ import annotations

import hashlib

import pytest
from labsdk.errors import APIConnectionError, APIError

from tests.support.tars import tar_of


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


@pytest.mark.parametrize("redirected", [False, True])
def test_an_archive_that_differs_from_the_sha256_lab_announces_is_refused_and_leaves_nothing(
    fake_lab, lab_client, tmp_path, redirected
):
    fake_lab.archives["ckpt_1"] = tar_of({"a.json": b"changed in storage"})
    fake_lab.digests["ckpt_1"] = hashlib.sha256(tar_of({"a.json": b"what Lab verified"})).hexdigest()
    fake_lab.redirect_downloads = redirected
    for target, extract in ((tmp_path / "adapter", True), (tmp_path / "ckpt.tar", False)):
        with pytest.raises(APIError) as refused:
            lab_client.checkpoints.download("ckpt_1", target, extract=extract, progress=False)
        found = hashlib.sha256(fake_lab.archives["ckpt_1"]).hexdigest()
        assert str(refused.value) == (
            f"the archive downloaded from checkpoints/ckpt_1/download has SHA-256 {found}, "
            f"not the {fake_lab.digests['ckpt_1']} Lab recorded"
        )
    assert list(tmp_path.iterdir()) == []


def test_an_archive_with_the_announced_sha256_is_kept(fake_lab, lab_client, tmp_path):
    fake_lab.archives["ckpt_1"] = tar_of({"a.json": b"1"})
    fake_lab.digests["ckpt_1"] = hashlib.sha256(fake_lab.archives["ckpt_1"]).hexdigest()
    fake_lab.redirect_downloads = True
    saved = lab_client.checkpoints.download("ckpt_1", tmp_path / "ckpt.tar", extract=False, progress=False)
    assert saved.read_bytes() == fake_lab.archives["ckpt_1"]
