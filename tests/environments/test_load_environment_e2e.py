"""End to end: a ``load_environment`` package written as Hub environments are (``verifiers>=0.1.0``,
a ``vf.SingleTurnEnv`` on an in-memory dataset, an XML parser, a two-function rubric) is pushed to
a running Lab, built against the local package index (``make package-index``; never a remote one),
and trains tiny-model jobs on its build, offline: both reward functions are reported, the second
job on the build finds its environment installed, and an argument ``load_environment`` does not
take is a 400 at submit. One that loads its dataset by name (``load_dataset("acme/arith")``)
builds and trains on the snapshot ``lab datasets push`` stored, offline. One on a real PyPI package,
``reasoning-gym``, whose closure has source archives only for three distributions, builds (wheels
made of them) and trains."""

from __future__ import annotations

import re

import httpx
import pytest
from django.db import connection
from labsdk import Lab

from tests.support.cli import lab_cli
from tests.support.environments import build_ended, wait_finished
from tests.support.load_environment_wheels import (
    ARITH_ROWS,
    arith_by_name_wheel,
    double_it_wheel,
    reasoning_gym_wheel,
)
from tests.support.packages import TINY, local_index_url
from tests.support.stack import running_stack

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]

#: The engine's line saying how long the build's environment took (engine.packages._start_on_build).
ON_BUILD = re.compile(r"runs on build \d+: its environment (installed|found installed) in ([\d.]+) s, its bridge started in ([\d.]+) s")


@pytest.fixture
def stack(tmp_path, settings):
    index = local_index_url()
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1", LAB_PACKAGE_INDEX_URL=index) as lab:
        yield lab


def _on_build(lab: Lab, job_id: str) -> tuple[str, float, float]:
    lines = [line.line for line in lab.jobs.logs(job_id, limit=500)]
    found = [match.groups() for line in lines if (match := ON_BUILD.search(line))]
    assert found, "\n".join(lines[-40:])
    how, install_s, bridge_s = found[0]
    return how, float(install_s), float(bridge_s)


def test_a_load_environment_package_trains_on_its_build_and_the_second_job_reuses_its_environment(stack, owner, tmp_path):
    filename, data = double_it_wheel()
    (tmp_path / filename).write_bytes(data)
    headers = {"Authorization": f"Bearer {owner.key}"}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(tmp_path / filename).id == "acme/double-it@0.1.0"
        url = f"{stack.base_url}/api/v1/environments/acme/double-it@0.1.0"
        build = build_ended(url, headers)
        assert build["status"] == "ready", f"{build}\n{stack.logs()}"

        refused = httpx.post(
            f"{stack.base_url}/api/v1/jobs", headers=headers,
            json={**TINY, "env": [{"id": "acme/double-it", "args": {"num_examples": 4, "level": 3}}]},
        )
        assert refused.status_code == 400, refused.text
        assert [(item["param"], item["code"]) for item in refused.json()["error"]["errors"]] == [("env.0.args.level", "unknown_key")]
        assert "load_environment takes num_examples" in refused.json()["error"]["message"]

        spec = {**TINY, "max_steps": 3, "env": [{"id": "acme/double-it", "args": {"num_examples": 6}}]}
        first = lab.jobs.create(spec)
        done = wait_finished(lab, stack, first.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        points = {point.step: point.values for point in lab.jobs.metrics(first.id, limit=100)}
        every = {name for values in points.values() for name in values}
        assert {"reward/double-it/mean", "reward/double-it/exact/mean", "reward/double-it/length_penalty/mean"} <= every, sorted(every)
        assert max(points) == 3
        samples = lab.jobs.samples(first.id, step=1)
        assert samples and samples[0].to_dict()["prompt"], samples  # the system prompt and question verifiers formatted

        # The second evaluates on its eval dataset too ([[eval.env]]: the dataset, since it has no eval_dataset).
        second = lab.jobs.create({**spec, "eval": {"interval": 2, "env": [{"id": "acme/double-it", "num_examples": 2}]}})
        assert wait_finished(lab, stack, second.id).status == "succeeded", stack.logs()
        evaluated = {name for point in lab.jobs.metrics(second.id, limit=100) for name in point.values}
        assert {"eval/double-it/exact/mean", "eval/double-it/length_penalty/mean"} <= evaluated, sorted(evaluated)
        first_how, first_install, first_bridge = _on_build(lab, first.id)
        second_how, second_install, second_bridge = _on_build(lab, second.id)
    assert (first_how, second_how) == ("installed", "found installed")
    assert second_install < 1.0, (first_install, second_install)
    print(f"\nenvironment start overhead: first job {first_install:.2f} s install + {first_bridge:.2f} s bridge, "
          f"second job {second_install:.2f} s + {second_bridge:.2f} s")


def test_an_environment_loading_its_dataset_by_name_builds_and_trains_on_the_pushed_snapshot(stack, owner, tmp_path):
    folder = tmp_path / "arith"
    folder.mkdir()
    (folder / "train.jsonl").write_text(ARITH_ROWS)
    filename, data = arith_by_name_wheel()
    (tmp_path / filename).write_bytes(data)
    pushed = lab_cli("datasets", "push", "acme/arith", str(folder), key=owner.key, base_url=stack.base_url)
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.strip() == "acme/arith: 1 file (train.jsonl)"
    headers = {"Authorization": f"Bearer {owner.key}"}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(tmp_path / filename).id == "acme/arith-by-name@0.1.0"
        url = f"{stack.base_url}/api/v1/environments/acme/arith-by-name@0.1.0"
        build = build_ended(url, headers)
        assert build["status"] == "ready", f"{build}\n{stack.logs()}"
        assert build["dataset_size"] == 12  # the pushed rows

        job = lab.jobs.create({**TINY, "max_steps": 2, "env": [{"id": "acme/arith-by-name"}]})
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        points = {point.step: point.values for point in lab.jobs.metrics(job.id, limit=100)}
        every = {name for values in points.values() for name in values}
        assert {"reward/arith-by-name/mean", "reward/arith-by-name/correct/mean", "reward/arith-by-name/brief/mean"} <= every, sorted(every)
        prompts = [str(sample.to_dict()["prompt"]) for sample in lab.jobs.samples(job.id, step=1)]
        assert prompts and all("What is " in prompt and " + " in prompt for prompt in prompts), prompts  # rows of the snapshot
    print(f"\nreward/arith-by-name/mean by step: { {step: values.get('reward/arith-by-name/mean') for step, values in sorted(points.items())} }")


def test_an_environment_on_reasoning_gym_builds_wheels_of_its_source_archives_and_trains(stack, owner, tmp_path):
    filename, data = reasoning_gym_wheel()
    (tmp_path / filename).write_bytes(data)
    headers = {"Authorization": f"Bearer {owner.key}"}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(tmp_path / filename).id == "acme/rg-arithmetic@0.1.0"
        url = f"{stack.base_url}/api/v1/environments/acme/rg-arithmetic@0.1.0"
        build = build_ended(url, headers, timeout=400)
        assert build["status"] == "ready", f"{build}\n{stack.logs()}"
        assert build["args"] == {"gym": "basic_arithmetic", "num_examples": 16, "seed": 0}
        log = httpx.get(f"{url}/build-log", headers=headers).text
        for archive in ("cellpylib-2.4.0.tar.gz", "pycosat-0.6.6.tar.gz", "zss-1.2.0.tar.gz"):
            assert f"from its source archive {archive}" in log, log

        job = lab.jobs.create({**TINY, "max_steps": 2, "env": [{"id": "acme/rg-arithmetic", "args": {"num_examples": 8}}]})
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        points = {point.step: point.values for point in lab.jobs.metrics(job.id, limit=100)}
        every = {name for values in points.values() for name in values}
        assert {"reward/rg-arithmetic/mean", "reward/rg-arithmetic/task_score/mean", "reward/rg-arithmetic/format_reward_func/mean"} <= every, sorted(every)
        assert max(points) == 2
        prompts = [str(sample.to_dict()["prompt"]) for sample in lab.jobs.samples(job.id, step=1)]
        assert prompts and all("<answer>" in prompt for prompt in prompts), prompts
    print(f"\nreward/rg-arithmetic/mean by step: { {step: values.get('reward/rg-arithmetic/mean') for step, values in sorted(points.items())} }")
