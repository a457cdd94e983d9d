"""The dashboard's evaluation pages: the project's list, an evaluation's page (summary per
environment, reward histograms, samples filtered and paged), one sample as turns and as plain
text, cancel, retry and delete, and the environment's page listing the evaluations of each version,
best first. Members only; another organization's evaluation is the same 404 as a missing one."""

from __future__ import annotations

import pytest

from evaluations.models import Evaluation
from jobs.evaluation_samples import EvaluationSample
from jobs.models import Job, JobStatus
from jobs.services import job_transition
from tests.support.dashboard import without_csrf
from tests.support.evaluation_pages import ended_evaluation
from tests.support.evaluations import EvaluationEngine, create_evaluation, evaluation_body, every_sample

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

PROJECT = "/o/acme/p/default/"
ADDITION = {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 3, "rollouts_per_example": 2}
REVERSE = {"id": "lab/reverse-text", "num_examples": 2}


def evaluation_url(evaluation: Evaluation, rest: str = "", project: str = PROJECT) -> str:
    return f"{project}evaluations/{evaluation.public_id}/{rest}"


@pytest.fixture
def scored(owner) -> Evaluation:
    """An ended evaluation on addition (example e's rollouts succeed for e <= rollout) and on
    reverse-text (nothing succeeds; one sample timed out, one failed)."""
    evaluation = create_evaluation(owner, evaluation_body(name="tiny-baseline", environments=[ADDITION, REVERSE]))
    engine = EvaluationEngine(evaluation.job)
    engine.running()
    rows = every_sample(evaluation, reward=lambda environment, example, rollout: float(environment == 0 and example <= rollout))
    rows[-2]["timed_out"] = True
    rows[-1].update(error="the rubric raised", functions={})
    rows[0].update(info={"b": [1, 2], "a": "<script>x</script>"}, completion="<b>5</b>")
    engine.evaluation_samples(rows)
    job_transition(job=Job.objects.unscoped().get(pk=evaluation.job_id), to=JobStatus.SUCCEEDED)
    return Evaluation.objects.unscoped().get(pk=evaluation.pk)


# --- the list ------------------------------------------------------------------------------------


def test_the_project_links_its_evaluations_listed_with_reward_means(owner, owner_client, scored):
    running = create_evaluation(owner, evaluation_body(name="still-going", environments=[REVERSE]))
    assert f'href="{PROJECT}evaluations/"' in owner_client.get(PROJECT).content.decode()
    response = owner_client.get(f"{PROJECT}evaluations/")
    assert response.status_code == 200
    rows = response.context["rows"]
    assert [row["id"] for row in rows] == [running.public_id, scored.public_id]
    assert rows[1]["environment_rewards"] == [
        {"id": "lab/addition", "reward_mean": 0.5, "reward_stderr": pytest.approx(0.5 / 3**0.5)},
        {"id": "lab/reverse-text", "reward_mean": 0.0, "reward_stderr": 0.0},
    ]
    assert rows[0]["environment_rewards"] == [{"id": "lab/reverse-text", "reward_mean": None, "reward_stderr": None}]
    content = response.content.decode()
    assert f'href="{evaluation_url(scored)}"' in content
    assert "0.500" in content and "± 0.289" in content
    assert "lab/tiny-random-llama" in content
    queued = owner_client.get(f"{PROJECT}evaluations/?status=queued")
    assert [row["id"] for row in queued.context["rows"]] == [running.public_id]
    unknown = owner_client.get(f"{PROJECT}evaluations/?status=%3Cb%3E")
    assert len(unknown.context["rows"]) == 2
    assert "Unknown status &#x27;&lt;b&gt;&#x27;" in unknown.content.decode()


# --- one evaluation ------------------------------------------------------------------------------


def test_the_page_summarises_each_environment_with_a_histogram(owner_client, scored):
    response = owner_client.get(evaluation_url(scored))
    assert response.status_code == 200
    addition, reverse = response.context["summaries"]
    assert addition["result"]["pass_at_k"] == [(1, 0.5), (2, pytest.approx(2 / 3))]
    assert addition["result"]["functions"] == [("correct", 0.5)]
    assert [bin_["count"] for bin_ in addition["histogram"]] == [3] + [0] * 8 + [3]
    assert (reverse["result"]["errors"], reverse["result"]["timeouts"], reverse["result"]["tokens"]) == (
        1, 1, {"prompt": 10, "completion": 6}
    )
    assert reverse["histogram"] == [{"low": 0.0, "high": 0.0, "count": 2}]
    content = response.content.decode()
    assert "pass@1 0.500" in content and "pass@2 0.667" in content
    assert 'hx-trigger="every 3s"' not in content  # ended: nothing to follow
    assert f'href="{PROJECT}jobs/{scored.job.public_id}/"' in content
    job_page = owner_client.get(f"{PROJECT}jobs/{scored.job.public_id}/").content.decode()
    assert f'<a id="job-evaluation" href="{evaluation_url(scored)}">' in job_page
    assert f'href="{evaluation_url(scored, "delete/")}"' in content
    assert f'href="{evaluation_url(scored, "cancel/")}"' not in content


def test_a_running_evaluation_follows_its_progress(owner, owner_client):
    evaluation = create_evaluation(owner, evaluation_body(environments=[ADDITION]))
    engine = EvaluationEngine(evaluation.job)
    engine.running()
    engine.evaluation_samples(every_sample(evaluation)[:4])
    page = owner_client.get(evaluation_url(evaluation)).content.decode()
    summary = owner_client.get(evaluation_url(evaluation, "summary/"))
    for html in (page, summary.content.decode()):
        assert f'hx-get="{evaluation_url(evaluation, "summary/")}" hx-trigger="every 3s"' in html
        assert '<span id="evaluation-samples">4</span>/6 samples' in html
        assert f'href="{evaluation_url(evaluation, "cancel/")}"' in html
    assert "<html" not in summary.content.decode()
    assert summary.context["summaries"][0]["result"] is None


def test_samples_are_paged_and_filtered_by_environment_and_reward(owner_client, scored, monkeypatch):
    monkeypatch.setattr("dashboard.evaluation_views.SAMPLES_PAGE_SIZE", 3)
    everything = owner_client.get(evaluation_url(scored))
    assert [(s["environment"], s["example"], s["rollout"]) for s in everything.context["samples"]] == [
        ("lab/addition", 0, 0), ("lab/addition", 0, 1), ("lab/addition", 1, 0),
    ]
    assert everything.context["samples_page"].paginator.count == 8
    last = owner_client.get(evaluation_url(scored) + "?page=3")
    assert [(s["environment"], s["example"]) for s in last.context["samples"]] == [("lab/reverse-text", 0), ("lab/reverse-text", 1)]
    wrong = owner_client.get(evaluation_url(scored) + "?environment=lab/addition&max_reward=0")
    assert [(s["example"], s["rollout"]) for s in wrong.context["samples"]] == [(1, 0), (2, 0), (2, 1)]
    assert "?environment=lab%2Faddition&amp;max_reward=0&amp;page=2" not in wrong.content.decode()  # one page
    paged = owner_client.get(evaluation_url(scored) + "?environment=lab/addition")
    assert "?environment=lab%2Faddition&amp;page=2" in paged.content.decode()
    for query, message in (("min_reward=lots", "min_reward must be a number."),
                           ("environment=lab/nope", "This evaluation has no environment &#x27;lab/nope&#x27;; it has lab/addition")):
        refused = owner_client.get(evaluation_url(scored) + "?" + query)
        assert refused.status_code == 400
        assert message in refused.content.decode()


def test_a_sample_reads_as_turns_scores_and_info_and_as_plain_text(owner_client, scored):
    sample = EvaluationSample.objects.filter(job=scored.job_id).order_by("id").first()
    url = evaluation_url(scored, f"samples/{sample.public_id}/")
    response = owner_client.get(url)
    assert response.status_code == 200
    content = response.content.decode()
    assert "&lt;b&gt;5&lt;/b&gt;" in content and "<b>5</b>" not in content
    assert [(turn.role, turn.text) for turn in response.context["prompt_turns"]] == [("user", "example 0")]
    assert [(turn.role, turn.text) for turn in response.context["completion_turns"]] == [("assistant", "<b>5</b>")]
    assert response.context["functions"] == [("correct", 1.0)]
    text = owner_client.get(url + "?format=text")
    assert text["Content-Type"] == "text/plain; charset=utf-8"
    assert text.content.decode() == (
        f"evaluation: {scored.public_id}\nsample: {sample.public_id}\nenvironment: lab/addition\nexample: 0\nrollout: 0\n\n"
        "=== prompt ===\n[user]\nexample 0\n\n"
        "=== completion ===\n[assistant]\n<b>5</b>\n\n"
        "=== answer ===\n42\n\n"
        "=== scores ===\nreward: 1.0\ncorrect: 1.0\n\n"
        '=== info ===\n{\n  "a": "<script>x</script>",\n  "b": [\n    1,\n    2\n  ]\n}\n\n'
        "=== run ===\ntokens: prompt 5, completion 3\nlatency_s: 0.25\n"
    )


def test_a_multi_turn_completion_reads_as_its_turns(owner, owner_client):
    evaluation = create_evaluation(owner, evaluation_body(environments=[REVERSE]))
    engine = EvaluationEngine(evaluation.job)
    conversation = '[{"role": "assistant", "content": "ls"}, {"role": "tool", "content": "a.txt"}]'
    rows = every_sample(evaluation)
    rows[0]["completion"] = conversation
    engine.evaluation_samples(rows)
    sample = EvaluationSample.objects.filter(job=evaluation.job_id, example=0).get()
    response = owner_client.get(evaluation_url(evaluation, f"samples/{sample.public_id}/"))
    assert [(turn.role, turn.text) for turn in response.context["completion_turns"]] == [("assistant", "ls"), ("tool", "a.txt")]


# --- cancel, retry, delete -----------------------------------------------------------------------


def test_cancel_retry_and_delete_confirm_then_act(owner, owner_client):
    evaluation = create_evaluation(owner, evaluation_body(environments=[REVERSE]))
    assert owner_client.get(evaluation_url(evaluation, "cancel/")).status_code == 200
    assert Job.objects.unscoped().get(pk=evaluation.job_id).status == JobStatus.QUEUED  # a GET only asks
    refused = owner_client.post(evaluation_url(evaluation, "delete/"), follow=True)
    assert refused.redirect_chain == [(evaluation_url(evaluation), 302)]
    assert "Only finished jobs can be deleted; this one is queued. Cancel it first." in refused.content.decode()
    assert Evaluation.objects.unscoped().filter(pk=evaluation.pk).exists()
    owner_client.post(evaluation_url(evaluation, "cancel/"))
    assert Job.objects.unscoped().get(pk=evaluation.job_id).status == JobStatus.CANCELLED
    owner_client.post(evaluation_url(evaluation, "retry/"))
    assert Job.objects.unscoped().get(pk=evaluation.job_id).status == JobStatus.QUEUED
    owner_client.post(evaluation_url(evaluation, "cancel/"))
    deleted = owner_client.post(evaluation_url(evaluation, "delete/"))
    assert deleted.status_code == 302 and deleted["Location"] == f"{PROJECT}evaluations/"
    assert not Evaluation.objects.unscoped().filter(pk=evaluation.pk).exists()


# --- tenancy -------------------------------------------------------------------------------------

ROUTES = [("get", ""), ("get", "summary/"), ("get", "samples/{sample}/"), ("get", "samples/{sample}/?format=text"),
          ("get", "cancel/"), ("post", "cancel/"), ("get", "retry/"), ("post", "retry/"), ("get", "delete/"),
          ("post", "delete/")]


@pytest.mark.parametrize("method, rest", ROUTES)
def test_another_organizations_evaluation_is_a_404_like_a_missing_one(owner, outsider, outsider_client, method, rest):
    theirs = ended_evaluation(owner, evaluation_body(environments=[REVERSE]), status=JobStatus.FAILED)
    sample = EvaluationSample.objects.filter(job=theirs.job_id).first()
    own = "/o/globex/p/default/"
    foreign = getattr(outsider_client, method)(evaluation_url(theirs, rest.format(sample=sample.public_id), project=own))
    missing = getattr(outsider_client, method)(f"{own}evaluations/eval_doesnotexist/{rest.format(sample='evs_nope')}")
    direct = getattr(outsider_client, method)(evaluation_url(theirs, rest.format(sample=sample.public_id)))
    assert foreign.status_code == missing.status_code == direct.status_code == 404
    assert without_csrf(foreign) == without_csrf(missing)
    assert Job.objects.unscoped().get(pk=theirs.job_id).status == JobStatus.FAILED
    assert EvaluationSample.objects.unscoped().filter(job=theirs.job_id).count() == 2


def test_a_sample_of_another_evaluation_is_a_404(owner, owner_client):
    first = ended_evaluation(owner, evaluation_body(environments=[REVERSE]))
    second = ended_evaluation(owner, evaluation_body(environments=[REVERSE]))
    sample = EvaluationSample.objects.filter(job=second.job_id).first()
    assert owner_client.get(evaluation_url(first, f"samples/{sample.public_id}/")).status_code == 404
    assert owner_client.get(evaluation_url(second, f"samples/{sample.public_id}/")).status_code == 200


def test_the_outsiders_list_holds_none_of_acmes(owner, outsider_client, scored):
    response = outsider_client.get("/o/globex/p/default/evaluations/")
    assert response.status_code == 200 and response.context["rows"] == []
    assert outsider_client.get(f"{PROJECT}evaluations/").status_code == 404


# --- the environment's page ----------------------------------------------------------------------


def test_the_environment_page_lists_its_evaluations_best_first(owner, outsider, owner_client, outsider_client):
    low = ended_evaluation(owner, evaluation_body(name="low", environments=[ADDITION]),
                           reward=lambda environment, example, rollout: 0.25)
    high = ended_evaluation(owner, evaluation_body(name="high", environments=[REVERSE, ADDITION]),
                            reward=lambda environment, example, rollout: 0.75 if environment == 1 else 0.0)
    ended_evaluation(outsider, evaluation_body(name="theirs", environments=[ADDITION]), reward=lambda *key: 1.0)
    listing = owner_client.get("/o/acme/environments/").content.decode()
    assert 'href="/o/acme/environments/lab/addition/"' in listing
    response = owner_client.get("/o/acme/environments/lab/addition/")
    assert response.status_code == 200
    [(version, rows)] = response.context["groups"]
    assert version == "lab/addition"
    assert [(row["evaluation"].public_id, row["result"]["reward_mean"]) for row in rows] == [
        (high.public_id, 0.75), (low.public_id, 0.25)
    ]
    content = response.content.decode()
    assert content.index(high.public_id) < content.index(low.public_id)
    assert f'href="{evaluation_url(high)}"' in content
    assert "theirs" not in content
    assert outsider_client.get("/o/globex/environments/lab/addition/").context["groups"][0][1][0]["evaluation"].name == "theirs"
    assert outsider_client.get("/o/acme/environments/lab/addition/").status_code == 404
    assert owner_client.get("/o/acme/environments/globex/private-env/").status_code == 404
    assert owner_client.get("/o/acme/environments/lab/nope/").status_code == 404
