"""``lab evals push`` of what verifiers' own ``vf-eval`` wrote: both generations (0.3.1's
``load_environment`` and 0.4.0's tasksets) run for real against the engine's serving role on the
tiny model, their folders pushed with the SDK (``lab.evals.push``) and the ``lab evals push``
command, each rollout stored once as it is in the files, and a second push storing nothing."""

from __future__ import annotations

import json

import pytest
from labsdk import Lab
from labsdk.cli import main
from labsdk.cli.parser import build_parser

from evaluations.models import Evaluation
from jobs.evaluation_samples import EvaluationSample
from tests.support.vf_eval import legacy_verifiers_python, run_legacy_vf_eval, run_v1_vf_eval, serving_url

pytestmark = [pytest.mark.e2e, pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """One vf-eval run of each generation: 3 examples x 2 rollouts at temperature 0.7."""
    root = tmp_path_factory.mktemp("vf-eval")
    with serving_url(root / "serve") as url:
        legacy = run_legacy_vf_eval(legacy_verifiers_python(root), url, root / "legacy", num_examples=3, rollouts=2)
        v1 = run_v1_vf_eval(url, root / "v1", num_examples=3, rollouts=2)
    return {"legacy": legacy, "v1": v1}


def _cli(lab: Lab, capsys, *argv: str) -> tuple[int, str]:
    """Run ``lab ARGV`` in this process with ``lab`` as its client; return its exit status and output."""
    args = build_parser().parse_args(list(argv))
    status = args.handler(args, lambda: lab)
    return status, capsys.readouterr().out


def _stored(evaluation_id: str) -> list[EvaluationSample]:
    evaluation = Evaluation.objects.unscoped().get(public_id=evaluation_id)
    return list(EvaluationSample.objects.unscoped().filter(job=evaluation.job_id).order_by("example", "rollout"))


def test_a_legacy_vf_eval_run_is_pushed_with_every_rollout_as_its_files_say(runs, owner, wsgi_transport):
    folder = runs["legacy"]
    metadata = json.loads((folder / "metadata.json").read_text())
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    lab = Lab(api_key=owner.key, base_url="http://testserver", transport=wsgi_transport, max_retries=0)

    evaluation = lab.evals.push(folder, name="tiny_count, pushed")
    again = lab.evals.push(folder)

    assert (evaluation.source, evaluation.status, evaluation.name, again.id) == ("pushed", "succeeded", "tiny_count, pushed", evaluation.id)
    assert evaluation.model == {"type": "endpoint", "id": "lab/tiny-random-llama"}
    assert evaluation.environments == [{"id": "tiny_count", "args": {"num_examples": 3}, "num_examples": 3, "rollouts_per_example": 2}]
    assert (evaluation.details["format"], evaluation.details["verifiers_version"]) == ("verifiers-0.3", "0.3.1")
    assert evaluation.sampling["temperature"] == metadata["sampling_args"]["temperature"] == 0.7
    stored = _stored(evaluation.id)
    assert len(stored) == len(rows) == 6
    by_example: dict[int, list[dict]] = {}
    for row in rows:
        by_example.setdefault(row["example_id"], []).append(row)
    expected = [(example_id, rollout, row) for example_id in sorted(by_example) for rollout, row in enumerate(by_example[example_id])]
    for sample, (example_id, rollout, row) in zip(stored, expected):
        assert (sample.example, sample.rollout, sample.info["example_id"]) == (sorted(by_example).index(example_id), rollout, example_id)
        assert sample.prompt == [{"role": message["role"], "content": message["content"]} for message in row["prompt"]]
        assert sample.completion == row["completion"][-1]["content"]
        assert (sample.reward, sample.functions, sample.answer) == (row["reward"], row["metrics"], row["answer"])
        assert (sample.prompt_tokens, sample.completion_tokens) == (row["token_usage"]["input_tokens"], row["token_usage"]["output_tokens"])
        assert sample.truncated == row["is_truncated"]
    results = evaluation.results["tiny_count"]
    assert results["reward_mean"] == pytest.approx(metadata["avg_reward"])
    assert results["functions"] == pytest.approx(metadata["avg_metrics"])


def test_a_v1_vf_eval_run_is_pushed_by_the_cli_with_each_episodes_weighted_reward(runs, owner, wsgi_transport, capsys):
    folder = runs["v1"]
    episodes = [json.loads(line) for line in (folder / "traces.jsonl").read_text().splitlines() if line.strip()]
    lab = Lab(api_key=owner.key, base_url="http://testserver", transport=wsgi_transport, max_retries=0)

    first, printed = _cli(lab, capsys, "evals", "push", str(folder), "--json")
    second, printed_again = _cli(lab, capsys, "evals", "push", str(folder), "--json")

    assert (first, second) == (0, 0)
    evaluation, repeated = json.loads(printed), json.loads(printed_again)
    assert (evaluation["status"], evaluation["source"], repeated["id"]) == ("succeeded", "pushed", evaluation["id"])
    assert evaluation["environments"][0] | {"args": {}} == {"id": "shout-word", "args": {}, "num_examples": 3, "rollouts_per_example": 2}
    assert evaluation["environments"][0]["args"]["num_tasks"] == 2000
    assert (evaluation["details"]["format"], evaluation["details"]["verifiers_version"]) == ("verifiers-0.4", "0.4.0")
    stored = _stored(evaluation["id"])
    assert len(stored) == len(episodes) == 6
    for episode in episodes:
        trace = episode["traces"][0]
        matches = [sample for sample in stored if sample.info["idx"] == episode["task"]["data"]["idx"]
                   # a reply the tiny random model left empty is a message without content
                   and sample.completion == (trace["nodes"][-1]["message"].get("content") or "")]
        assert matches, episode["task"]["data"]["idx"]
        sample = matches[0]
        weighted = sum(item["score"] * item["weight"] for item in trace["rewards"].values())
        assert sample.reward == pytest.approx(weighted)
        assert sample.functions == {name: item["score"] for name, item in trace["rewards"].items()}
        assert sample.prompt[-1] == {"role": "user", "content": episode["task"]["data"]["prompt"]}
        assert (sample.prompt_tokens, sample.completion_tokens) == (episode["num_input_tokens"], episode["num_output_tokens"])
    assert sorted({(sample.example, sample.rollout) for sample in stored}) == [(e, r) for e in range(3) for r in range(2)]
    assert evaluation["results"]["shout-word"]["reward_mean"] == pytest.approx(
        sum(sample.reward for sample in stored) / len(stored)
    )


def test_a_folder_holding_no_run_is_a_usage_error_and_pushes_nothing(owner, tmp_path, monkeypatch, capsys):
    (tmp_path / "results.jsonl").write_text("{}\n")
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", "http://127.0.0.1:9")  # nothing is sent

    with pytest.raises(SystemExit) as exited:
        main(["evals", "push", str(tmp_path)])

    assert exited.value.code == 2
    assert "holds no vf-eval run: expected metadata.json and results.jsonl (verifiers 0.3)" in capsys.readouterr().err
    assert not Evaluation.objects.unscoped().exists()
