"""End to end: a ``vf.JudgeRubric`` environment (``judge-qa``) whose judge is a local
OpenAI-compatible server trains on the local launcher in its default bubblewrap sandbox, the
judge declared by the job (``[[env]] judge = { base_url, model }``), so the sandbox reaches it
through the supervisor's relay and the judge's reward is reported; the job's own key is what the
judge is sent. The build runs against the local package index (``make package-index``)."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from labsdk import Lab
from werkzeug import Request, Response

from tests.support.environments import build_ended, wait_finished
from tests.support.load_environment_wheels import fixture_wheel
from tests.support.packages import TINY, local_index_url
from tests.support.stack import running_stack

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]

KEY = "sk-judge-7311"


@pytest.fixture
def stack(tmp_path, settings):
    index = local_index_url()
    # The judge listens on loopback, which a job's relay refuses unless private addresses are allowed.
    env = {"LAB_ENGINE_THREADS": "1", "LAB_PACKAGE_INDEX_URL": index, "LAB_ENGINE_EGRESS_ALLOW_PRIVATE": "1"}
    with running_stack(tmp_path / "lab", settings, **env) as lab:
        yield lab


def test_a_judge_environment_trains_in_the_local_launchers_sandbox_reaching_the_judge_the_job_declares(
    stack, owner, tmp_path, httpserver
):
    assert stack.env.get("LAB_LOCAL_ISOLATION", "bubblewrap") == "bubblewrap"
    calls = []

    def judge(request: Request) -> Response:
        body = json.loads(request.data)
        calls.append((request.headers.get("Authorization"), body["model"]))
        answer = {
            "id": "j",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "yes"}, "finish_reason": "stop"}],
        }
        return Response(json.dumps(answer), content_type="application/json")

    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(judge)
    filename, data = fixture_wheel("judge-qa")
    (tmp_path / filename).write_bytes(data)
    headers = {"Authorization": f"Bearer {owner.key}"}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(tmp_path / filename).id == "acme/judge-qa@0.1.0"
        url = f"{stack.base_url}/api/v1/environments/acme/judge-qa@0.1.0"
        build = build_ended(url, headers)
        assert build["status"] == "ready", f"{build}\n{stack.logs()}"
        spec = {
            **TINY,
            "max_steps": 2,
            "env": [{"id": "acme/judge-qa", "judge": {"base_url": httpserver.url_for("/v1"), "model": "lab-judge"}}],
        }
        job = lab.jobs.create(spec, secrets={"JUDGE_API_KEY": KEY})
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        points = {point.step: point.values for point in lab.jobs.metrics(job.id, limit=100)}
    assert sorted(points) == [1, 2]
    assert {
        step: (values["reward/judge-qa/judged/mean"], values["reward/judge-qa/mean"]) for step, values in points.items()
    } == {
        1: (1.0, 1.0),
        2: (1.0, 1.0),
    }
    assert calls and set(calls) == {(f"Bearer {KEY}", "lab-judge")}
