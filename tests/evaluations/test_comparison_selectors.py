"""Reads behind the evaluation pages (evaluations.selectors): the reward histogram counted in the
database, the comparison of evaluations example by example (matched by prompt, solved by a
majority of rollouts, refused without a shared environment) and an environment's evaluations by
version, best first."""

from __future__ import annotations

import pytest

from evaluations.selectors import (
    environment_evaluations,
    evaluation_comparison,
    evaluation_reward_histogram,
    evaluation_sample_get,
)
from jobs.distributions import histogram
from jobs.evaluation_samples import EvaluationSample
from lab.errors import LabError
from tests.support.evaluation_pages import ended_evaluation
from tests.support.evaluations import EvaluationEngine, create_evaluation, evaluation_body, sample

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

ADDITION = [{"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 4, "rollouts_per_example": 2}]
REVERSE = [{"id": "lab/reverse-text", "num_examples": 2}]


def test_the_reward_histogram_counts_in_the_database_as_numpy_bins_do(owner):
    rewards = {(0, 0): 0.0, (0, 1): 0.1, (1, 0): 0.25, (1, 1): 0.5, (2, 0): 0.5, (2, 1): 0.9, (3, 0): 1.0, (3, 1): 1.0}
    evaluation = ended_evaluation(
        owner, evaluation_body(environments=ADDITION), reward=lambda environment, example, rollout: rewards[example, rollout]
    )
    bins = evaluation_reward_histogram(evaluation=evaluation, environment=0, bins=4)
    assert bins == histogram(list(rewards.values()), 4)
    assert [item["count"] for item in bins] == [2, 1, 2, 3]  # 0.25 and 0.5 open their bins; 1.0 closes the last
    assert evaluation_reward_histogram(evaluation=evaluation, environment=1) == []


def test_an_environment_whose_rewards_are_all_equal_has_one_bin(owner):
    evaluation = ended_evaluation(owner, evaluation_body(environments=ADDITION))
    assert evaluation_reward_histogram(evaluation=evaluation, environment=0) == [{"low": 0.0, "high": 0.0, "count": 8}]


def test_examples_are_matched_by_prompt_and_solved_by_a_majority_of_rollouts(owner):
    base = ended_evaluation(owner, evaluation_body(name="base", environments=ADDITION),
                            reward=lambda environment, example, rollout: 1.0 if example == 0 else 0.0)
    # The checkpoint solves examples 0 to 2, example 1 with one rollout of two (half: solved).
    tuned = ended_evaluation(owner, evaluation_body(name="tuned", environments=ADDITION + REVERSE),
                             reward=lambda environment, example, rollout: float(environment == 0 and (example in (0, 2) or rollout == 0 and example == 1)))
    comparison = evaluation_comparison(evaluations=[base, tuned])
    assert (comparison.environment, comparison.shared, comparison.environment_indexes) == ("lab/addition", ["lab/addition"], [0, 0])
    assert len(comparison.keys) == len(comparison.common()) == 4
    solved = [[outcome.solved for outcome in comparison.row(key)] for key in comparison.keys]
    assert solved == [[True, True], [False, True], [False, True], [False, False]]
    assert [comparison.row(key)[1].successes for key in comparison.keys] == [2, 1, 2, 0]
    assert (comparison.solved_not(1, 0), comparison.solved_not(0, 1)) == (2, 0)
    assert comparison.rows("disagree") == comparison.keys[1:3]
    assert comparison.rows("only:1") == comparison.keys[1:3]
    assert comparison.rows("only:0") == []
    assert comparison.rows("solved") == comparison.keys[:1]
    assert comparison.rows("unsolved") == comparison.keys[3:]
    with pytest.raises(LabError) as refused:
        comparison.rows("sideways")
    assert refused.value.errors[0].param == "show"


def test_other_prompts_at_the_same_index_are_other_examples(owner):
    first = create_evaluation(owner, evaluation_body(environments=[{"id": "lab/addition", "num_examples": 2}]))
    second = create_evaluation(owner, evaluation_body(environments=[{"id": "lab/addition", "num_examples": 2}]))
    EvaluationEngine(first.job).evaluation_samples([sample(0, 0, 0, num_examples=2, reward=1.0), sample(0, 1, 0, num_examples=2)])
    EvaluationEngine(second.job).evaluation_samples([
        sample(0, 0, 0, num_examples=2, prompt=[{"role": "user", "content": "example 1"}]),
        sample(0, 1, 0, num_examples=2, prompt=[{"role": "user", "content": "another seed's prompt"}]),
    ])
    comparison = evaluation_comparison(evaluations=[first, second])
    assert len(comparison.keys) == 3 and len(comparison.common()) == 1  # "example 1": index 1 there, 0 here
    shared = comparison.common()[0]
    assert [outcome.example for outcome in comparison.row(shared)] == [1, 0]
    assert comparison.row(comparison.keys[0])[1] is None  # "example 0" was not sampled by the second


def test_evaluations_sharing_no_environment_are_refused_naming_what_each_ran(owner):
    addition = create_evaluation(owner, evaluation_body(environments=ADDITION))
    reverse = create_evaluation(owner, evaluation_body(environments=REVERSE))
    with pytest.raises(LabError) as refused:
        evaluation_comparison(evaluations=[addition, reverse])
    assert refused.value.code == "invalid_request"
    assert refused.value.message == (
        "These evaluations share no environment, so there are no examples to compare: "
        f"{addition.public_id} ran lab/addition; {reverse.public_id} ran lab/reverse-text."
    )
    with pytest.raises(LabError, match="Compare 2 to 5 evaluations, not 1"):
        evaluation_comparison(evaluations=[addition])
    with pytest.raises(LabError, match="they all ran lab/addition"):
        evaluation_comparison(evaluations=[addition, addition], environment="lab/reverse-text")


def test_a_sample_of_another_evaluation_is_not_found(owner):
    first = ended_evaluation(owner, evaluation_body(environments=REVERSE))
    second = ended_evaluation(owner, evaluation_body(environments=REVERSE))
    theirs = EvaluationSample.objects.filter(job=second.job_id).first()
    with pytest.raises(LabError) as refused:
        evaluation_sample_get(evaluation=first, sample_id=theirs.public_id)
    assert refused.value.code == "not_found"
    assert evaluation_sample_get(evaluation=second, sample_id=theirs.public_id) == theirs


def test_an_environments_evaluations_are_grouped_by_version_best_first(owner, outsider):
    low = ended_evaluation(owner, evaluation_body(name="low", environments=ADDITION),
                           reward=lambda environment, example, rollout: 0.25)
    high = ended_evaluation(owner, evaluation_body(name="high", environments=REVERSE + ADDITION),
                            reward=lambda environment, example, rollout: 0.75 if environment == 1 else 0.0)
    running = create_evaluation(owner, evaluation_body(name="running", environments=ADDITION))
    ended_evaluation(owner, evaluation_body(environments=REVERSE))
    ended_evaluation(outsider, evaluation_body(environments=ADDITION), reward=lambda *key: 1.0)
    groups = environment_evaluations(organization=owner.project.organization, environment="lab/addition")
    assert [group.environment_id for group in groups] == ["lab/addition"]
    assert [evaluation.public_id for evaluation, _ in groups[0].evaluations] == [high.public_id, low.public_id, running.public_id]
    assert [shown["results"]["lab/addition"]["reward_mean"] for _, shown in groups[0].evaluations[:2]] == [0.75, 0.25]
    assert environment_evaluations(organization=owner.project.organization, environment="lab/add") == []
