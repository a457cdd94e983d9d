"""Deployments end to end through a running Lab (uvicorn and a Celery worker with beat,
tests/support/stack.py), with the real ``openai`` client (only ``base_url`` and ``api_key``
changed): two adapters of the tiny model and a full checkpoint of it, deployed with the CLI and the
SDK, answer chat and text completions, streamed and not; the two adapters share one server and the
checkpoint has its own; each request's tokens are billed once; another organization's key finds no
model; an idle server scales to zero and the next request wakes it; deleting stops the servers.

Backend: the engine's serving role on transformers (``python -m engine serve``), tiny model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest
from labsdk import Lab

from billing.models import TokenUsage
from jobs.artifacts.kinds import ADAPTER, CHECKPOINT
from jobs.launchers.local import process_alive
from serving.models import Deployment, InferenceServer, ServerStatus
from tests.support.cli import lab_cli
from tests.support.serving import TINY, adapter_archive, full_archive, ready_artifact_through
from tests.support.stack import STACK_TEST_MARKS, LabStack, wait_for

pytestmark = STACK_TEST_MARKS

MESSAGES = [{"role": "user", "content": "abc"}]
IDLE_S = 15


def engine_pid(server: InferenceServer) -> int:
    server.refresh_from_db()
    return int((Path(server.handle["workdir"]) / "engine.pid").read_text())


def test_deployments_serve_the_openai_client_share_servers_scale_to_zero_and_stop(owner, outsider, tmp_path, settings):
    stack = LabStack(tmp_path / "stack", SECRET_KEY=settings.SECRET_KEY, LAB_SERVING_IDLE_S=str(IDLE_S))
    settings.LAB_DATA_DIR = stack.data_dir
    stack.data_dir.mkdir(parents=True)
    stack.start_web()
    try:
        first = ready_artifact_through(stack.base_url, owner, ADAPTER, adapter_archive(0.5))
        second = ready_artifact_through(stack.base_url, owner, ADAPTER, adapter_archive(-0.5))
        full = ready_artifact_through(stack.base_url, owner, CHECKPOINT, full_archive(1), format="hf-full")
        stack.start_worker()

        deployed = lab_cli("deploy", first, "--wait", "--json", key=owner.key, base_url=stack.base_url)
        assert deployed.returncode == 0, deployed.stderr + stack.logs()
        one = json.loads(deployed.stdout)
        assert (one["status"], one["name"], one["openai_base_url"]) == ("ready", f"{TINY}:{first}", f"{stack.base_url}/api/v1/openai/v1")
        lab = Lab(api_key=owner.key, base_url=stack.base_url)
        two = lab.deployments.wait(lab.deployments.create(second).id, timeout=240)
        three = lab.deployments.wait(lab.deployments.create(full, name="tiny-full").id, timeout=240)
        names = [one["name"], two.name, three.name]

        servers = {row.public_id: row.server_id for row in Deployment.objects.unscoped().all()}
        assert servers[one["id"]] == servers[two.id] != servers[three.id]
        assert InferenceServer.objects.count() == 2

        client = openai.OpenAI(base_url=one["openai_base_url"], api_key=owner.key)
        assert sorted(model.id for model in client.models.list()) == sorted(names)
        reported = {name: [0, 0] for name in names}
        texts = {}
        for name in names:
            whole = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=6, temperature=0)
            assert whole.model == name and whole.choices[0].message.role == "assistant"
            chunks = list(client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=6, temperature=0, stream=True,
                                                         stream_options={"include_usage": True}))
            assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == whole.choices[0].message.content
            assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
            text = client.completions.create(model=name, prompt="abc", max_tokens=3, temperature=0)
            assert text.model == name and 1 <= text.usage.completion_tokens <= 3
            texts[name] = whole.choices[0].message.content
            for usage in (whole.usage, chunks[-1].usage, text.usage):
                reported[name][0] += usage.prompt_tokens
                reported[name][1] += usage.completion_tokens
        assert len(set(texts.values())) == 3, texts  # each serves its own weights

        # Each request on the ledger once, with the tokens its answer reported.
        assert TokenUsage.objects.unscoped().count() == 9
        for deployment_id, name in ((one["id"], names[0]), (two.id, names[1]), (three.id, names[2])):
            usage = lab.deployments.get(deployment_id).usage
            assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (3, *reported[name])

        # Another organization's key: every name is as unknown as a missing one.
        other = openai.OpenAI(base_url=one["openai_base_url"], api_key=outsider.key, max_retries=0)
        assert list(other.models.list()) == []
        for name in names:
            with pytest.raises(openai.NotFoundError) as refused:
                other.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2)
            assert refused.value.code == "model_not_found" and name in refused.value.message
        assert TokenUsage.objects.unscoped().count() == 9

        # Idle for LAB_SERVING_IDLE_S: scaled to zero, still ready; the next request starts it again.
        base = InferenceServer.objects.get(key=f"base:{TINY}")
        pid = engine_pid(base)
        wait_for(lambda: InferenceServer.objects.get(pk=base.pk).status == ServerStatus.STOPPED, timeout=IDLE_S + 60, what="scaled to zero")
        wait_for(lambda: not process_alive(pid), timeout=30, what="the server process gone")
        assert lab.deployments.get(two.id).status == "ready" and lab.deployments.get(two.id).server_status == "stopped"
        started = time.monotonic()
        woken = client.chat.completions.create(model=two.name, messages=MESSAGES, max_tokens=6, temperature=0)
        assert woken.choices[0].message.content == texts[two.name]
        base.refresh_from_db()
        assert (base.status, base.generation) == (ServerStatus.RUNNING, 2)
        print(f"woken in {time.monotonic() - started:.1f} s")

        # Deleting every deployment stops both servers.
        for deployment_id in (one["id"], two.id, three.id):
            deleted = lab_cli("deployments", "delete", deployment_id, key=owner.key, base_url=stack.base_url)
            assert deleted.returncode == 0, deleted.stderr
        wait_for(lambda: {row.status for row in Deployment.objects.unscoped().all()} == {"stopped"}, timeout=60, what="stopped")
        wait_for(lambda: set(InferenceServer.objects.values_list("status", flat=True)) == {ServerStatus.STOPPED}, timeout=60, what="servers stopped")
        for server in InferenceServer.objects.all():
            wait_for(lambda: not process_alive(engine_pid(server)), timeout=30, what=f"{server.public_id} gone")
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model=two.name, messages=MESSAGES, max_tokens=2)
    finally:
        stack.stop()
