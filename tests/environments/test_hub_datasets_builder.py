"""The builder's side of Hub datasets, without a build: the environment loading runs in (offline,
or the Hub with the host's proxies but never for the loopback) and packing the Hugging Face caches."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from environments.builder import hub_datasets
from environments.builder.build import loading_environment
from environments.builder.steps import BuildFailed, BuildRequest

HOST = {"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "corp.example", "SSL_CERT_FILE": "/etc/corp.pem",
        "LAB_SECRET_KEY": "s3cret", "OPENAI_API_KEY": "sk-x", "HF_TOKEN": "hf_x"}


def _request(tmp_path: Path, **changes) -> BuildRequest:
    return BuildRequest(wheel=tmp_path / "x.whl", index_url="file:///i", exclude_newer="2026-01-01T00:00:00Z",
                        wheelhouse=tmp_path / "wheelhouse", workdir=tmp_path / "work", **changes)


def test_it_loads_offline_without_an_endpoint_and_takes_nothing_of_the_host(tmp_path):
    environment = loading_environment(_request(tmp_path), tmp_path / "probe", HOST)
    assert {name: environment[name] for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")} == dict.fromkeys(
        ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"), "1"
    )
    assert environment["HF_HOME"] == str(tmp_path / "work" / "hf")
    assert not {"HF_ENDPOINT", *HOST} & set(environment)


def test_it_reaches_the_hub_through_the_hosts_proxy_but_never_the_loopback(tmp_path):
    environment = loading_environment(_request(tmp_path, hf_endpoint="https://hub.example"), tmp_path / "probe", HOST)
    assert environment["HF_ENDPOINT"] == "https://hub.example"
    assert not {"HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"} & set(environment)
    assert (environment["HTTPS_PROXY"], environment["SSL_CERT_FILE"]) == ("http://proxy.corp:3128", "/etc/corp.pem")
    assert environment["NO_PROXY"] == environment["no_proxy"] == "corp.example,127.0.0.1,localhost"
    assert not {"LAB_SECRET_KEY", "OPENAI_API_KEY", "HF_TOKEN"} & set(environment)


def _caches(home: Path) -> Path:
    blob = home / "hub" / "datasets--someorg--tiny-math" / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_text('{"question": "q", "answer": "a"}\n' * 10)
    snapshot = home / "hub" / "datasets--someorg--tiny-math" / "snapshots" / "c0ffee" / "data"
    snapshot.mkdir(parents=True)
    (snapshot / "train.jsonl").symlink_to("../../../blobs/abc")
    (home / "hub" / ".locks" / "datasets--someorg--tiny-math").mkdir(parents=True)
    (home / "hub" / ".locks" / "datasets--someorg--tiny-math" / "abc.lock").touch()
    table = home / "datasets" / "someorg___tiny-math" / "default" / "0.0.0" / "c0ffee"
    table.mkdir(parents=True)
    (table / "tiny-math-train.arrow").write_bytes(b"arrow" * 20)
    (table.parent / "c0ffee_builder.lock").touch()
    (home / "token").write_text("hf_not_packed")
    return home


def test_it_packs_both_caches_links_as_links_and_leaves_out_locks_and_the_rest(tmp_path):
    home = _caches(tmp_path / "hf")
    packed = hub_datasets.pack(home, tmp_path / "out.tar", max_bytes=10_000)
    assert packed["repositories"] == ["someorg/tiny-math"]
    assert (packed["files"], packed["size_bytes"]) == (2, (tmp_path / "out.tar").stat().st_size)
    with tarfile.open(tmp_path / "out.tar") as archive:
        members = {member.name: member for member in archive.getmembers()}
    assert members["hub/datasets--someorg--tiny-math/snapshots/c0ffee/data/train.jsonl"].linkname == "../../../blobs/abc"
    assert not [name for name in members if name.endswith(".lock") or ".locks" in name or name == "token"]


def test_it_refuses_more_than_the_limit_naming_it_and_packs_nothing_when_nothing_was_fetched(tmp_path):
    home = _caches(tmp_path / "hf")
    with pytest.raises(BuildFailed) as refused:
        hub_datasets.pack(home, tmp_path / "out.tar", max_bytes=100)
    assert str(refused.value).startswith("loading it fetched 0.0 MB of Hugging Face datasets (someorg/tiny-math), more than builds keep (0.0 MB, ")
    assert not (tmp_path / "out.tar").exists()
    assert hub_datasets.pack(tmp_path / "empty", tmp_path / "none.tar", max_bytes=100) is None
