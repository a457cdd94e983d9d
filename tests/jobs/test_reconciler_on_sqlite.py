"""The reconciler's passes on the embedded default database (SQLite), whichever database this run
uses: its pass tests run again in a child pytest with DATABASE_URL, REDIS_URL and
CELERY_BROKER_URL unset (lab/settings.py's embedded defaults), so every statement a pass runs
(the raw ``UPDATE ... FROM`` ones included: usage totals, ended attempts, stream numbers) is
checked on both databases; and the sandbox tests that query a JSON field by key (listing and bulk
deleting by label), which Django's ``contains`` lookup on PostgreSQL alone had made a 500 on
SQLite. Run directly on SQLite, those modules are already in the run."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from django.db import connection

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The tests of the reconciler's passes: exit codes and batching on a fake launcher, usage
#: closed and totals raised by a pass, jobs that ended finished together on the Kubernetes launcher.
PASS_TESTS = ("tests/jobs/test_reconciler.py", "tests/billing/test_reconciler_usage.py", "tests/k8s/test_reconcile_pass.py")
#: The queries of sandboxes by label (a JSON field's key): listing and bulk deleting by label.
LABEL_TESTS = tuple(
    f"tests/sandboxes/test_sandboxes_api.py::{name}" for name in (
        "test_it_lists_newest_first_by_label_with_a_cursor",
        "test_bulk_delete_stops_the_ids_named_and_the_active_ones_with_every_label",
        "test_bulk_delete_by_labels_alone_leaves_stopped_ones_out",
        "test_a_label_filter_whose_key_no_label_has_lists_none_and_deletes_none",
    )
)
#: What points a child at another database, broker or worker's share of them.
LEFT_OUT = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
            "PYTEST_ADDOPTS")


@pytest.mark.skipif(connection.vendor == "sqlite", reason="this run is on SQLite: the pass tests run in it directly")
def test_the_reconciler_pass_and_sandbox_label_tests_pass_on_sqlite(tmp_path):
    environment = {name: value for name, value in os.environ.items() if name not in LEFT_OUT}
    environment["LAB_DATA_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PASS_TESTS, *LABEL_TESTS],
        cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=540, check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1] and "skipped" not in done.stdout.splitlines()[-1]
