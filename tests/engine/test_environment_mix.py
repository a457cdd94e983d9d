"""Mixing training environments by `[[env]] ratio` (engine.orchestrator.environment_index)."""

import json

from engine.orchestrator import block_names, environment_index
from tests.engine.conftest import engine_config, tiny_spec
from tests.support.engine import train


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


def test_blocks_of_different_group_sizes_train_together_each_group_of_its_own_size(tmp_path):
    envs = [{"id": "lab/addition", "group_size": 2, "name": "pairs"},
            {"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 4}, "group_size": 4, "name": "fours"}]
    config = engine_config(tiny_spec(max_steps=3, batch_size=8, seed=3, env=envs, eval={}), micro_batch_rollouts=4, samples_per_step=8)
    metrics = train(tmp_path, config)
    # in turn: 2 + 4 + 2 rollouts at step 1, 4 + 2 + 2 after (the 4-block's turn does not fit the last 2)
    for step in (1, 2, 3):
        assert {name: metrics[step][name] for name in metrics[step] if name.startswith("batch/")} == {
            "batch/pairs/groups": 2.0, "batch/pairs/rollouts_per_group": 2.0,
            "batch/fours/groups": 1.0, "batch/fours/rollouts_per_group": 4.0,
        }
        assert {"reward/pairs/mean", "reward/fours/mean", "reward/fours/lcs_ratio/mean"} <= set(metrics[step])
    assert any(values["optim/grad_norm"] > 0.0 for values in metrics.values())  # it did train
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    for step in (1, 2, 3):
        groups = {}
        for sample in (s for s in samples if s["step"] == step):
            groups.setdefault(sample["group"], []).append(sample)
        assert sum(len(rows) for rows in groups.values()) == 8  # batch_size rollouts, every one reported
        for rows in groups.values():
            size = 4 if "Reverse the text" in rows[0]["prompt"] else 2
            assert len(rows) == size and all(row["prompt"] == rows[0]["prompt"] for row in rows)
            assert abs(sum(row["advantage"] for row in rows)) < 1e-4  # normalised within its own group


def test_blocks_of_different_group_sizes_resume_exactly(tmp_path):
    envs = [{"id": "lab/addition", "group_size": 2, "ratio": 1.0},
            {"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 4}, "group_size": 4, "ratio": 1.0}]

    def config():
        spec = tiny_spec(max_steps=4, batch_size=8, seed=1, env=envs, eval={}, checkpoints={"interval": 2, "keep_last": 3})
        return engine_config(spec, micro_batch_rollouts=4)

    uninterrupted = train(tmp_path / "a", config())
    train(tmp_path / "b", config(), stop_after=2)
    resumed = train(tmp_path / "c", config(), resume_from=tmp_path / "b" / "checkpoints" / "step-000002")
    assert resumed == {step: uninterrupted[step] for step in (3, 4)}
    state = json.loads((tmp_path / "b" / "checkpoints" / "step-000002" / "trainer_state" / "state.json").read_text())
    assert state["data_position"] == sum(uninterrupted[step]["batch/addition/groups"] + uninterrupted[step]["batch/reverse-text/groups"]
                                         for step in (1, 2))
