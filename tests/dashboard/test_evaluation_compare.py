"""The comparison page of two to five evaluations on a shared environment: their results, how many
examples each solves that another does not, the examples side by side, a picker showing ids, and
clear refusals (no shared environment, too many); another organization's evaluation is a 404."""

from __future__ import annotations

import re

import pytest

from tests.support.dashboard import without_csrf
from tests.support.evaluation_pages import ended_evaluation
from tests.support.evaluations import evaluation_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

PROJECT = "/o/acme/p/default/"
COMPARE = PROJECT + "evaluations/compare/"
ADDITION = {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 4, "rollouts_per_example": 2}
REVERSE = {"id": "lab/reverse-text", "num_examples": 2}


def query(*evaluations, **extra) -> str:
    parts = [f"evaluation={evaluation.public_id}" for evaluation in evaluations]
    parts += [f"{key}={value}" for key, value in extra.items()]
    return COMPARE + "?" + "&".join(parts)


@pytest.fixture
def pair(owner):
    """A base model solving example 0 of addition, and a checkpoint solving examples 0 to 2."""
    base = ended_evaluation(owner, evaluation_body(name="base", environments=[ADDITION, REVERSE]),
                            reward=lambda environment, example, rollout: float(environment == 0 and example == 0))
    tuned = ended_evaluation(owner, evaluation_body(name="tuned", environments=[ADDITION]),
                             reward=lambda environment, example, rollout: float(example <= 2))
    return base, tuned


def test_two_evaluations_are_compared_example_by_example(owner_client, pair):
    base, tuned = pair
    response = owner_client.get(query(base, tuned))
    assert response.status_code == 200
    columns = response.context["columns"]
    assert [(column["evaluation"], column["environment_id"], column["scored"], column["solved"]) for column in columns] == [
        (base, "lab/addition", 4, 1), (tuned, "lab/addition", 4, 3),
    ]
    assert [counts for _, counts in response.context["matrix"]] == [[None, 0], [2, None]]
    rows = response.context["rows"]  # by default the examples they disagree on
    assert [[cell.outcome.example for cell in row["cells"]] for row in rows] == [[1, 1], [2, 2]]
    assert [[cell.outcome.solved for cell in row["cells"]] for row in rows] == [[False, True], [False, True]]
    assert [row["prompt"][0].text for row in rows] == ["example 1", "example 2"]
    assert rows[0]["cells"][1].sample.completion == "reply 0"
    content = response.content.decode()
    assert content.count('class="card compared-example verdict-split"') == 2
    assert f'href="{PROJECT}evaluations/{tuned.public_id}/samples/{rows[0]["cells"][1].sample.public_id}/"' in content
    everything = owner_client.get(query(base, tuned, show="all"))
    assert [row["verdict"] for row in everything.context["rows"]] == ["all", "split", "split", "none"]
    only_tuned = owner_client.get(query(base, tuned, show="only:1"))
    assert len(only_tuned.context["rows"]) == 2
    assert owner_client.get(query(base, tuned, show="only:0")).context["rows"] == []


def test_the_picker_lists_the_projects_evaluations_with_their_ids(owner_client, pair):
    base, tuned = pair
    content = owner_client.get(COMPARE).content.decode()
    for evaluation in pair:
        assert re.search(rf'<input type="checkbox" name="evaluation" value="{evaluation.public_id}"> <span>{evaluation.name} '
                         rf'<code class="muted small">{evaluation.public_id}</code>', content)
    assert "Pick two to 5 evaluations" in content
    picked = owner_client.get(query(base, tuned)).content.decode()
    assert f'value="{base.public_id}" checked' in picked and f'value="{tuned.public_id}" checked' in picked
    assert owner_client.get(query(base)).context.get("comparison") is None  # one is not a comparison yet


def test_evaluations_sharing_no_environment_are_refused_with_a_clear_message(owner, owner_client, pair):
    base, _ = pair
    reverse_only = ended_evaluation(owner, evaluation_body(name="reverse", environments=[REVERSE]))
    tuned_addition = pair[1]
    response = owner_client.get(query(tuned_addition, reverse_only))
    assert response.status_code == 400
    assert (
        "These evaluations share no environment, so there are no examples to compare: "
        f"{tuned_addition.public_id} ran lab/addition; {reverse_only.public_id} ran lab/reverse-text."
    ) in response.content.decode()
    shared = owner_client.get(query(base, reverse_only))
    assert shared.status_code == 200 and shared.context["comparison"].environment == "lab/reverse-text"
    assert owner_client.get(query(base, tuned_addition, environment="lab/reverse-text")).status_code == 400
    assert owner_client.get(query(base, tuned_addition, show="sideways")).status_code == 400


def test_more_than_five_are_refused(owner, owner_client):
    evaluations = [ended_evaluation(owner, evaluation_body(environments=[REVERSE])) for _ in range(6)]
    response = owner_client.get(query(*evaluations))
    assert response.status_code == 400
    assert "Compare 2 to 5 evaluations, not 6." in response.content.decode()
    assert owner_client.get(query(*evaluations[:5])).status_code == 200


def test_another_organizations_evaluation_is_a_404_like_a_missing_one(owner, outsider, outsider_client):
    theirs = ended_evaluation(owner, evaluation_body(environments=[REVERSE]))
    own = ended_evaluation(outsider, evaluation_body(environments=[REVERSE]))
    url = "/o/globex/p/default/evaluations/compare/"
    foreign = outsider_client.get(f"{url}?evaluation={own.public_id}&evaluation={theirs.public_id}")
    missing = outsider_client.get(f"{url}?evaluation={own.public_id}&evaluation=eval_doesnotexist")
    assert foreign.status_code == missing.status_code == 404
    assert without_csrf(foreign) == without_csrf(missing)
    assert outsider_client.get(f"{COMPARE}?evaluation={theirs.public_id}").status_code == 404
