"""Mixing training environments by `[[env]] ratio` (engine.orchestrator.environment_index)."""

from engine.orchestrator import block_names, environment_index
from tests.engine.conftest import engine_config, tiny_spec
from tests.engine.test_resume import train


def test_without_ratios_the_environments_take_turns():
    assert [environment_index(i, None, count=3, seed=0) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_ratios_give_each_environment_its_share_and_the_same_draws_every_time():
    draws = [environment_index(i, [3.0, 1.0], count=2, seed=7) for i in range(8000)]
    assert abs(draws.count(0) / len(draws) - 0.75) < 0.02
    assert draws == [environment_index(i, [3.0, 1.0], count=2, seed=7) for i in range(8000)]  # deterministic
    assert draws != [environment_index(i, [3.0, 1.0], count=2, seed=8) for i in range(8000)]  # seeded


def test_a_job_samples_its_environments_by_ratio(tmp_path):
    envs = [{"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 4}, "ratio": 1.0},
            {"id": "lab/addition", "ratio": 1e-9}]
    metrics = train(tmp_path, engine_config(tiny_spec(max_steps=2, env=envs, eval={}), micro_batch_rollouts=4))
    names = {name for values in metrics.values() for name in values}
    assert "reward/reverse-text/mean" in names and "reward/addition/mean" not in names
    turns = train(tmp_path / "turns", engine_config(tiny_spec(max_steps=1, env=[{k: v for k, v in e.items() if k != "ratio"} for e in envs],
                                                               eval={}), micro_batch_rollouts=4))
    assert {"reward/reverse-text/mean", "reward/addition/mean"} <= set(turns[1])  # without ratios: one group each


def test_blocks_report_under_their_names_and_two_of_one_environment_apart():
    assert block_names(["addition", "addition", "rev", "addition"]) == ["addition", "addition_2", "rev", "addition_3"]


def test_a_job_reports_each_env_block_under_its_name(tmp_path):
    envs = [{"id": "lab/addition", "args": {"max_operand": 3}, "name": "small"},
            {"id": "lab/addition", "args": {"max_operand": 99}, "name": "large"},
            {"id": "lab/addition"}, {"id": "lab/addition"}]
    metrics = train(tmp_path, engine_config(tiny_spec(max_steps=1, batch_size=16, env=envs, eval={}), micro_batch_rollouts=4))
    rewards = {name for name in metrics[1] if name.startswith("reward/") and name.endswith("/mean") and name.count("/") == 2}
    assert rewards == {"reward/small/mean", "reward/large/mean", "reward/addition/mean", "reward/addition_2/mean"}
