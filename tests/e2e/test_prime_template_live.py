"""Prime's own hosted-training template (tests/sdk/data/prime/rl.toml) with every optional section
uncommented runs on Lab: submitted with ``lab jobs create -f rl.toml`` (its ``env_files`` read by
the CLI as the job's secrets), distilled (``loss = "sft"``) from a teacher endpoint, with eval,
[[eval.env]], val, adapters and checkpoints, and nothing the job produced holds the secret; and
the same file as an RL job (its [teacher] left out, a temperature schedule added), where the
template's zero_advantage batch filter acts and the temperature follows the schedule.

What the test changes in the file: the model and environment ids (to installed ones, as
Lab's docs say), the sizes (steps, batch, tokens, intervals: the template's are for a GPU
pool), the teacher's endpoint (the engine's own inference server on the tiny model, started
here, in place of OpenAI; the teacher model id becomes the tiny model with the others) and the warm-start checkpoint id (dropped: it names a checkpoint of Prime's).
"""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from labsdk import Lab

from tests.support.cli import lab_cli
from tests.support.engine import teacher_server  # noqa: F401  (a fixture)
from tests.support.prime_configs import TEMPLATE, installed, uncomment_everything
from tests.support.stack import running_stack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]

SECRET = "sk-prime-template-7d41c9"


def as_rl(text: str) -> str:
    """The uncommented template as an RL job: loss back to "rl", the [teacher] tables (which only
    "sft" takes) left out, and a temperature schedule in place of the fixed temperature."""
    text = text.replace('loss = "sft"', 'loss = "rl"', 1)
    text, count = re.subn(r"^\[teacher\].*?(?=^\[sampling\])", "", text, flags=re.S | re.M)
    assert count == 1
    text, count = re.subn(r"^temperature = 0\.7", 'temp_scheduler = { type = "linear", start_temperature = 1.0, '
                          "end_temperature = 0.5, total_steps = 3 }", text, flags=re.M)
    assert count == 1
    return text


def sized_for_the_tiny_model(text: str, teacher_url: str) -> str:
    """The uncommented template, with sizes a CPU test affords and the test's teacher endpoint."""
    replacements = [
        (r"^max_steps = \d+", "max_steps = 3"),
        (r"^batch_size = \d+", "batch_size = 8"),
        (r"^rollouts_per_example = \d+", "rollouts_per_example = 4"),
        (r"^max_inflight_rollouts = \d+", "max_inflight_rollouts = 8"),
        (r"^learning_rate = .*", "learning_rate = 1e-2"),
        (r'^checkpoint_id = ".*"\n', ""),
        (r"^max_tokens = \d+", "max_tokens = 6"),
        (r"^interval = 100 ", "interval = 3 "),
        (r"^interval = 100\n", "interval = 2\n"),
        (r"^num_examples = 64", "num_examples = 4"),
        (r"^num_examples = 30", "num_examples = 4"),
        (r"^interval = 5\n", "interval = 1\n"),
        (r'^args = \{ split = "train", max_examples = 1000 \}\n', ""),
    ]
    for pattern, replacement in replacements:
        text, count = re.subn(pattern, replacement, text, flags=re.M)
        assert count, f"the template no longer has {pattern!r}"
    return text.replace('base_url = "https://api.openai.com/v1"', f'base_url = "{teacher_url}/v1"')


@pytest.mark.parametrize("loss", ["sft", "rl"])
def test_primes_template_with_every_section_runs_on_the_tiny_model(tmp_path, settings, owner, teacher_server, loss):  # noqa: F811
    """sft: every section as the template has them (distilled from the teacher). rl: the same
    without [teacher], with a temperature schedule, so that the batch filter acts."""
    text = installed(uncomment_everything(TEMPLATE))
    spec_path = tmp_path / "rl.toml"
    spec_path.write_text(sized_for_the_tiny_model(text if loss == "sft" else as_rl(text), teacher_server))
    (tmp_path / "secrets.env").write_text(f"OPENAI_API_KEY={SECRET}\n")

    # The teacher serves on loopback, which a sandboxed engine may reach only when this allows it.
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1", LAB_ENGINE_EGRESS_ALLOW_PRIVATE="1") as stack:
        created = lab_cli("jobs", "create", "-f", str(spec_path), "--json", key=owner.key, base_url=stack.base_url)
        assert created.returncode == 0, created.stdout + created.stderr
        job_id = json.loads(created.stdout)["id"]
        with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
            job = lab.jobs.retrieve(job_id)
            warned = sorted({warning.split("'")[1] for warning in job.warnings if warning.startswith("'")})

            def finished():
                current = lab.jobs.retrieve(job_id)
                return current if current.status in {"succeeded", "failed", "cancelled"} else None

            done = wait_for(finished, timeout=600, what=f"{job_id} finished")
            assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
            points = {point.step: point.values for point in lab.jobs.metrics(job_id, limit=100)}
            adapters = wait_for(lambda: [a for a in lab.adapters.list(job_id) if a.status == "ready"], timeout=30, what="an adapter")
            checkpoints = lab.checkpoints.list(job_id)
            events = list(lab.jobs.events(job_id, limit=100))
            logs = list(lab.jobs.logs(job_id, limit=100))

    # Lab warns only for keys it does not use (none of the sections this test runs).
    assert not {"loss", "eval", "val", "adapters", "pre_batch_filters", "teacher"} & set(warned), job.warnings
    # skip_first_step = false: the base model is evaluated at step 0, before any update.
    assert sorted(points) == [0, 1, 2, 3]
    assert sorted(points[0]) == [  # the mean and each reward function's
        "eval/alphabet-sort/exact/mean", "eval/alphabet-sort/mean", "eval/alphabet-sort/position_accuracy/mean",
    ], points[0]
    assert "eval/alphabet-sort/mean" in points[2] and "eval/alphabet-sort/mean" not in points[1]
    every = {name for values in points.values() for name in values}
    assert {"loss/mean", "reward/mean", "eval/alphabet-sort/mean", "val/reverse-text/mean", "val/addition/mean"} <= every, sorted(every)
    if loss == "sft":
        assert "mismatch_kl/mean" not in every  # distillation: no importance ratio, no filters
        assert not any(name.startswith("filter/") for name in every)
    else:
        assert all("filter/zero_advantage/fraction" in points[step] for step in (1, 2, 3))
        assert [points[step]["sampling/temperature"] for step in (1, 2, 3)] == [1.0, 0.75, 0.5]
    assert [(a.step, a.format) for a in adapters] == [(3, "peft-lora")]  # [adapters] interval = 0: at the end only
    assert [c.step for c in checkpoints if c.status == "ready"] == [3]
    produced = json.dumps([done.to_dict(), [e.to_dict() for e in events], [line.to_dict() for line in logs]])
    assert ("distilling from lab/tiny-random-llama" in produced) == (loss == "sft")
    assert SECRET not in produced
