"""End to end: an environment written as Hub environments are (``load_dataset("someorg/tiny-math",
split="train")`` of a Hugging Face Hub dataset nobody pushed to Lab, a ``vf.SingleTurnEnv``, a
rubric) is pushed to a running Lab and built with the hub reachable (``HF_ENDPOINT``: a local
stand-in, ``HubServer``, which records every request), which fetches the dataset once and keeps it
beside the build; then a tiny-model job trains on the build while the hub is up, asking it
nothing, and another once it is gone. An environment with an eval dataset only builds, is
evaluated to the end, and a training job naming it is a 400 at submit. Builds resolve against the local package index
(``make package-index``), never a remote one."""

from __future__ import annotations

import httpx
import pytest
from django.db import connection
from labsdk import Lab

from tests.support.environments import build_ended, wait_finished
from tests.support.hub_datasets import (
    TINY_MATH,
    TINY_MATH_COMMIT,
    eval_only_wheel,
    tiny_math_repository,
    tiny_math_wheel,
)
from tests.support.model_dirs import HubServer
from tests.support.packages import TINY, local_index_url
from tests.support.stack import running_stack

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]


@pytest.fixture
def hub(tmp_path):
    with HubServer() as server:
        server.add(TINY_MATH, tiny_math_repository(tmp_path / "tiny-math"), commit=TINY_MATH_COMMIT, repo_type="dataset")
        yield server


@pytest.fixture
def stack(tmp_path, settings, hub):
    with running_stack(
        tmp_path / "lab", settings, LAB_ENGINE_THREADS="1", LAB_PACKAGE_INDEX_URL=local_index_url(), HF_ENDPOINT=hub.url,
    ) as lab:
        yield lab


def test_a_build_snapshots_the_hub_dataset_loading_fetched_and_jobs_train_on_it_offline(stack, hub, owner, tmp_path):
    filename, data = tiny_math_wheel()
    (tmp_path / filename).write_bytes(data)
    headers = {"Authorization": f"Bearer {owner.key}"}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(tmp_path / filename).id == "acme/tiny-math-env@0.1.0"
        url = f"{stack.base_url}/api/v1/environments/acme/tiny-math-env@0.1.0"
        build = build_ended(url, headers)
        assert build["status"] == "ready", f"{build}\n{stack.logs()}"
        assert build["dataset_size"] == 8
        assert build["hub_datasets"]["repositories"] == [TINY_MATH]
        assert 0 < build["hub_datasets"]["size_bytes"] < 1_000_000
        downloads = [request for request in hub.requests if request.startswith("GET /datasets/")]
        assert sorted(downloads) == [f"GET /datasets/{TINY_MATH}/resolve/{TINY_MATH_COMMIT}/data/{split}.jsonl" for split in ("test", "train")]
        asked = list(hub.requests)

        # The hub is up and answers, and the job asks it nothing: it loads the build's snapshot offline.
        job = lab.jobs.create({**TINY, "max_steps": 2, "env": [{"id": "acme/tiny-math-env"}]})
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        assert hub.requests == asked
        points = {point.step: point.values for point in lab.jobs.metrics(job.id, limit=100)}
        every = {name for values in points.values() for name in values}
        assert {"reward/tiny-math-env/mean", "reward/tiny-math-env/correct/mean", "reward/tiny-math-env/brief/mean"} <= every, sorted(every)
        prompts = [str(sample.to_dict()["prompt"]) for sample in lab.jobs.samples(job.id, step=1)]
        assert prompts and all("What is twice " in prompt for prompt in prompts), prompts  # rows of the Hub dataset

        hub.stop()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{hub.url}/api/datasets/{TINY_MATH}")
        again = lab.jobs.create({**TINY, "max_steps": 1, "env": [{"id": "acme/tiny-math-env"}]})
        done = wait_finished(lab, stack, again.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
    print(f"\nhub datasets snapshot: {build['hub_datasets']}; reward/tiny-math-env/mean by step: "
          f"{ {step: values.get('reward/tiny-math-env/mean') for step, values in sorted(points.items())} }")


def test_an_environment_with_an_eval_dataset_only_is_evaluated_and_refused_for_training(stack, owner, tmp_path):
    filename, data = eval_only_wheel()
    (tmp_path / filename).write_bytes(data)
    headers = {"Authorization": f"Bearer {owner.key}"}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(tmp_path / filename).id == "acme/sums-benchmark@0.1.0"
        build = build_ended(f"{stack.base_url}/api/v1/environments/acme/sums-benchmark@0.1.0", headers)
        assert build["status"] == "ready", f"{build}\n{stack.logs()}"

        refused = httpx.post(f"{stack.base_url}/api/v1/jobs", headers=headers, json={**TINY, "env": [{"id": "acme/sums-benchmark"}]})
        assert refused.status_code == 400, refused.text
        assert [(error["param"], error["code"]) for error in refused.json()["error"]["errors"]] == [("env.0.id", "no_train_dataset")]

        created = lab.evals.create(
            model=TINY["model"], environments=[{"id": "acme/sums-benchmark", "num_examples": 3}],
            sampling={"max_tokens": 4, "temperature": 0.7, "seed": 1},
        )
        done = lab.evals.wait(created.id, timeout=300, progress=False)
        assert done.status == "succeeded", f"{done}\n{stack.logs()}"
        (results,) = done.results.values()
        assert results["samples"] == 3, done.results
        assert "correct" in results["functions"], results
