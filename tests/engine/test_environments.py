"""Built-in environments: seeded examples and their rubrics."""

import logging
import random

import pytest

from engine.catalog import EnvironmentInfo
from engine.environments import (
    SPLITS, Environment, EnvironmentFailed, Example, InvalidEnvironment, Scores, load_environment, split_of,
)


def test_it_generates_the_same_examples_for_the_same_seed():
    first, second = load_environment("lab/addition", {}, seed=3), load_environment("lab/addition", {}, seed=3)
    assert [first.example(i).messages for i in range(5)] == [second.example(i).messages for i in range(5)]
    assert first.example(0, "eval") != first.example(0, "train") or first.example(1, "eval") != first.example(1, "train")


def test_it_rewards_the_exact_sum():
    env = load_environment("lab/addition", {"max_operand": 5, "num_operands": 3}, seed=0)
    example = env.example(0)
    assert sum(example.info["operands"]) == int(example.answer)
    assert env.score(example.answer, example).reward == 1.0
    assert env.score(f"The sum is {example.answer}.", example).functions == {"correct": 1.0, "answer_only": 0.0}
    assert env.score(str(int(example.answer) + 1), example).reward == 0.0


def test_it_gives_partial_credit_for_reversals():
    env = load_environment("lab/reverse-text", {"min_length": 4, "max_length": 4}, seed=0)
    example = env.example(0)
    assert env.score(example.answer, example).reward == 1.0
    partial = env.score(example.answer[:2], example)
    assert partial.reward == pytest.approx(2 * 2 / 6)
    assert partial.functions["exact"] == 0.0


def test_it_scores_sorted_words_by_position():
    env = load_environment("lab/alphabet-sort", {"num_words": 4}, seed=0)
    example = env.example(0)
    words = example.answer.split(", ")
    assert env.score(", ".join(words), example).reward == 1.0
    assert env.score(", ".join(words[:2]), example).reward == 0.5


@pytest.mark.parametrize(
    "env_id, args, message",
    [
        ("primeintellect/reverse-text", {}, "not installed"),
        ("lab/addition", {"max_operand": "20"}, "must be of type int"),
        ("lab/addition", {"operands": 2}, "no argument 'operands'"),
        ("lab/addition", {"min_operand": 9, "max_operand": 3}, "min_operand <= max_operand"),
    ],
)
def test_it_refuses_unknown_environments_and_bad_args(env_id, args, message):
    with pytest.raises(InvalidEnvironment, match=message):
        load_environment(env_id, args, seed=0)


def test_its_train_eval_and_val_splits_never_share_a_prompt():
    env = load_environment("lab/addition", {"max_operand": 20}, seed=0)
    prompts = {
        split: {env.example(i, split).messages[1]["content"] for i in range(count)}
        for split, count in (("train", 400), ("eval", 60), ("val", 60))
    }
    assert not prompts["train"] & prompts["eval"] and not prompts["train"] & prompts["val"] and not prompts["eval"] & prompts["val"]
    assert all(split_of(env.example(i, split)) == split for split in SPLITS for i in range(20))
    # 1/16 of the prompts are eval's and 1/16 val's: a first draw in the train bucket is kept as drawn.
    first_draws = [env.make_example(random.Random(f"lab/addition:0:train:{i}")) for i in range(200)]
    assert [env.example(i) for i in range(200) if split_of(first_draws[i]) == "train"] == [
        e for e in first_draws if split_of(e) == "train"
    ]
    assert env.eval_size == 128
    with pytest.raises(ValueError, match="split must be one of train, eval, val"):
        env.example(0, "test")


class OnePrompt(Environment):
    info = EnvironmentInfo(id="test/one-prompt", name="one-prompt", description="always the same prompt")

    def make_example(self, rng):
        return Example(messages=[{"role": "user", "content": "Say 1"}], answer="1")


def test_an_environment_too_small_to_split_repeats_its_prompts_and_says_so(caplog):
    env = OnePrompt({}, seed=0)
    with caplog.at_level(logging.WARNING, logger="lab_environments"):
        examples = {split: env.example(0, split) for split in SPLITS}
        env.example(1, "eval")
    assert {e.messages[0]["content"] for e in examples.values()} == {"Say 1"}
    unsplit = [split for split in SPLITS if split != split_of(examples["train"])]
    assert [r.getMessage().split(": ")[1].split(" (")[0] for r in caplog.records] == [
        f"no prompt of 256 draws belongs to its {split} split" for split in unsplit
    ]


def test_a_rollout_whose_scoring_fails_is_scored_again_while_its_retries_last(caplog):
    class FlakyJudge(Environment):
        """Addition, with a judge that fails its first `failures` calls."""

        info = load_environment("lab/addition", {}, seed=0).info

        def __init__(self, failures: int):
            super().__init__({}, seed=0)
            self.failures, self.calls = failures, 0

        def score(self, completion, example):
            self.calls += 1
            if self.calls <= self.failures:
                raise EnvironmentFailed(f"environment {self.info.id}: scoring failed: the judge timed out")
            return Scores(reward=1.0, functions={"correct": 1.0})

    example = Example(messages=[], answer="2")
    judge = FlakyJudge(failures=2)
    judge.retries = 2
    with caplog.at_level(logging.WARNING, logger="lab_environments"):
        assert judge.score_rollout("2", example).reward == 1.0
    assert judge.calls == 3
    assert [record.getMessage() for record in caplog.records] == [
        f"scoring failed (environment lab/addition: scoring failed: the judge timed out); running it again, retry {n} of 2"
        for n in (1, 2)
    ]
    judge = FlakyJudge(failures=2)
    judge.retries = 1
    with pytest.raises(EnvironmentFailed, match="the judge timed out"):
        judge.score_rollout("2", example)
    assert judge.calls == 2
    assert FlakyJudge(failures=0).score_rollout("2", example).reward == 1.0  # retries 0: one try


def test_a_scoring_past_the_timeout_is_scored_again_while_its_retries_last_then_counts_as_timed_out(caplog):
    class SlowJudge(Environment):
        """Addition, with a judge whose first `slow` scorings run past the timeout."""

        info = load_environment("lab/addition", {}, seed=0).info

        def __init__(self, slow: int):
            super().__init__({}, seed=0)
            self.slow, self.calls, self.timeout = slow, 0, 2.0

        def score(self, completion, example):
            self.calls += 1
            if self.calls <= self.slow:
                return Scores(reward=0.0, functions={"correct": 0.0}, timed_out=True, message="the judge took longer than 2s")
            return Scores(reward=1.0, functions={"correct": 1.0})

    example = Example(messages=[], answer="2")
    judge = SlowJudge(slow=1)
    judge.retries = 1
    with caplog.at_level(logging.WARNING, logger="lab_environments"):
        assert judge.score_rollout("2", example) == Scores(reward=1.0, functions={"correct": 1.0})
    assert [record.getMessage() for record in caplog.records] == [
        "scoring timed out (the judge took longer than 2s); running it again, retry 1 of 1"
    ]
    judge = SlowJudge(slow=2)
    judge.retries = 1
    scores = judge.score_rollout("2", example)  # past the retries: the rollout's outcome, not the job's failure
    assert (scores.timed_out, scores.reward, judge.calls) == (True, 0.0, 2)
