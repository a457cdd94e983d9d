"""Log lines reach users without this server's paths: the data dir, the model cache, the
repository and the Python environment become placeholders when the lines are stored."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.conf import settings

from jobs.log_paths import path_hider, server_path_prefixes
from jobs.models import LogLine
from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]


def test_stored_and_served_lines_name_placeholders_not_server_paths(owner, spec):
    data_dir, python = Path(settings.LAB_DATA_DIR).resolve(), Path(sys.prefix).resolve()
    job = submit(owner, spec)
    engine = Engine(job)
    engine.running(0)
    sent = [
        f'  File "{python}/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1, in _call_impl',
        f"checkpoint written to {data_dir}/runs/{job.public_id}/attempt-1/work/checkpoints/step-000001",
        f'  File "{settings.BASE_DIR}/engine/trainer.py", line 400, in _checkpoint',
        "step 1 done: reward/mean 0.5 (/etc/hosts is not ours to hide)",
    ]
    engine.post("logs", {"attempt": 1, "lines": [
        {"seq": seq, "time": "2026-11-29T22:16:31Z", "stream": "stderr", "line": line} for seq, line in enumerate(sent)
    ]})

    stored = list(LogLine.objects.filter(job=job).order_by("source_seq").values_list("line", flat=True))
    served = [item["line"] for item in owner.client().get(f"/api/v1/jobs/{job.public_id}/logs").json()["data"]]

    assert stored == served == [
        '  File "<python>/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1, in _call_impl',
        f"checkpoint written to $LAB_DATA_DIR/runs/{job.public_id}/attempt-1/work/checkpoints/step-000001",
        '  File "<lab>/engine/trainer.py", line 400, in _checkpoint',
        "step 1 done: reward/mean 0.5 (/etc/hosts is not ours to hide)",
    ]


def test_the_model_cache_inside_the_data_dir_is_named_as_such(settings, tmp_path):
    settings.LAB_DATA_DIR = tmp_path / "var"
    settings.LAB_MODEL_DIR = tmp_path / "var" / "models"

    hide = path_hider()

    assert hide(f"loading {tmp_path}/var/models/lab/x and {tmp_path}/var/runs") == \
        "loading $LAB_MODEL_DIR/lab/x and $LAB_DATA_DIR/runs"
    assert [placeholder for _, placeholder in server_path_prefixes()][:2] == ["$LAB_MODEL_DIR", "$LAB_DATA_DIR"]


def test_a_prefix_as_short_as_usr_is_left_alone(settings):
    settings.LAB_DATA_DIR = Path("/usr")
    settings.LAB_MODEL_DIR = Path("/usr/models")

    assert "/usr" not in dict(server_path_prefixes())
