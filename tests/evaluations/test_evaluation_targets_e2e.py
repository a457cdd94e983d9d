"""Evaluations of an adapter, a deployment and an OpenAI-compatible endpoint run for real: web, a
Celery worker with beat, the local launcher and ``python -m engine evaluate`` on the tiny model,
against PostgreSQL and Redis (docs/evaluations.md). The adapter's weights come to the engine
through the ingest API; the deployment is Lab's own (the engine's serving role behind Lab's
OpenAI-compatible API), sampled by the engine as any endpoint; the endpoint is a real local HTTP
server answering as OpenAI does (tests/support/openai_server.py).
"""

from __future__ import annotations

import openai
from labsdk import Lab

from evaluations.models import Evaluation
from jobs.artifacts.kinds import ADAPTER
from jobs.models import LogLine
from tests.support.openai_server import openai_server, usage_of
from tests.support.serving import TINY, adapter_archive, ready_artifact_through
from tests.support.stack import STACK_TEST_MARKS, LabStack

pytestmark = STACK_TEST_MARKS

ENVIRONMENTS = [
    {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 2, "rollouts_per_example": 2},
    {"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 4}, "num_examples": 2},
]
SAMPLING = {"max_tokens": 5, "temperature": 0.0, "seed": 4}


def the_sum(body: dict) -> str:
    """What the outside endpoint answers: the sum an addition prompt asks for, else the prompt reversed."""
    prompt = body["messages"][-1]["content"]
    numbers = [int(word) for word in prompt.replace("?", " ").split() if word.isdigit()]
    return str(sum(numbers)) if len(numbers) == 2 else prompt[::-1]


def test_an_adapter_a_deployment_and_an_endpoint_are_evaluated_by_the_engine(owner, tmp_path, settings):
    stack = LabStack(tmp_path / "stack", SECRET_KEY=settings.SECRET_KEY, LAB_ENGINE_EGRESS_ALLOW_PRIVATE="1")
    settings.LAB_DATA_DIR = stack.data_dir
    stack.data_dir.mkdir(parents=True)
    stack.start_web()
    try:
        adapter_id = ready_artifact_through(stack.base_url, owner, ADAPTER, adapter_archive(0.5))
        stack.start_worker()
        lab = Lab(api_key=owner.key, base_url=stack.base_url)
        deployment = lab.deployments.wait(lab.deployments.create(adapter_id).id, timeout=240)
        assert deployment.status == "ready", stack.logs()
        with openai_server(the_sum) as server:
            adapter_eval = lab.evals.create(adapter=adapter_id, environments=ENVIRONMENTS, sampling=SAMPLING)
            deployment_eval = lab.evals.create(
                deployment=deployment.id, api_key_secret="DEPLOYMENT_KEY", secrets={"DEPLOYMENT_KEY": owner.key},
                environments=ENVIRONMENTS, sampling=SAMPLING,
            )
            endpoint_eval = lab.evals.create(
                endpoint={"base_url": server.base_url, "model": "acme/chat"}, api_key_secret="ACME_KEY",
                secrets={"ACME_KEY": server.key}, environments=ENVIRONMENTS, sampling=SAMPLING,
            )
            done = {evaluation.id: lab.evals.wait(evaluation.id, timeout=300, progress=False)
                    for evaluation in (adapter_eval, deployment_eval, endpoint_eval)}
        assert {evaluation.status for evaluation in done.values()} == {"succeeded"}, stack.logs()
        for evaluation in done.values():
            assert evaluation.progress == {"samples": 6, "expected_samples": 6}
            assert {name: result["samples"] for name, result in evaluation.results.items()} == {"lab/addition": 4, "lab/reverse-text": 2}

        adapted = Evaluation.objects.unscoped().select_related("job").get(public_id=adapter_eval.id)
        assert (done[adapter_eval.id].model, done[adapter_eval.id].base_model) == ({"type": "adapter", "id": adapter_id}, TINY)
        assert adapted.job.spec["eval"]["adapter"] == adapter_id
        assert LogLine.objects.filter(job=adapted.job, line__contains=f"with the weights of adapter {adapter_id}").exists()

        # The endpoint's samples are what it answered, with its usage; every request carried the key.
        samples = lab.evals.samples(endpoint_eval.id, limit=100)
        assert len(samples) == 6 == len(server.requests)
        assert {request["headers"]["Authorization"] for request in server.requests} == {f"Bearer {server.key}"}
        for sample in samples:
            answered = the_sum({"messages": sample.prompt})
            assert sample.completion == answered and sample.reward == 1.0
            usage = usage_of({"messages": sample.prompt}, answered)
            assert sample.tokens == {"prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"]}

        # The deployment's samples are what Lab's OpenAI API answers (greedy) for the same prompts.
        client = openai.OpenAI(base_url=f"{stack.base_url}/api/v1/openai/v1", api_key=owner.key)
        for sample in lab.evals.samples(deployment_eval.id, limit=100):
            answer = client.chat.completions.create(
                model=deployment.name, messages=sample.prompt, max_tokens=5, temperature=0.0, seed=4,
            )
            assert sample.completion == (answer.choices[0].message.content or "")
            assert sample.tokens == {"prompt": answer.usage.prompt_tokens, "completion": answer.usage.completion_tokens}
    finally:
        stack.stop()
