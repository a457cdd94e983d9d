"""A ``load_environment`` environment's judge and keys: the build loads it without any secret
(what it declares with ``vf.ensure_keys`` is recorded), and a job's engine hands its bridge the job
secrets the environment reads, and nothing else of its own environment, so a ``vf.JudgeRubric``'s
client reaches the judge endpoint its arguments name with the job's key.

The judge is a local OpenAI-compatible endpoint (pytest-httpserver); the package is
``tests/environments/fixtures/judge-qa``, built against the local package index."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
from werkzeug import Request, Response

from engine import build_envs, packages
from engine.dataset_snapshots import FOLDER as DATASETS_FOLDER
from engine.environments import InvalidEnvironment
from engine.environments.verifiers_taskset import BridgeRefused, start_load_environment_bridge
from tests.support.load_environment_wheels import fixture_wheel
from tests.support.packages import build_fixture, run_engine
from tests.support.wheelbuilder import build_wheel

JUDGE = "acme/judge-qa@0.1.0"
KEY = "sk-judge-4242"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``judge-qa``'s build: ready without its key, the key recorded as a secret it reads."""
    return build_fixture(tmp_path_factory.mktemp("load-environment-judges"), "judge-qa")


def test_a_judge_that_fails_fails_the_scoring_naming_its_error_where_verifiers_would_score_0(tmp_path, built, httpserver):
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(
        {"error": {"message": "invalid api key", "type": "invalid_request_error"}}, status=401,
    )
    package = packages.Package(id=JUDGE, sha256=built["sha256"], url="", filename="judge_qa-0.1.0-py3-none-any.whl")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(build_envs.CACHE_VARIABLE, str(built["root"] / "cache"))
        python, _ = build_envs.ensure_environment(JUDGE, built["lock"], tmp_path, packages._fetch_locked(package), log=print)
    zipfile.ZipFile(io.BytesIO(fixture_wheel("judge-qa")[1])).extractall(tmp_path / "site")
    bridge = start_load_environment_bridge(
        package_id=JUDGE, python=python, site=tmp_path / "site", workdir=tmp_path, secret_names=["JUDGE_API_KEY"],
        environ={"PATH": "/usr/bin:/bin", "JUDGE_API_KEY": KEY},
    )
    try:
        opened = bridge.request("open", taskset=JUDGE, args={"judge_base_url": httpserver.url_for("/v1"), "judge_model": "lab-judge"})
        (task,) = bridge.request("tasks", handle=opened["handle"], split="train", start=0, n=1, seed=0)["tasks"]
        with pytest.raises(BridgeRefused) as refused:
            bridge.request("score", handle=opened["handle"], task_id=task["id"], completion="Paris")
    finally:
        bridge.close()
    assert refused.value.code == "scoring_failed"
    assert str(refused.value).startswith(
        f"environment {JUDGE}: scoring failed: Error calling reward function judged: Judge model API error. Check model "
        "availability and API key. Model: lab-judge, Error: Error code: 401"
    )


def _engine(tmp_path: Path, built, env_id: str, wheel, *, args: dict, secrets: list[str], extra_env: dict):
    return run_engine(
        tmp_path, env_id, [wheel], args=args, spec={"max_steps": 1},
        build={"number": 1, "api": "v0", "lock": built["lock"], "secrets": secrets},
        extra_env={build_envs.CACHE_VARIABLE: str(built["root"] / "cache"), **extra_env},
    )


def test_the_build_records_the_key_it_declares_and_a_judge_job_calls_its_endpoint_with_the_jobs_secret(tmp_path, built, httpserver):
    assert built["summary"]["secrets"] == ["JUDGE_API_KEY"]
    assert built["summary"]["reward_functions"] == [{"name": "judged", "weight": 1.0}, {"name": "num_turns", "weight": 0.0}]
    # offline and with no key, the build's smoke rollout cannot reach the judge: left unscored, not failed
    rollout = built["summary"]["rollout"]
    assert (rollout["examples"], rollout["rewards"]) == (2, [0.0, 0.0])
    assert len(rollout["unscored"]) == 2 and all("judged" in line for line in rollout["unscored"])
    calls = []

    def judge(request: Request) -> Response:
        body = json.loads(request.data)
        calls.append((request.headers.get("Authorization"), body["model"], body["messages"][-1]["content"]))
        answer = {"id": "j", "object": "chat.completion", "created": 0, "model": body["model"],
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "yes"}, "finish_reason": "stop"}]}
        return Response(json.dumps(answer), content_type="application/json")

    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(judge)
    result = _engine(
        tmp_path, built, JUDGE, fixture_wheel("judge-qa"), secrets=["JUDGE_API_KEY"],
        args={"judge_base_url": httpserver.url_for("/v1"), "judge_model": "lab-judge"},
        extra_env={"JUDGE_API_KEY": KEY, "OPENAI_API_KEY": "sk-another-secret-of-the-job"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (point,) = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    assert point["values"]["reward/judge-qa/judged/mean"] == 1.0 and point["values"]["reward/judge-qa/mean"] == 1.0
    assert len(calls) == 4  # one verdict per rollout of the step
    assert {(authorization, model) for authorization, model, _ in calls} == {(f"Bearer {KEY}", "lab-judge")}
    assert all("Ground truth answer:" in prompt for _, _, prompt in calls)


def test_a_secret_missing_from_the_engine_or_one_of_labs_own_is_refused_before_the_bridge_starts(tmp_path):
    start = {"package_id": JUDGE, "python": Path("/nonexistent/python"), "site": tmp_path, "workdir": tmp_path}
    with pytest.raises(InvalidEnvironment) as missing:
        start_load_environment_bridge(**start, secret_names=["JUDGE_API_KEY"], environ={"PATH": "/usr/bin"})
    assert str(missing.value) == (
        f"environment {JUDGE} reads the secret JUDGE_API_KEY, which this job was not given: pass it as a job secret "
        "(-e JUDGE_API_KEY=... or an env file)"
    )
    for name in ("LAB_JOB_TOKEN", "HF_HUB_OFFLINE", "HOME"):
        with pytest.raises(InvalidEnvironment, match=f"the secret {name} is one of the engine's own variables"):
            start_load_environment_bridge(**start, secret_names=[name], environ={name: "x"})


# A hostile multi-turn environment: between the policy's turns its code writes down the environment
# it runs with. (The engine, its parent, is non-dumpable, so a process of its user cannot read its
# /proc/<pid>/environ either: tests/engine/test_roles.py checks every engine process.)
SNOOPING_GAME = '''
import json, os
import verifiers as vf
from datasets import Dataset


class SnoopingGame(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        with open("snooped.jsonl", "a") as out:
            out.write(json.dumps(dict(os.environ)) + "\\n")
        return [{"role": "user", "content": "again"}]


def load_environment(**kwargs):
    vf.ensure_keys(["JUDGE_API_KEY"])
    rows = Dataset.from_list([{"question": f"Play {n}.", "answer": "x"} for n in range(4)])
    return SnoopingGame(dataset=rows, rubric=vf.Rubric(funcs=[lambda completion, **k: 0.5]), max_turns=2)
'''


def test_environment_code_run_between_turns_sees_the_secrets_it_declares_and_nothing_else_of_the_engines(tmp_path, built):
    wheel = build_wheel("snooping-game", "0.1.0", files={"snooping_game.py": SNOOPING_GAME}, requires=["verifiers>=0.1.8", "datasets", "openai"])
    result = _engine(
        tmp_path, built, "acme/snooping-game@0.1.0", wheel, args={}, secrets=["JUDGE_API_KEY"],
        extra_env={"JUDGE_API_KEY": KEY, "OPENAI_API_KEY": "sk-another-secret-of-the-job", "LAB_JOB_TOKEN": "lab-token-of-the-job",
                   "DATABASE_URL": "postgres://lab:password@db/lab"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Written where the bridge runs: the folder of the organization's datasets (engine/dataset_snapshots.py).
    snooped = [json.loads(line) for line in (tmp_path / "work" / DATASETS_FOLDER / "snooped.jsonl").read_text().splitlines()]
    assert len(snooped) == 4  # each episode's one environment turn (max_turns 2)
    for environ in snooped:
        assert environ["JUDGE_API_KEY"] == KEY
        assert not [name for name in environ if name.startswith("LAB_") or name in ("OPENAI_API_KEY", "DATABASE_URL")]
