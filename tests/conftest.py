"""Shared fixtures: three tenants (an owner, a member of the same organization, an outsider).

Tests run against PostgreSQL and Redis when DATABASE_URL / REDIS_URL are set (CI sets them), and
on the embedded SQLite defaults otherwise.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from lab.audit import Actor
from lab.models import ApiKey, Membership, Organization, Project, Role, User
from lab.services import api_key_create, organization_create, user_sign_up
from tests.support.module_costs import TESTS_RECORD, costliest_first, recorded

PASSWORD = "correct-horse-battery-staple"

# Environment builds in the processes the tests start (a LabStack's worker) resolve against the
# local package index that `make package-index` fills, never a remote one (tests/environments/test_builds.py).
os.environ.setdefault("LAB_PACKAGE_INDEX_URL", (Path(__file__).resolve().parents[1] / "var" / "package-index" / "simple").as_uri())

#: Environment variables naming a Redis database, which each pytest-xdist worker gets its own of.
_REDIS_VARIABLES = ("REDIS_URL", "CELERY_BROKER_URL")
_REDIS_DATABASES = 16


def _worker_redis_url(url: str, worker: int, workers: int) -> str:
    """Return ``url`` with its database number moved to worker ``worker``'s own: each worker
    (0-based) takes the block of ``len(_REDIS_VARIABLES)`` databases after the previous one's,
    so a URL on database d goes to d + 2 × (worker + 1). Raises ValueError past database 15."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0) + len(_REDIS_VARIABLES) * (worker + 1)
    if database >= _REDIS_DATABASES:
        raise ValueError(
            f"{workers} pytest workers need Redis databases up to {database} for {url}; Redis has "
            f"{_REDIS_DATABASES}: use fewer workers (make test TEST_WORKERS=...) or a lower database"
        )
    return urlunsplit(parts._replace(path=f"/{database}"))


def pytest_xdist_setupnodes(config, specs) -> None:
    """Under pytest-xdist (``make test`` runs two workers), give each worker a Redis database of
    its own for the cache and the broker (a stack's broker is emptied when it starts, and tests
    clear the cache) and its own LAB_DATA_DIR. pytest-django already gives each worker its own
    test database (``test_<name>_gw<n>``). The variables reach a worker before Django's settings
    are read, through execnet's ``env:`` setting of its spec."""
    import os

    for worker, spec in enumerate(specs):
        for name in _REDIS_VARIABLES:
            if os.environ.get(name):
                spec.env[name] = _worker_redis_url(os.environ[name], worker, len(specs))
        if os.environ.get("LAB_DATA_DIR"):
            spec.env["LAB_DATA_DIR"] = os.path.join(os.environ["LAB_DATA_DIR"], f"gw{worker}")

#: A small valid spec on the tiny model (docs/spec.md).
TINY_SPEC = {
    "name": "addition-tiny",
    "model": "lab/tiny-random-llama",
    "max_steps": 3,
    "batch_size": 8,
    "rollouts_per_example": 4,
    "sampling": {"max_tokens": 8},
    "env": [{"id": "lab/addition", "args": {"max_operand": 9}}],
    "metadata": {"team": "research"},
}


@dataclass
class Tenant:
    """One user with an organization, its default project and a read-write API key."""

    user: User
    organization: Organization
    project: Project
    api_key: ApiKey
    key: str

    def client(self, key: str | None = None) -> APIClient:
        """Return an API client authenticated with this tenant's key (or ``key``)."""
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key or self.key}")
        return client


def make_tenant(email: str, organization_name: str) -> Tenant:
    """Sign up ``email``, create its organization (with project ``default``) and a key."""
    user = user_sign_up(email=email, password=PASSWORD)
    organization = organization_create(user=user, name=organization_name)
    project = organization.projects.get(slug="default")
    api_key, key = api_key_create(actor=Actor(user=user), project=project, name="test")
    return Tenant(user=user, organization=organization, project=project, api_key=api_key, key=key)


@pytest.fixture
def spec() -> dict:
    """A fresh copy of a small valid spec on the tiny model."""
    return copy.deepcopy(TINY_SPEC)


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    """Hash the passwords tests set with MD5 (microseconds) instead of PBKDF2 (0.7 s each on these
    machines): hundreds of tests sign users up. The default hashers stay listed, so a hash a Lab
    process made with them (``manage.py bootstrap_tenant`` in a subprocess) still verifies."""
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", *global_settings.PASSWORD_HASHERS]


@pytest.fixture(autouse=True)
def _clear_cache():
    cache.clear()
    yield


@pytest.fixture
def default_prices(db) -> None:
    """Seed the price table again: transactional tests empty every table, seeded rows included."""
    from billing.defaults import seed_default_prices
    from billing.models import Price

    seed_default_prices(Price)


@pytest.fixture
def owner(db) -> Tenant:
    """The owner of organization "Acme" with project "default"."""
    return make_tenant("owner@acme.test", "Acme")


@pytest.fixture
def member(owner: Tenant) -> User:
    """A plain member of the owner's organization."""
    user = user_sign_up(email="member@acme.test", password=PASSWORD)
    Membership.objects.create(organization=owner.organization, user=user, role=Role.MEMBER)
    return user


@pytest.fixture
def outsider(db) -> Tenant:
    """The owner of another organization, "Globex", who must never see Acme's objects."""
    return make_tenant("outsider@globex.test", "Globex")


@pytest.fixture
def no_broker(monkeypatch) -> list[tuple[str, int | None]]:
    """Drop the run pipeline's tasks instead of sending them to a broker (jobs.dispatch); returns
    what was enqueued, as ``(kind, id)`` pairs, for tests that check it."""
    from jobs import dispatch

    enqueued: list[tuple[str, int | None]] = []
    monkeypatch.setattr(dispatch, "enqueue_admission", lambda: enqueued.append(("admission", None)))
    monkeypatch.setattr(dispatch, "enqueue_launch", lambda attempt_id: enqueued.append(("launch", attempt_id)))
    monkeypatch.setattr(dispatch, "enqueue_reconcile", lambda job_id: enqueued.append(("reconcile", job_id)))
    return enqueued


@pytest.fixture
def commit_callbacks(db) -> None:
    """Run ``transaction.on_commit`` callbacks in a plain ``django_db`` test when the code's own
    outermost atomic block exits without error, as its commit would, and at once outside one
    (tests/support/commits.py). Modules take it with ``pytest.mark.usefixtures("commit_callbacks")``
    instead of ``django_db(transaction=True)``, which empties every table after each test."""
    from tests.support.commits import run_on_commit_callbacks

    with run_on_commit_callbacks():
        yield


@pytest.fixture
def wsgi_transport():
    """An httpx transport into Lab's WSGI application in this process (for ``labsdk.client.Lab``'s
    ``transport``): its views run on the test's connection, inside a plain ``django_db`` test's
    transaction. As Django's test client does, requests then leave ``close_old_connections`` out,
    which would close that connection (its autocommit is off) and end the transaction."""
    import httpx
    from django.core import signals
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    for signal in (signals.request_started, signals.request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield httpx.WSGITransport(app=get_wsgi_application())
    finally:
        for signal in (signals.request_started, signals.request_finished):
            signal.connect(close_old_connections)


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (moto) for one test module; buckets come from ``new_bucket()``."""
    from tests.support.s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("moto")).start()
    yield server
    server.stop()


@pytest.fixture
def bucket(s3_server, settings, monkeypatch) -> str:
    """A fresh bucket on ``s3_server`` that this process's checkpoint storage points at (prefix
    ``lab/checkpoints``)."""
    from tests.support.s3server import use_s3_storage

    name = s3_server.new_bucket()
    use_s3_storage(settings, monkeypatch, s3_server, name, "lab/checkpoints")
    return name


# --- Tiers by cost -------------------------------------------------------------------------------
# A test that starts a server (a sandbox agent included), a Celery worker, an engine process (the
# model check and the GPU check run the engine's code), an environment build, torchrun, vLLM, a
# browser, Lab's CLI or a child pytest is marked ``system`` here, at collection; ``make test-fast``
# leaves those out. A test is ``system`` when it carries a marker that already says so, uses one of
# the fixtures that start such a process, or lives in a module that starts them itself (listed
# with the reason).

#: Markers whose tests start processes: a live Lab, real engines, a browser.
SYSTEM_MARKERS = frozenset({"e2e", "browser", "real_model"})

#: Fixtures that start a server (directly or through the fixtures they use).
SYSTEM_FIXTURES = frozenset({
    "live_server",  # pytest-django's live server, in a thread of this process
    "asgi_url",  # uvicorn serving lab.asgi (tests/e2e/test_asgi_live.py)
    "s3_server",  # a moto S3 server subprocess (tests/support/s3server.py)
    "stack", "s3_stack",  # a LabStack: uvicorn, the Celery worker, beat, engines (tests/support/stack.py)
    "web",  # a LabStack's web process alone (tests/support/stream.py and the browser tests)
    "browser",  # headless Chromium
    "teacher_server",  # ``python -m engine inference`` (tests/support/engine.py)
    "make_up_environment",  # ``make up`` (tests/e2e/test_make_up.py)
    "agent",  # the session's sandbox agent, an ASGI server holding bubblewrap sandboxes (tests/sandboxes/conftest.py)
})

#: Modules whose tests start such processes themselves, relative to the repository root.
SYSTEM_MODULES = {
    "tests/bench/test_gpu_check.py": "runs bench/gpu_check.py's smoke step, the engine's training code, as a subprocess",
    "tests/engine/test_architectures_distributed.py": "runs torchrun",
    "tests/engine/test_adapters.py": "runs the engine CLI (tests/support/engine_cli.py)",
    "tests/engine/test_cli.py": "runs the engine CLI",
    "tests/engine/test_distill.py": "runs the engine and its inference role",
    "tests/engine/test_distributed.py": "runs torchrun",
    "tests/engine/test_init_from.py": "runs the engine CLI",
    "tests/engine/test_remote_inference.py": "runs engine roles",
    "tests/engine/test_roles.py": "runs the trainer, orchestrator and inference roles",
    "tests/engine/test_serving_vllm.py": "runs vLLM's engine for the serving role",
    "tests/engine/test_vllm_backend.py": "runs engine roles on vLLM",
    "tests/environments/test_builds.py": "runs environment builds: uv, a fresh virtual environment, the probe",
    "tests/environments/test_engine_packages.py": "runs the engine on uploaded packages",
    "tests/environments/test_envs_try.py": "runs lab envs try: the engine on environment packages, verifiers bridges",
    "tests/environments/test_example_multi_turn_package.py": "runs the engine on the example package",
    "tests/environments/test_example_package.py": "runs the engine on the example package",
    "tests/environments/test_example_verifiers_package.py": "runs the engine on the example package",
    "tests/environments/test_load_environment_judges.py": "builds an environment and runs the engine and its bridge on it",
    "tests/environments/test_load_environment_multi_turn.py": "builds an environment and runs the engine and its bridge on it",
    "tests/environments/test_load_environment_old_verifiers.py": "builds an environment and runs the engine and its bridge on it",
    "tests/environments/test_verifiers_multi_turn.py": "runs the engine in the verifiers environment",
    "tests/environments/test_verifiers_tasksets.py": "runs the engine in the verifiers environment",
    "tests/environments/test_verifiers_tools.py": "runs the engine in the verifiers environment",
    "tests/evaluations/test_evaluations_docs.py": "runs Lab's CLI as subprocesses against a live server",
    "tests/jobs/test_checkpoint_download_asgi.py": "starts a LabStack's web process",
    "tests/jobs/test_local_sandbox.py": "starts a LabStack and sandboxed engines",
    "tests/jobs/test_local_sandbox_judges.py": "starts the local launcher's supervisor and sandbox",
    "tests/jobs/test_model_add.py": "runs the engine's model check in bubblewrap",
    "tests/jobs/test_model_push.py": "runs the engine's model check in bubblewrap",
    "tests/jobs/test_reconciler_on_sqlite.py": "runs the reconciler's tests again in a child pytest",
    "tests/jobs/test_stream.py": "starts a LabStack's web process",
    "tests/jobs/test_stream_hostile.py": "starts a LabStack's web process",
    "tests/lab/test_embedded_defaults.py": "starts Lab's server on its embedded defaults",
    "tests/sandboxes/test_sandbox_pool.py": "starts three sandbox agents",
    "tests/sdk/test_prime_configs.py": "runs the engine on the prime configs",
    "tests/serving/test_servers.py": "starts inference servers (engine serving processes)",
    "tests/test_tiers.py": "runs child pytests collecting the suite",
    "tests/webhooks/test_stack.py": "starts a LabStack",
}


#: A test that took at least this many seconds in the recorded run (tests/support/test_costs.json,
#: two cores) is ``slow``: ``make test`` leaves it out, ``make test-slow`` runs it, and CI runs
#: both. Record a new run when tests are added or grow (tests/support/module_costs.py).
SLOW_TEST_S = 15.0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``system`` every collected test that starts a server, a worker, an engine or a browser,
    and ``slow`` every test that took :data:`SLOW_TEST_S` seconds or more when recorded, before
    ``-m`` selects by marker."""
    root = config.rootpath
    missing = [module for module in SYSTEM_MODULES if not (root / module).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py SYSTEM_MODULES names modules that do not exist: {missing}")
    slow = {test for test, seconds in recorded(TESTS_RECORD).items() if seconds >= SLOW_TEST_S}
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
        module = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if (
            module in SYSTEM_MODULES
            or any(item.get_closest_marker(name) for name in SYSTEM_MARKERS)
            or SYSTEM_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.system)


#: What a test of each tier costs on average, in seconds on two cores: the estimate for a module
#: tests/support/module_costs.json has no figure for.
SYSTEM_TEST_S, OTHER_TEST_S = 10.0, 0.2


class _CostliestModulesFirst:
    """Order the modules after every other plugin has (pytest-django groups its tests by database
    use, ``-m`` deselects): see :meth:`pytest_collection_modifyitems`."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        _costliest_modules_first(items)


def pytest_configure(config) -> None:
    config.pluginmanager.register(_CostliestModulesFirst(), "costliest-modules-first")


def _costliest_modules_first(items: list[pytest.Item]) -> None:
    """Order the modules by their cost, costliest first, keeping each module whole and in its order.

    ``make test`` hands whole modules to its xdist workers in collection order (``--dist loadfile
    --no-loadscope-reorder``): a long module handed out last would keep one worker busy while the
    other idles, so the long ones go first and the short ones fill in at the end. A module costs
    what tests/support/module_costs.py recorded for it, or is estimated from its tests' tiers."""
    if items:
        costliest_first(
            items,
            items[0].config.rootpath,
            recorded(),
            lambda item: SYSTEM_TEST_S if item.get_closest_marker("system") else OTHER_TEST_S,
        )
