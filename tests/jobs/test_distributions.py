"""``GET /jobs/{id}/distributions``: per-step histograms of rollout rewards and advantages."""

from __future__ import annotations

import pytest

from jobs.distributions import histogram
from tests.support.jobs_helpers import Engine, submit
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]


def rollouts(rewards, advantages):
    return [{"group": index // 2, "prompt": "p", "completion": "c", "reward": reward, "advantage": advantage}
            for index, (reward, advantage) in enumerate(zip(rewards, advantages))]


@pytest.fixture
def job_with_samples(owner, spec):
    job = submit(owner, spec)
    engine = Engine(job)
    engine.running(0)
    engine.samples(1, rollouts([0.0, 0.0, 1.0, 1.0], [-0.5, -0.5, 0.5, 0.5]))
    engine.samples(2, rollouts([0.0, 0.25, 0.5, 1.0], [-1.0, 0.0, 0.0, 1.0]))
    return job


def test_it_bins_the_latest_steps_rewards_by_default(owner, job_with_samples):
    body = owner.client().get(f"/api/v1/jobs/{job_with_samples.public_id}/distributions", {"bins": 4}).json()

    assert body == {
        "object": "distribution", "job_id": job_with_samples.public_id, "step": 2, "type": "reward", "count": 4,
        "min": 0.0, "max": 1.0, "mean": 0.4375,
        "bins": [{"low": 0.0, "high": 0.25, "count": 1}, {"low": 0.25, "high": 0.5, "count": 1},
                 {"low": 0.5, "high": 0.75, "count": 1}, {"low": 0.75, "high": 1.0, "count": 1}],
    }
    assert_matches(served_document(), "Distribution", body)


def test_it_bins_a_given_steps_advantages(owner, job_with_samples):
    body = owner.client().get(f"/api/v1/jobs/{job_with_samples.public_id}/distributions",
                              {"step": 1, "type": "advantage", "bins": 2}).json()

    assert (body["step"], body["type"], body["count"], body["mean"]) == (1, "advantage", 4, 0.0)
    assert body["bins"] == [{"low": -0.5, "high": 0.0, "count": 2}, {"low": 0.0, "high": 0.5, "count": 2}]


def test_a_job_without_samples_has_an_empty_distribution(owner, spec):
    job = submit(owner, spec)

    body = owner.client().get(f"/api/v1/jobs/{job.public_id}/distributions").json()

    assert (body["step"], body["count"], body["min"], body["bins"]) == (None, 0, None, [])


@pytest.mark.parametrize(("query", "param"), [
    ({"type": "loss"}, "type"), ({"bins": "0"}, "bins"), ({"bins": "101"}, "bins"), ({"step": "-1"}, "step"),
    ({"step": "x"}, "step"),
])
def test_bad_parameters_are_a_400_naming_them(owner, job_with_samples, query, param):
    response = owner.client().get(f"/api/v1/jobs/{job_with_samples.public_id}/distributions", query)

    assert response.status_code == 400
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == ("invalid_request", param)


def test_another_organizations_job_is_a_404_like_a_missing_one(outsider, job_with_samples):
    foreign = outsider.client().get(f"/api/v1/jobs/{job_with_samples.public_id}/distributions")
    missing = outsider.client().get("/api/v1/jobs/job_doesnotexist/distributions")

    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json()


def test_equal_values_make_one_bin_and_the_maximum_falls_in_the_last():
    assert histogram([0.5, 0.5], 10) == [{"low": 0.5, "high": 0.5, "count": 2}]
    assert [b["count"] for b in histogram([0.0, 0.1, 0.9, 1.0], 2)] == [2, 2]
    assert histogram([], 3) == []
