"""How the suite itself runs: on-commit callbacks in plain ``django_db`` tests, and which modules
still empty every table after each test.

``django_db(transaction=True)`` commits for real and truncates every table after each test, which
costs seconds per test on PostgreSQL. A test takes it only when another connection must see its
rows: threads, several connections racing on locks, or a server, worker or engine process (a
live server in a thread counts). Anything else is plain ``django_db`` with the
``commit_callbacks`` fixture (tests/support/commits.py) when it needs on-commit callbacks to run.
``TRANSACTIONAL_MODULES`` lists every module that still takes it, with the reason; it fails when
a module takes it without being listed or a listed module no longer does.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.db import transaction

from lab.models import Organization
from tests.support.commits import run_on_commit_callbacks
from tests.support.module_costs import costliest_first, record, recorded

ROOT = Path(__file__).resolve().parents[1]

THREADS = "runs code in threads that read its rows"
LIVE = "starts a server, worker or engine (or live_server) that reads its rows"
CONNECTIONS = "races several database connections on locks"

#: Test modules (and test support modules) that take ``django_db(transaction=True)``, with why.
TRANSACTIONAL_MODULES: dict[str, str] = {
    "tests/billing/test_balance_concurrency.py": THREADS,
    "tests/billing/test_ledger.py": THREADS,
    "tests/billing/test_ledger_batch.py": CONNECTIONS,
    "tests/billing/test_meter_events.py": THREADS,
    "tests/billing/test_spend_holds.py": THREADS,
    "tests/browser/test_deployment_playground_browser.py": LIVE,
    "tests/browser/test_evaluation_compare_browser.py": LIVE,
    "tests/browser/test_first_hour_pages_browser.py": LIVE,
    "tests/browser/test_job_page_axes_browser.py": LIVE,
    "tests/browser/test_job_pages_browser.py": LIVE,
    "tests/dashboard/test_deployment_pages.py": THREADS,  # the playground's async view reads in a thread
    "tests/dashboard/test_lockout.py": THREADS,
    "tests/e2e/conftest.py": LIVE,
    "tests/e2e/test_adapters_sdk.py": LIVE,
    "tests/e2e/test_api_fuzz.py": LIVE,
    "tests/e2e/test_asgi_live.py": LIVE,
    "tests/e2e/test_checkpoint_load_base_model.py": LIVE,
    "tests/e2e/test_checkpoints_sdk.py": LIVE,
    "tests/e2e/test_cli_live.py": LIVE,
    "tests/e2e/test_demo.py": LIVE,
    "tests/e2e/test_make_up.py": LIVE,
    "tests/e2e/test_model_push_e2e.py": LIVE,
    "tests/e2e/test_openapi_client.py": LIVE,
    "tests/e2e/test_outage_delivery.py": LIVE,
    "tests/e2e/test_prime_template_live.py": LIVE,
    "tests/e2e/test_restart_fails_again_cli.py": LIVE,
    "tests/e2e/test_roles_live.py": LIVE,
    "tests/e2e/test_sdk_live.py": LIVE,
    "tests/e2e/test_spec_check_env_args_cli.py": LIVE,
    "tests/environments/test_datasets_sdk.py": LIVE,
    "tests/environments/test_environment_versions.py": THREADS,
    "tests/environments/test_environments_e2e.py": LIVE,
    "tests/environments/test_environments_sdk.py": LIVE,
    "tests/environments/test_hub_datasets_e2e.py": LIVE,
    "tests/environments/test_load_environment_e2e.py": LIVE,
    "tests/environments/test_load_environment_judges_e2e.py": LIVE,
    "tests/environments/test_load_environment_old_verifiers_e2e.py": LIVE,
    "tests/environments/test_spec_init_environments.py": LIVE,
    "tests/environments/test_verifiers_e2e.py": LIVE,
    "tests/evaluations/test_evaluations_docs.py": LIVE,
    "tests/evaluations/test_evaluations_hostile.py": THREADS,
    "tests/evaluations/test_evaluations_sdk_cli.py": LIVE,
    "tests/jobs/test_admission.py": THREADS,
    "tests/jobs/test_checkpoint_download_asgi.py": LIVE,
    "tests/jobs/test_job_secrets_launch.py": LIVE,
    "tests/jobs/test_local_sandbox.py": LIVE,
    "tests/jobs/test_model_sdk.py": LIVE,
    "tests/jobs/test_reconciler.py": CONNECTIONS,
    "tests/jobs/test_run_pipeline.py": LIVE,
    "tests/jobs/test_stream.py": LIVE,
    "tests/jobs/test_stream_hostile.py": LIVE,
    "tests/prime/test_prime_cli_live.py": LIVE,
    "tests/prime/test_prime_env_push_live.py": LIVE,
    "tests/prime/test_prime_evals_push.py": THREADS,
    "tests/sandboxes/test_job_sandbox_key.py": LIVE,
    "tests/sandboxes/test_prime_sandboxes.py": LIVE,
    "tests/sandboxes/test_python_env_tool.py": LIVE,
    "tests/sandboxes/test_sandbox_billing.py": THREADS,
    "tests/sandboxes/test_verifiers_prime_runtime.py": LIVE,
    "tests/sandboxes/test_verifiers_runtime_rewards.py": LIVE,
    "tests/sandboxes/test_sandboxes_api.py": THREADS,
    "tests/sandboxes/test_sandboxes_sdk.py": LIVE,
    "tests/serving/test_dedicated_billing.py": THREADS,
    "tests/serving/test_deployments_sdk_cli.py": LIVE,
    "tests/serving/test_openai_api.py": THREADS,
    "tests/serving/test_serving_hostile.py": THREADS,
    "tests/support/stack.py": LIVE,
    "tests/webhooks/test_stack.py": LIVE,
}

def _commits_for_real(tree: ast.Module) -> bool:
    """True when the module marks anything ``django_db(transaction=True)`` or takes the
    ``transactional_db`` fixture."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "django_db" and any(
                keyword.arg == "transaction" and isinstance(keyword.value, ast.Constant) and keyword.value.value is True
                for keyword in node.keywords
            ):
                return True
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            argument.arg == "transactional_db" for argument in node.args.args
        ):
            return True
    return False


def test_only_the_listed_modules_commit_for_real():
    found = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("*.py")
        if _commits_for_real(ast.parse(path.read_text(encoding="utf-8")))
    }
    print(f"{len(found)} modules take django_db(transaction=True)")
    unlisted = sorted(found - set(TRANSACTIONAL_MODULES))
    stale = sorted(set(TRANSACTIONAL_MODULES) - found)
    assert not unlisted, (
        f"these modules take django_db(transaction=True) without a reason in TRANSACTIONAL_MODULES: "
        f"{unlisted}; use plain django_db with the commit_callbacks fixture unless another "
        f"connection must see the rows"
    )
    assert not stale, f"these modules no longer take django_db(transaction=True); remove them: {stale}"


@pytest.mark.django_db
class TestCommitCallbacks:
    """tests/support/commits.py runs callbacks where a real commit would."""

    def test_a_callback_runs_when_the_outermost_block_exits(self):
        ran = []
        with run_on_commit_callbacks():
            with transaction.atomic():
                transaction.on_commit(lambda: ran.append("outer"))
                with transaction.atomic():
                    transaction.on_commit(lambda: ran.append("inner"))
                assert ran == []
            assert ran == ["outer", "inner"]

    def test_a_rolled_back_block_drops_its_callbacks(self):
        ran = []
        with run_on_commit_callbacks():
            with transaction.atomic():
                transaction.on_commit(lambda: ran.append("kept"))
                with pytest.raises(ValueError), transaction.atomic():
                    transaction.on_commit(lambda: ran.append("dropped"))
                    raise ValueError
            with pytest.raises(ValueError), transaction.atomic():
                transaction.on_commit(lambda: ran.append("dropped"))
                raise ValueError
        assert ran == ["kept"]

    def test_a_callback_outside_a_transaction_runs_at_once(self):
        ran = []
        with run_on_commit_callbacks():
            transaction.on_commit(lambda: ran.append("now"))
            assert ran == ["now"]

    def test_a_callback_sees_the_committed_rows_and_may_register_more(self):
        seen = []

        def count() -> None:
            seen.append(Organization.objects.filter(name="Committed").count())
            with transaction.atomic():
                transaction.on_commit(lambda: seen.append("second"))

        with run_on_commit_callbacks(), transaction.atomic():
            Organization.objects.create(name="Committed", slug="committed")
            transaction.on_commit(count)
        assert seen == [1, "second"]

    def test_a_robust_callback_error_is_logged(self, caplog):
        ran = []
        with run_on_commit_callbacks(), transaction.atomic():
            transaction.on_commit(lambda: 1 / 0, robust=True)
            transaction.on_commit(lambda: ran.append("after"))
        assert ran == ["after"]
        assert "on_commit" in caplog.text

    def test_callbacks_are_dropped_again_after_the_block(self):
        ran = []
        with run_on_commit_callbacks():
            pass
        with transaction.atomic():
            transaction.on_commit(lambda: ran.append("never"))
        assert ran == []


def test_the_costliest_modules_run_first_each_whole_in_its_own_order(tmp_path):
    """make test hands whole modules to its workers in collection order: the recorded costliest
    module comes first, an unrecorded module is estimated from its tests, and no module is split."""
    report = (
        "9.0s call     tests/test_slow.py::test_a\n0.5s setup    tests/test_slow.py::test_a\n"
        "4.0s call     tests/test_slow.py::test_b[x y]\n0.9s teardown tests/test_slow.py::test_b[x y]\n"
        "0.1s call     tests/test_fast.py::test_a\n"
    )
    figures = record(report, tmp_path / "costs.json", tmp_path / "tests.json")
    assert figures == {"tests/test_fast.py": 0.1, "tests/test_slow.py": 14.4} and recorded(tmp_path / "costs.json") == figures
    assert recorded(tmp_path / "tests.json") == {"tests/test_slow.py::test_a": 9.5}  # only tests of 5 s or more

    def item(module: str, name: str, cost: float) -> SimpleNamespace:
        return SimpleNamespace(path=ROOT / module, name=name, cost=cost)

    items = [
        item("tests/test_fast.py", "a", 0.1),
        item("tests/test_slow.py", "a", 0.1),
        item("tests/test_unrecorded.py", "a", 8.0),
        item("tests/test_fast.py", "b", 0.1),
        item("tests/test_slow.py", "b", 0.1),
        item("tests/test_unrecorded.py", "b", 8.0),
    ]
    costliest_first(items, ROOT, figures, lambda it: it.cost)
    assert [(it.path.name, it.name) for it in items] == [
        ("test_unrecorded.py", "a"), ("test_unrecorded.py", "b"),
        ("test_slow.py", "a"), ("test_slow.py", "b"),
        ("test_fast.py", "a"), ("test_fast.py", "b"),
    ]
