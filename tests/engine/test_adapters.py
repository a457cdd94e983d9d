"""Adapter artifacts in the engine (engine/checkpoints.py, engine/reporter.py): when one is due,
what it holds (the weights alone, loadable with peft, no trainer state), and the reporter's
adapters lane."""

from __future__ import annotations

import json
import tarfile
from types import SimpleNamespace

import peft
import pytest
import torch

from engine import checkpoint_archives as archives
from engine import checkpoints as ckpt
from engine.models import tiny_random_llama
from engine.reporter import OfflineTransport, Reporter
from tests.support.tiny_lora import tiny_lora

TINY = "lab/tiny-random-llama"


@pytest.mark.parametrize(
    ("adapters", "due"),
    [
        (None, []),  # no [adapters]: none
        (SimpleNamespace(interval=None, keep_last=None), [6]),  # interval absent: only at the end
        (SimpleNamespace(interval=0, keep_last=None), [6]),
        (SimpleNamespace(interval=2, keep_last=None), [2, 4, 6]),
        (SimpleNamespace(interval=4, keep_last=None), [4, 6]),  # and always the last step
    ],
)
def test_an_adapter_is_due_every_interval_and_at_the_end(adapters, due):
    assert [step for step in range(1, 7) if ckpt.adapter_due(adapters, step, 6)] == due


def lora_model():
    return tiny_lora(0.02)


def test_a_lora_adapter_holds_the_adapter_alone_and_loads_with_peft(tmp_path):
    model, tokenizer = lora_model()
    directory = ckpt.save_adapter(tmp_path / "adapters" / "step-000003", model=model, tokenizer=tokenizer, card="# card")
    archive = tmp_path / "adapters" / "step-000003.tar"
    size, digest = archives.write_tar(directory, archive)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= names
    assert not any(name.startswith(archives.STATE_DIR) or name.endswith((".pt", ".bin")) for name in names)
    assert json.loads((directory / "adapter_config.json").read_text())["base_model_name_or_path"] == TINY
    assert (size, digest) == (archive.stat().st_size, archives.sha256_file(archive))

    base, _ = tiny_random_llama()
    loaded = peft.PeftModel.from_pretrained(base, str(directory))
    expected = {name: p for name, p in model.named_parameters() if "lora_" in name}
    got = {name.replace(".default", ""): p for name, p in loaded.named_parameters() if "lora_" in name}
    assert got.keys() == {name.replace(".default", "") for name in expected}
    for name, parameter in expected.items():
        assert torch.equal(got[name.replace(".default", "")], parameter)


def test_a_full_fine_tune_exports_hugging_face_weights_without_trainer_state(tmp_path):
    model, tokenizer = tiny_random_llama()
    directory = ckpt.save_adapter(tmp_path / "step-000001", model=model, tokenizer=tokenizer)
    assert (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()
    assert not (directory / archives.STATE_DIR).exists()
    assert not (directory / "adapter_config.json").exists()


def test_the_reporter_registers_uploads_and_completes_adapters_in_their_own_lane(tmp_path):
    model, tokenizer = lora_model()
    root = tmp_path / "work" / ckpt.ADAPTER_ROOT
    directory = ckpt.save_adapter(root / "step-000002", model=model, tokenizer=tokenizer)
    archive = root / "step-000002.tar"
    size, digest = archives.write_tar(directory, archive)
    reporter = Reporter(OfflineTransport(tmp_path / "lab"), job_id="job_1", attempt=1, spool_dir=tmp_path / "spool",
                        heartbeat_interval=0.2, backoff_base=0.05)
    reporter.start()
    reporter.adapter(2, ckpt.FORMAT_LORA, archive, size, digest)
    assert reporter.close("succeeded", timeout=10)
    assert reporter.pending_archives(adapters=True) == set() and reporter.dropped["adapters"] == 0
    rows = [json.loads(line) for line in (tmp_path / "lab" / "adapters.jsonl").read_text().splitlines()]
    assert rows == [{
        "id": "adp_offline000002", "step": 2, "attempt": 1, "format": "peft-lora", "status": "ready",
        "path": str(tmp_path / "lab" / "adapter-archives" / "step-000002.tar"), "size_bytes": size, "sha256": digest,
    }]
    assert archives.sha256_file(tmp_path / "lab" / "adapter-archives" / "step-000002.tar") == digest
    assert not (tmp_path / "lab" / "checkpoints.jsonl").exists()


def test_pruning_keeps_only_the_archives_lab_has_not_settled(tmp_path):
    root = tmp_path / "adapters"
    for step in (1, 2):
        (root / f"step-00000{step}").mkdir(parents=True)
        (root / f"step-00000{step}.tar").write_bytes(b"tar")
    deleted = ckpt.prune_adapters(root, keep={root / "step-000002.tar"})
    assert sorted(path.name for path in deleted) == ["step-000001", "step-000001.tar", "step-000002"]
    assert [path.name for path in root.iterdir()] == ["step-000002.tar"]


def test_an_offline_run_exports_an_adapter_every_interval_and_keeps_only_unsettled_local_copies(tmp_path):
    from tests.engine.conftest import write_spec
    from tests.support.engine_cli import engine, finish

    spec = write_spec(tmp_path / "spec.json", adapters={"interval": 2}, checkpoints={"interval": 0, "keep_last": 1})
    code, _, stderr = finish(engine(["--spec", str(spec)], tmp_path))
    assert code == 0, stderr
    work = tmp_path / "work"
    rows = [json.loads(line) for line in (work / "adapters.jsonl").read_text().splitlines()]
    assert [(row["step"], row["format"], row["status"]) for row in rows] == [(2, "peft-lora", "ready"), (3, "peft-lora", "ready")]
    for row in rows:
        with tarfile.open(row["path"]) as tar:
            names = set(tar.getnames())
        assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= names
        assert not any(name.startswith(archives.STATE_DIR) for name in names)
        assert archives.sha256_file(row["path"]) == row["sha256"]
    # The trainer's own adapters/ keeps no unpacked directory; the last archive was still
    # unsettled when it was pruned (earlier ones go once Lab has them).
    local = sorted(p.name for p in (work / ckpt.ADAPTER_ROOT).iterdir())
    assert local[-1] == "step-000003.tar" and all(name.endswith(".tar") for name in local)
