"""Adapter artifacts for real: web, a Celery worker, the local launcher and the engine train the
tiny model with ``[adapters] interval = 1``; the SDK and the CLI list and download the adapters
(SHA-256 checked), and the final one loads with ``peft`` on the tiny base and holds no optimizer
or trainer state. The ``adapter.ready`` webhook links to the download; another organization
sees none of it."""

from __future__ import annotations

import json

import httpx
import pytest
from labsdk import Lab
from labsdk.errors import NotFoundError

from jobs.webhooks.models import WebhookMessage
from tests.support.artifacts import TINY_JOB_SPEC
from tests.support.cli import lab_cli
from tests.support.stack import STACK_TEST_MARKS, running_stack, wait_for
from tests.support.tiny_lora import adapter_changes_predictions

pytestmark = STACK_TEST_MARKS

SPEC = {**TINY_JOB_SPEC, "seed": 5, "adapters": {"interval": 1, "keep_last": -1}}


def test_a_tiny_jobs_adapters_download_verified_and_load_with_peft(tmp_path, settings, owner, outsider):
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1", LAB_WEBHOOK_ALLOW_PRIVATE="1") as stack:
        with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
            hook = httpx.post(f"{stack.base_url}/api/v1/webhook-endpoints", headers={"Authorization": f"Bearer {owner.key}"},
                              json={"url": "http://127.0.0.1:9/never", "events": ["adapter.ready"]})
            assert hook.status_code == 201, hook.text
            job = lab.jobs.create(SPEC)
            assert not any("adapters" in warning for warning in job.warnings), job.warnings

            def finished():
                current = lab.jobs.retrieve(job.id)
                return current if current.status in {"succeeded", "failed", "cancelled"} else None

            done = wait_for(finished, timeout=300, what=f"{job.id} finished")
            assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
            adapters = wait_for(
                lambda: (found := lab.adapters.list(job.id)) and all(a.status == "ready" for a in found) and len(found) == 2 and found,
                timeout=30, what="two ready adapters",
            )
            assert [(a.step, a.status, a.format, a.attempt) for a in adapters] == [(2, "ready", "peft-lora", 1), (1, "ready", "peft-lora", 1)]
            final = adapters[0]
            (checkpoint,) = lab.checkpoints.list(job.id)
            assert final.size_bytes < checkpoint.size_bytes  # no optimizer state

            directory = lab.adapters.download(final.id, tmp_path / "adapter", progress=False)
            names = sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))
            assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(names)
            assert not any(name.startswith("trainer_state") or name.endswith(".pt") for name in names), names
            assert adapter_changes_predictions(directory)  # two steps at lr 1e-2 moved the adapter

            messages = sorted(
                (json.loads(body)["data"] for body in WebhookMessage.objects.filter(type="adapter.ready").values_list("body", flat=True)),
                key=lambda data: data["step"],
            )
            assert messages == [
                {"job_id": job.id, "adapter_id": a.id, "step": a.step, "download_url": f"{stack.base_url}/api/v1/adapters/{a.id}/download"}
                for a in reversed(adapters)
            ]

        listed = lab_cli("adapters", "list", job.id, "--json", key=owner.key, base_url=stack.base_url)
        assert listed.returncode == 0, listed.stderr
        assert [(a["id"], a["step"]) for a in json.loads(listed.stdout)] == [(a.id, a.step) for a in adapters]
        fetched = lab_cli("adapters", "download", adapters[1].id, "--dir", str(tmp_path / "cli"), key=owner.key, base_url=stack.base_url)
        assert fetched.returncode == 0, fetched.stderr
        assert fetched.stdout.strip() == str(tmp_path / "cli")
        assert (tmp_path / "cli" / "adapter_model.safetensors").is_file()
        foreign = lab_cli("adapters", "download", final.id, "--dir", str(tmp_path / "foreign"), key=outsider.key, base_url=stack.base_url)
        assert foreign.returncode == 1 and "(not_found)" in foreign.stderr
        assert not (tmp_path / "foreign").exists()
        with Lab(api_key=outsider.key, base_url=stack.base_url, timeout=30) as other:
            with pytest.raises(NotFoundError):
                other.adapters.list(job.id)
            with pytest.raises(NotFoundError):
                other.adapters.download(final.id, tmp_path / "other", progress=False)
