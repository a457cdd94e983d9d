"""Starting a job from another job's checkpoint (``init_from``): weights only, step 1, fresh
optimizer; a checkpoint that does not fit the job is refused with a clear message (exit 2)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import safetensors.torch
import torch

from engine import checkpoint_archives as archives
from engine import checkpoints as ckpt
from engine.colocated import InProcessRollouts
from engine.config import EngineConfig
from engine.models import tiny_random_llama
from engine.reporter import OfflineTransport, Reporter
from engine.trainer import Trainer
from tests.engine.conftest import REPO_ROOT, engine_config, tiny_spec, write_spec


def config(**overrides) -> EngineConfig:
    spec = tiny_spec(max_steps=2, seed=1, checkpoints={"interval": 2, "keep_last": 1}, eval={})
    return engine_config({**spec, **overrides}, micro_batch_rollouts=4)


def trainer_for(workdir: pathlib.Path, cfg: EngineConfig) -> tuple[Trainer, Reporter]:
    reporter = Reporter(OfflineTransport(workdir), job_id="job_1", attempt=1, spool_dir=workdir / "spool", heartbeat_interval=60)
    reporter.start()
    trainer = Trainer(config=cfg, workdir=workdir, reporter=reporter, rollouts=InProcessRollouts())
    trainer.setup()
    return trainer, reporter


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> pathlib.Path:
    """A LoRA checkpoint directory after 2 steps of the tiny model."""
    workdir = tmp_path_factory.mktemp("source")
    trainer, reporter = trainer_for(workdir, config())
    torch.set_num_threads(1)
    assert trainer.run() == "succeeded"
    reporter.close("succeeded", timeout=10)
    return workdir / "checkpoints" / ckpt.checkpoint_name(2)


def adapter(directory: pathlib.Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(directory / "adapter_model.safetensors"))


def test_it_loads_the_weights_only_and_starts_at_step_one(trained, tmp_path):
    trainer, reporter = trainer_for(tmp_path, config(seed=7, learning_rate=1e-3))
    trainer.initialize_from(trained)
    reporter.close("succeeded", timeout=10)
    assert trainer.start_step == 1
    assert trainer.pending_batches == []
    assert trainer.optimizer.state_dict()["state"] == {}
    source = adapter(trained)
    loaded = {name: tensor.detach() for name, tensor in trainer.model.state_dict().items() if "lora_" in name}
    assert len(source) == len(loaded) > 0
    lora_b = [name for name in source if "lora_B" in name]
    # A fresh LoRA starts with B = 0; the trained source has moved away from it.
    assert max(source[name].abs().max().item() for name in lora_b) > 1e-3
    for name, tensor in source.items():
        matches = [key for key in loaded if key.replace(".default", "") == name]
        assert len(matches) == 1, name
        assert torch.equal(loaded[matches[0]], tensor), name


def test_resume_still_restores_step_and_optimizer(trained, tmp_path):
    trainer, reporter = trainer_for(tmp_path, config())
    trainer.resume(trained)
    reporter.close("succeeded", timeout=10)
    assert trainer.start_step == 3
    assert trainer.optimizer.state_dict()["state"] != {}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lora_rank": 0}, "needs a job that trains LoRA"),
        ({"lora_rank": 8, "lora_alpha": 16}, "do not fit the model"),
    ],
)
def test_it_refuses_a_checkpoint_that_does_not_fit(trained, tmp_path, overrides, message):
    trainer, reporter = trainer_for(tmp_path, config(**overrides))
    with pytest.raises(ValueError, match=message):
        trainer.initialize_from(trained)
    reporter.close("failed", timeout=10)


def test_it_refuses_an_adapter_of_another_base_model(trained, tmp_path):
    other = tmp_path / "other-base"
    archives.extract_tar(_tar(trained, tmp_path / "a.tar"), other)
    adapter_config = json.loads((other / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    (other / "adapter_config.json").write_text(json.dumps(adapter_config))
    trainer, reporter = trainer_for(tmp_path / "work", config())
    with pytest.raises(ValueError, match="adapter for HuggingFaceTB/SmolLM2-135M-Instruct, not for lab/tiny-random-llama"):
        trainer.initialize_from(other)
    reporter.close("failed", timeout=10)


def _tar(directory: pathlib.Path, archive: pathlib.Path) -> pathlib.Path:
    archives.write_tar(directory, archive)
    return archive


def _engine(tmp_path: pathlib.Path, *extra: str, **spec_overrides) -> subprocess.CompletedProcess:
    spec = write_spec(tmp_path / "spec.json", **spec_overrides)
    env = {**os.environ, "LAB_ENGINE_THREADS": "1", "LAB_ENGINE_OVERLAP": "0"}
    return subprocess.run(
        [sys.executable, "-m", "engine", "run", "--spec", str(spec), "--job-id", "job_1", "--attempt", "1",
         "--workdir", str(tmp_path / "work"), "--offline", *extra],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


def test_the_cli_starts_from_a_tar_given_with_init_from(trained, tmp_path):
    archive = _tar(trained, tmp_path / "source.tar")
    result = _engine(tmp_path, "--init-from", str(archive), max_steps=1)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"initialised from {tmp_path / 'work' / 'init' / 'source'} (its step 2); training starts at step 1" in result.stderr
    steps = [json.loads(line)["step"] for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]


def test_the_cli_exits_2_when_an_offline_run_names_a_checkpoint_id(tmp_path):
    result = _engine(tmp_path, init_from="ckpt_abc")
    assert result.returncode == 2
    assert "init_from ckpt_abc: cannot fetch it: an offline run cannot fetch checkpoint ckpt_abc" in result.stderr


def test_the_cli_exits_2_for_a_missing_init_path(tmp_path):
    result = _engine(tmp_path, "--init-from", str(tmp_path / "nowhere.tar"))
    assert result.returncode == 2
    assert f"--init-from {tmp_path / 'nowhere.tar'} does not exist" in result.stderr


def test_the_cli_exits_2_when_an_offline_run_resumes_from_a_checkpoint_id(tmp_path):
    result = _engine(tmp_path, "--resume-from", "ckpt_abc")
    assert result.returncode == 2
    assert "--resume-from ckpt_abc: cannot fetch it: an offline run cannot fetch checkpoint ckpt_abc" in result.stderr


def test_full_weights_seed_a_full_fine_tuning_job_and_refuse_a_lora_one(tmp_path):
    source_dir = tmp_path / "full-source"
    trainer, reporter = trainer_for(source_dir, config(lora_rank=0, max_steps=1, checkpoints={"interval": 1, "keep_last": 1}))
    assert trainer.run() == "succeeded"
    reporter.close("succeeded", timeout=10)
    trained_full = source_dir / "checkpoints" / ckpt.checkpoint_name(1)
    weights = safetensors.torch.load_file(str(trained_full / "model.safetensors"))
    fresh = tiny_random_llama()[0].state_dict()
    assert weights and any(not torch.equal(fresh[name], tensor) for name, tensor in weights.items())

    follower, reporter = trainer_for(tmp_path / "full-follower", config(lora_rank=0, seed=5))
    follower.initialize_from(trained_full)
    reporter.close("succeeded", timeout=10)
    state = follower.model.state_dict()
    assert follower.start_step == 1
    assert all(torch.equal(state[name], tensor) for name, tensor in weights.items())

    lora, reporter = trainer_for(tmp_path / "lora-follower", config())
    with pytest.raises(ValueError, match="checkpoint format hf-full needs a job that trains full weights"):
        lora.initialize_from(trained_full)
    reporter.close("failed", timeout=10)
