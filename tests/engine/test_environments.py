"""Built-in environments: seeded examples and their rubrics."""

import pytest

from engine.environments import InvalidEnvironment, load_environment


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
