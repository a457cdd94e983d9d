"""The engine's eval, validation, rollout filters and chat-template options on the tiny model."""

import json
import logging
import re

import pytest

from engine.chat_templates import usable_template_kwargs
from engine.environments import load_environment, split_of
from engine.filters import most_repeated_ngram_count
from engine.step_log import seconds_text
from tests.engine.conftest import engine_config, tiny_spec
from tests.support.engine import trainer_for


class RecordingBackend:
    """Wraps the trainer's rollout backend and records every `generate` call."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, **settings):
        completions = self.inner.generate(prompts, **settings)
        self.calls.append({"prompts": [list(p) for p in prompts], "completions": completions, **settings})
        return completions

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run(workdir, spec):
    workdir.mkdir(parents=True, exist_ok=True)
    trainer, reporter = trainer_for(workdir, spec)
    trainer.rollouts.orchestrator.backend = recording = RecordingBackend(trainer.rollouts.orchestrator.backend)
    reporter.start()
    assert trainer.run() == "succeeded"
    reporter.close("succeeded", timeout=10)
    points = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (workdir / "samples.jsonl").read_text().splitlines()]
    return trainer, recording.calls, {p["step"]: p["values"] for p in points}, samples


SPEC = tiny_spec(
    max_steps=2,
    eval={
        "interval": 2, "num_examples": 2, "rollouts_per_example": 2,
        "sampling": {"temperature": 0.9, "max_tokens": 5},
        "env": [
            {"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 3}, "num_examples": 8, "group_size": 3},
            {"id": "lab/alphabet-sort", "args": {"split": "test"}, "num_examples": -1},
        ],
    },
    val={"num_examples": 3, "interval": 1},
    pre_batch_filters=[{"type": "zero_advantage"}, {"type": "gibberish", "enforce": False, "min_mean_logprob": 0}],
    post_batch_filters=[{"type": "repetition", "enforce": False, "ngram_size": 1, "max_repeats": 1}],
)


def test_it_evaluates_validates_and_filters_as_the_spec_says(tmp_path):
    trainer, calls, metrics, samples = run(tmp_path / "work", SPEC)

    # Step 0: the base model's eval (skip_first_step not set); step 1: validation; step 2: both.
    assert sorted(metrics) == [0, 1, 2]
    eval_names = {
        "eval/reverse-text/mean", "eval/reverse-text/lcs_ratio/mean", "eval/reverse-text/exact/mean",
        "eval/alphabet-sort/mean", "eval/alphabet-sort/position_accuracy/mean", "eval/alphabet-sort/exact/mean",
    }
    val_names = {"val/reverse-text/mean", "val/reverse-text/lcs_ratio/mean", "val/reverse-text/exact/mean"}
    assert set(metrics[0]) == eval_names
    assert eval_names.isdisjoint(metrics[1]) and val_names <= set(metrics[1])
    assert eval_names | val_names <= set(metrics[2])

    # What was sampled, call by call (training calls have n = rollouts_per_example = 4).
    shapes = [(len(c["prompts"]), c["n"], c["max_tokens"], c["temperature"]) for c in calls]
    eval_calls = [(8, 3, 5, 0.9), (64, 2, 5, 0.9), (64, 2, 5, 0.9)]  # reverse-text: 8 x 3; alphabet-sort: its 128, 2 each
    val_call = (3, 1, 6, 1.0)  # the training sampling settings, one rollout per example
    train_call = (2, 4, 6, 1.0)
    assert shapes == eval_calls + [train_call, val_call, train_call] + eval_calls + [val_call]
    evaluated = load_environment("lab/reverse-text", {"min_length": 2, "max_length": 3}, seed=0)
    assert calls[0]["prompts"] == [trainer.rollouts.orchestrator.prompt_ids(evaluated, i, "eval")[0] for i in range(8)]
    assert all(split_of(evaluated.example(i, "eval")) == "eval" for i in range(8))
    trained = trainer.rollouts.orchestrator.environments[0]
    assert calls[4]["prompts"] == [trainer.rollouts.orchestrator.prompt_ids(trained, i, "val")[0] for i in range(3)]
    assert all(split_of(trained.example(i, "val")) == "val" for i in range(3))

    # The base model's greedy eval is computed from exactly the recorded completions.
    rewards = [
        evaluated.score(trainer.tokenizer.decode(c.token_ids, skip_special_tokens=True), evaluated.example(row // 3, "eval")).reward
        for row, c in enumerate(calls[0]["completions"])
    ]
    assert metrics[0]["eval/reverse-text/mean"] == pytest.approx(sum(rewards) / 24)
    assert any(rewards)  # partial credit: the check is not 0 == 0

    # Filters: fractions of each step's 8 rollouts, from the recorded training completions.
    for step, call in ((1, calls[3]), (2, calls[5])):
        step_samples = [s for s in samples if s["step"] == step]
        rewards = [s["reward"] for s in step_samples]
        equal_groups = [g for g in range(2) if max(rewards[g * 4:g * 4 + 4]) - min(rewards[g * 4:g * 4 + 4]) < 1e-6]
        dropped = {g * 4 + k for g in equal_groups for k in range(4)}
        assert metrics[step]["filter/zero_advantage/fraction"] == len(dropped) / 8
        # min_mean_logprob = 0 flags every kept sampled completion (their log-probabilities are < 0).
        kept = [r for r in range(8) if r not in dropped]
        assert metrics[step]["filter/gibberish/fraction"] == sum(
            1 for r in kept if call["completions"][r].logprobs and sum(call["completions"][r].logprobs) < 0
        ) / 8
        repeated = [r for r in kept if most_repeated_ngram_count(call["completions"][r].token_ids, 1) > 1]
        assert metrics[step]["filter/repetition/fraction"] == len(repeated) / 8
        assert [s["advantage"] for row, s in enumerate(step_samples) if row in dropped] == [0.0] * len(dropped)


def test_it_skips_the_base_models_eval_when_asked(tmp_path):
    spec = tiny_spec(max_steps=1, eval={"interval": 1, "num_examples": 2, "skip_first_step": True})
    _, calls, metrics, _ = run(tmp_path / "work", spec)
    assert sorted(metrics) == [1]
    assert {"eval/reverse-text/mean", "eval/reverse-text/lcs_ratio/mean"} <= set(metrics[1])
    assert [(len(c["prompts"]), c["n"]) for c in calls] == [(2, 4), (2, 1)]
    deprecated = tiny_spec(max_steps=1, eval={"interval": 1, "num_examples": 2, "eval_base_model": False})
    _, _, metrics, _ = run(tmp_path / "deprecated", deprecated)
    assert sorted(metrics) == [1]


def test_dropped_rollouts_leave_the_loss_but_not_the_token_count_it_is_averaged_over(tmp_path):
    """The default zero_advantage filter drops equal-reward groups: the batch's loss is the loss
    without them, still averaged over every completion token of the batch (the dropped groups'
    terms were zero: the same loss as with no filter, and no larger step for a batch of little signal)."""
    spec = tiny_spec(max_steps=1, rollouts_per_example=2, batch_size=8, sampling={"max_tokens": 6, "temperature": 1.0})
    trainer, _ = trainer_for(tmp_path / "a", spec)
    batch = trainer.rollouts.orchestrator.generate_batch(1, 0)
    batch.rewards[:] = [1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.25]  # groups 0 and 2 carry no signal
    for completion in batch.completions:  # as if sampled by a far-off policy, so the loss is far from 0
        completion.logprobs = [0.0] * len(completion.token_ids)
    advantages, keep, filters = trainer._filtered_advantages(batch)
    assert keep == [False, False, True, True, False, False, True, True]
    assert filters == {"filter/zero_advantage/fraction": 0.5}
    dropped_loss = trainer._train_on(batch, advantages, keep)["loss/mean"]

    unfiltered, _ = trainer_for(tmp_path / "b", tiny_spec(**{**spec, "pre_batch_filters": []}))
    advantages_all, keep_all, filters_all = unfiltered._filtered_advantages(batch)
    assert keep_all == [True] * 8 and filters_all == {}
    assert advantages_all.tolist() == advantages.tolist()
    full_loss = unfiltered._train_on(batch, advantages_all, keep_all)["loss/mean"]
    assert dropped_loss == pytest.approx(full_loss, rel=1e-5)
    assert abs(full_loss) > 1e-3


JINJA_WITH_THINKING = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% if enable_thinking %}{{ '<think>' }}{% endif %}{% endif %}"
)


def test_it_gives_the_chat_template_the_reasoning_controls_it_uses(tmp_path, caplog):
    spec = tiny_spec(max_steps=1, sampling={"max_tokens": 6, "enable_thinking": True})
    with caplog.at_level(logging.WARNING, logger="engine"):
        trainer, _ = trainer_for(tmp_path, spec)
    # The tiny model's ChatML template reads no enable_thinking: prompts are built without it, and the log says so.
    assert trainer.rollouts.orchestrator.template_kwargs == {}
    assert "sampling.enable_thinking: the chat template of lab/tiny-random-llama does not use 'enable_thinking'" in caplog.text

    tokenizer = trainer.tokenizer
    tokenizer.chat_template = JINJA_WITH_THINKING
    kwargs = usable_template_kwargs(tokenizer, {"enable_thinking": True, "reasoning_effort": "low"}, where="sampling", model="m")
    assert kwargs == {"enable_thinking": True}
    env = trainer.rollouts.orchestrator.environments[0]
    thinking = trainer.rollouts.orchestrator.prompt_ids(env, 0, "train", kwargs)[0]
    plain = trainer.rollouts.orchestrator.prompt_ids(env, 0, "train", {})[0]
    suffix = tokenizer.encode("<think>", add_special_tokens=False)
    assert thinking == plain + suffix and len(suffix) > 0


def test_the_transformers_backend_says_it_samples_without_vllms_parameters(tmp_path, caplog):
    spec = tiny_spec(max_steps=1, sampling={"max_tokens": 6, "extra_body": {"top_k": 5}})
    with caplog.at_level(logging.WARNING, logger="engine"):
        trainer, _ = trainer_for(tmp_path, spec)
    assert "sampling.extra_body: the transformers rollout backend does not take vLLM sampling parameters" in caplog.text
    assert trainer.rollouts.orchestrator.sampling_params(trainer.config.spec.sampling) == {}
    vllm_config = engine_config(spec, rollout_backend="vllm")
    assert vllm_config.spec.sampling.sampling_params() == {"top_k": 5}


def test_a_step_with_no_learning_signal_says_so_in_its_log_line(tmp_path, caplog):
    """Greedy sampling gives every rollout of a group the same completion and so the same reward:
    the zero_advantage filter drops the whole batch and the step's log line says it learned nothing."""
    caplog.set_level(logging.INFO, logger="engine")
    _, _, metrics, _ = run(tmp_path / "greedy", tiny_spec(max_steps=1, sampling={"max_tokens": 6, "temperature": 0.0}))
    assert metrics[1]["filter/zero_advantage/fraction"] == 1.0
    step_lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("step 1/1 ")]
    assert len(step_lines) == 1
    assert step_lines[0].endswith(
        "; every group had the same reward: nothing to learn from (filter/zero_advantage/fraction 1)"
    )
    assert re.search(r" time \d+\.\d+s \(generate \d+\.\d+s, train \d+\.\d+s\)", step_lines[0])


def test_a_step_that_learns_says_nothing_more_and_times_under_a_tenth_of_a_second_keep_two_decimals(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="engine")
    _, _, metrics, _ = run(tmp_path / "work", tiny_spec(max_steps=1))
    assert metrics[1]["filter/zero_advantage/fraction"] < 1.0
    step_line = next(record.getMessage() for record in caplog.records if record.getMessage().startswith("step 1/1 "))
    assert "nothing to learn from" not in step_line
    assert seconds_text(0.04) == "0.04s" and seconds_text(0.1) == "0.1s" and seconds_text(12.34) == "12.3s"
