"""Resuming from a checkpoint reproduces an uninterrupted run's metrics (same seed, CPU)."""

import pytest

from tests.engine.conftest import engine_config, tiny_spec
from tests.support.engine import train


def config(max_steps, overlap, **spec_overrides):
    spec = tiny_spec(max_steps=max_steps, seed=1, checkpoints={"interval": 2, "keep_last": 3}, eval={}, **spec_overrides)
    return engine_config(spec, overlap=overlap, micro_batch_rollouts=4)


@pytest.mark.parametrize("overlap", [False, True], ids=["synchronous", "overlap"])
def test_it_resumes_to_the_same_metrics_as_an_uninterrupted_run(tmp_path, overlap):
    uninterrupted = train(tmp_path / "a", config(4, overlap))
    first_half = train(tmp_path / "b", config(4, overlap), stop_after=2)
    resumed = train(tmp_path / "c", config(4, overlap), resume_from=tmp_path / "b" / "checkpoints" / "step-000002")
    assert first_half == {step: uninterrupted[step] for step in (1, 2)}
    assert resumed == {step: uninterrupted[step] for step in (3, 4)}
    assert any(values["loss/mean"] != 0.0 for values in uninterrupted.values())  # it did train
    lags = {step: (values["off_policy/steps_mean"], values["off_policy/steps_max"]) for step, values in uninterrupted.items()}
    assert lags == ({1: (0.0, 0.0), 2: (1.0, 1.0), 3: (1.0, 1.0), 4: (1.0, 1.0)} if overlap else {s: (0.0, 0.0) for s in (1, 2, 3, 4)})
    if overlap:
        assert all(values["mismatch_kl/mean"] > 0 for step, values in uninterrupted.items() if step > 1 and "mismatch_kl/mean" in values)


def test_two_steps_off_policy_resumes_exactly_and_never_lags_more_than_two(tmp_path):
    """max_off_policy_steps = 2: two future batches are sampled ahead; the checkpoint holds both."""
    settings = {"max_off_policy_steps": 2}
    uninterrupted = train(tmp_path / "a", config(5, True, **settings))
    train(tmp_path / "b", config(5, True, **settings), stop_after=2)
    resumed = train(tmp_path / "c", config(5, True, **settings), resume_from=tmp_path / "b" / "checkpoints" / "step-000002")
    assert resumed == {step: uninterrupted[step] for step in (3, 4, 5)}
    # While step n trains, steps up to n + 2 are sampled by the policy of n - 1 updates.
    lags = {step: (values["off_policy/steps_mean"], values["off_policy/steps_max"]) for step, values in uninterrupted.items()}
    assert lags == {1: (0.0, 0.0), 2: (1.0, 1.0), 3: (2.0, 2.0), 4: (2.0, 2.0), 5: (2.0, 2.0)}


def test_max_inflight_rollouts_bounds_how_far_ahead_it_samples(tmp_path):
    """Two steps allowed off policy, but room for one batch in flight: one step ahead only."""
    metrics = train(tmp_path / "a", config(3, True, max_off_policy_steps=2, max_inflight_rollouts=8))
    assert [metrics[step]["off_policy/steps_max"] for step in (1, 2, 3)] == [0.0, 1.0, 1.0]
