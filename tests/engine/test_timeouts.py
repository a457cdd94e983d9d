"""[[env]] timeout in the trainer: a timed-out rollout (`Completion.timed_out`) is out of its
group's advantages and of the loss, and each step reports `is_timeout/mean`. The timeouts
themselves are caused for real in tests/environments/test_verifiers_multi_turn.py."""

from __future__ import annotations

import pytest

from tests.engine.conftest import tiny_spec
from tests.support.engine import trainer_for


def test_timed_out_rollouts_leave_the_advantages_and_the_loss_and_the_step_counts_them(tmp_path):
    spec = tiny_spec(max_steps=1, rollouts_per_example=2, batch_size=8, pre_batch_filters=[],
                     sampling={"max_tokens": 6, "temperature": 1.0},
                     env=[{"id": "lab/reverse-text", "timeout": 30}])
    trainer, _ = trainer_for(tmp_path / "a", spec)
    batch = trainer.rollouts.orchestrator.generate_batch(1, 0)
    batch.rewards[:] = [1.0, 0.0, 0.0, 1.0, 0.5, 0.25, 0.0, 0.75]
    for row in (1, 4, 5):  # as an episode past its deadline comes back: reward 0, flagged
        batch.completions[row].timed_out = True
        batch.rewards[row] = 0.0

    advantages, keep, filters = trainer._filtered_advantages(batch)
    assert keep == [True, False, True, True, False, False, True, True] and filters == {}
    # Group 0 keeps one rollout (advantage 0); group 2 none; groups 1 and 3 as if alone.
    assert advantages.tolist() == pytest.approx([0.0, 0.0, -1.0, 1.0, 0.0, 0.0, -1.0, 1.0], abs=1e-3)
    assert trainer._step_metrics(batch, advantages)["is_timeout/mean"] == 3 / 8

    for row in (1, 4, 5):
        batch.completions[row].timed_out = False
    assert trainer._step_metrics(batch, advantages)["is_timeout/mean"] == 0.0  # a job with a timeout always reports it
    plain, _ = trainer_for(tmp_path / "b", tiny_spec(max_steps=1))
    assert "is_timeout/mean" not in plain._step_metrics(batch, advantages)
