"""Dedicated deployments' servers on the billing ledger (docs/billing.md "Dedicated deployments"):
each run of a dedicated server billed its GPU-seconds at the serving GPU type's price once, in
the ledger's intervals, to its deployment (also when closed several times at once); shared
servers not billed by the second; the deployment's usage and ``/api/v1/usage?deployment_id=``
showing it to its own organization only; an organization with nothing left has its dedicated
servers stopped; and a real server run (the local runtime) billed from its launch to its stop."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

import pytest
from django.db import connection

from billing.accounts import BLOCKER_MESSAGES, account_for
from billing.metering import meter_value, owed_intervals
from billing.models import BillingAccount, Plan, UsageInterval
from lab.audit import Actor
from serving import servers
from serving.models import Deployment, DeploymentStatus, InferenceServer, ServerStatus, ServingMode
from serving.services import deployment_create, deployment_delete
from serving.usage import server_usage_close
from tests.support.artifacts import artifact_storage  # noqa: F401
from tests.support.billing import at_once
from tests.support.serving import TINY, ready_full_checkpoint

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("default_prices")]

T0 = datetime(2026, 11, 3, 12, 0, 0, tzinfo=dt_timezone.utc)
TRIAL = 10_000_000
#: 150 s of one H100 at the default $2.50 per GPU-hour: $0.1041666… → 104,167 micro-dollars.
COST_150_S = 104_167


@pytest.fixture
def billing_on(settings, monkeypatch):
    settings.STRIPE_API_KEY = "sk_test_lab"
    settings.LAB_USAGE_INTERVAL_S = 60
    settings.LAB_SERVING_GPU_TYPE = "H100"
    monkeypatch.setattr("billing.ledger.enqueue_meter_events", lambda: None)
    return settings


def dedicated(
    tenant,
    *,
    source="ckpt_billed",
    started=T0,
    seconds=150,
    status=ServerStatus.STOPPED,
    key=None,
    mode=ServingMode.DEDICATED,
):
    """A dedicated server row whose run lasted ``seconds`` from ``started`` (still running when
    ``seconds`` is None), with one deployment of ``tenant`` on it."""
    server = InferenceServer.objects.create(
        key=key or f"weights:{source}",
        model=TINY,
        served_model=source,
        status=status,
        generation=1,
        run_started_at=started,
        run_ended_at=None if seconds is None else started + timedelta(seconds=seconds),
    )
    deployment = Deployment.objects.create(
        organization=tenant.organization,
        project=tenant.project,
        name=f"{source}-{server.pk}",
        source_type="checkpoint",
        source_id=source,
        base_model=TINY,
        mode=mode,
        status=DeploymentStatus.READY,
        server=server,
    )
    return server, deployment


def ledger(server) -> list[tuple]:
    return list(
        UsageInterval.objects.unscoped()
        .filter(meter="server", attempt_id=server.pk)
        .order_by("index")
        .values_list(
            "index",
            "attempt_number",
            "resource_type",
            "started_at",
            "gpu_seconds",
            "cost_micro_usd",
            "deployment_public_id",
            "job_public_id",
        )
    )


def balance(tenant) -> int:
    return BillingAccount.objects.get(organization=tenant.organization).balance_micro_usd


def test_a_dedicated_server_run_is_billed_its_gpu_seconds_once_to_its_deployment(owner, billing_on):
    server, deployment = dedicated(owner)
    account_for(owner.organization.pk)
    server_usage_close(now=T0 + timedelta(hours=1))
    seconds = lambda n: T0 + timedelta(seconds=n)  # noqa: E731
    dep = deployment.public_id
    assert ledger(server) == [
        (0, 1, "H100", seconds(0), Decimal(60), 41_667, dep, ""),
        (1, 1, "H100", seconds(60), Decimal(60), 41_666, dep, ""),
        (2, 1, "H100", seconds(120), Decimal(30), 20_834, dep, ""),
    ]
    assert balance(owner) == TRIAL - COST_150_S
    server.refresh_from_db()
    assert server.run_billed
    assert server_usage_close(now=T0 + timedelta(hours=2)).closed == []
    InferenceServer.objects.filter(pk=server.pk).update(run_billed=False)
    assert server_usage_close(server_ids=[server.pk], now=T0 + timedelta(hours=2)).closed == []
    assert balance(owner) == TRIAL - COST_150_S
    # a second run (generation 2) is billed from its own start: the time between runs is not
    InferenceServer.objects.filter(pk=server.pk).update(
        generation=2, run_started_at=seconds(1000), run_ended_at=seconds(1090), run_billed=False
    )
    server_usage_close(now=T0 + timedelta(hours=3))
    assert [(index, number, start, gpu) for index, number, _, start, gpu, *_ in ledger(server)[3:]] == [
        (3, 2, seconds(1000), Decimal(60)),
        (4, 2, seconds(1060), Decimal(30)),
    ]


def test_a_running_dedicated_server_is_billed_by_whole_intervals(owner, billing_on):
    server, _ = dedicated(owner, seconds=None, status=ServerStatus.RUNNING)
    server_usage_close(now=T0 + timedelta(seconds=130))
    assert [(index, gpu) for index, _, _, _, gpu, *_ in ledger(server)] == [(0, Decimal(60)), (1, Decimal(60))]
    server.refresh_from_db()
    assert not server.run_billed


def test_on_a_cpu_pool_a_dedicated_server_is_billed_cpu_seconds_at_the_cpu_price(owner, billing_on):
    billing_on.LAB_SERVING_GPU_TYPE = "cpu"
    server, _ = dedicated(owner)
    server_usage_close(now=T0 + timedelta(hours=1))
    rows = UsageInterval.objects.unscoped().filter(attempt_id=server.pk, meter="server")
    assert set(rows.values_list("resource_type", "units", "gpu_seconds")) == {("cpu", Decimal(1), Decimal(0))}
    assert sum(row.cpu_seconds for row in rows) == 150
    assert sum(row.cost_micro_usd for row in rows) == 4_167  # $0.10 an hour for 150 s


def test_an_invoiced_organizations_server_seconds_are_owed_to_the_gpu_seconds_meter(owner, billing_on):
    BillingAccount.objects.filter(pk=account_for(owner.organization.pk).pk).update(plan=Plan.INVOICED)
    server, _ = dedicated(owner)
    server_usage_close(now=T0 + timedelta(hours=1))
    assert [(interval.attempt_id, meter_value(interval)) for interval in owed_intervals(100)] == [
        (server.pk, 60),
        (server.pk, 60),
        (server.pk, 30),
    ]
    assert balance(owner) == TRIAL


def test_shared_servers_are_not_billed_by_the_second(owner, billing_on):
    server, _ = dedicated(owner, key=f"base:{TINY}", mode=ServingMode.BASE)
    server_usage_close(now=T0 + timedelta(hours=1))
    assert not UsageInterval.objects.unscoped().exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL")
def test_closing_the_same_run_at_once_bills_each_interval_once(owner, billing_on):
    server, _ = dedicated(owner)
    account_for(owner.organization.pk)
    assert at_once(lambda: server_usage_close(server_ids=[server.pk], now=T0 + timedelta(hours=1)), threads=4) == []
    assert [row[0] for row in ledger(server)] == [0, 1, 2]
    assert balance(owner) == TRIAL - COST_150_S


def test_the_deployment_and_the_usage_api_show_it_to_its_organization_only(owner, outsider, billing_on):
    server, deployment = dedicated(owner)
    server_usage_close(now=T0 + timedelta(hours=1))
    usage = owner.client().get(f"/api/v1/deployments/{deployment.public_id}").json()["usage"]
    assert usage == {
        "requests": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "gpu_seconds": 150.0,
        "cpu_seconds": 0.0,
        "cost_usd": "0.10",
    }
    params = {
        "start": "2026-11-01",
        "end": "2026-12-01",
        "group_by": "deployment,resource",
        "deployment_id": deployment.public_id,
    }
    rows = owner.client().get("/api/v1/usage", params).json()["data"]
    assert rows == [
        {
            "deployment_id": deployment.public_id,
            "resource": "H100",
            "gpu_seconds": 150.0,
            "cpu_seconds": 0.0,
            "memory_gb_seconds": 0.0,
            "requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cost_usd": "0.104167",
        },
    ]
    jobs_only = (
        owner.client()
        .get("/api/v1/usage", {"start": "2026-11-01", "end": "2026-12-01", "group_by": "job"})
        .json()["data"]
    )
    assert [(row["job_id"], row["gpu_seconds"]) for row in jobs_only] == [(None, 150.0)]
    for answer in (
        outsider.client().get("/api/v1/usage", params),
        outsider.client().get(f"/api/v1/deployments/{deployment.public_id}"),
    ):
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "not_found"
    del params["deployment_id"]
    assert outsider.client().get("/api/v1/usage", params).json()["data"] == []


class _Runtime:
    """The runtime's edge: what Lab asked of it, and a server that has exited once stopped."""

    def __init__(self) -> None:
        self.stopped: list[dict] = []

    def stop(self, handle, *, force=False):
        self.stopped.append(handle)


def test_an_organization_with_nothing_left_has_its_dedicated_servers_stopped(owner, outsider, billing_on, monkeypatch):
    now = servers.timezone.now()
    mine, my_deployment = dedicated(
        owner, source="ckpt_mine", started=now - timedelta(seconds=61), seconds=None, status=ServerStatus.RUNNING
    )
    theirs, _ = dedicated(
        outsider, source="ckpt_theirs", started=now - timedelta(seconds=61), seconds=None, status=ServerStatus.RUNNING
    )
    InferenceServer.objects.update(handle={"pid": 1})
    BillingAccount.objects.filter(pk=account_for(owner.organization.pk).pk).update(
        balance_micro_usd=1_000
    )  # less than a minute costs
    account_for(outsider.organization.pk)
    fake = _Runtime()
    monkeypatch.setattr(servers, "runtime", lambda: fake)
    servers.bill_dedicated_servers(now=now)
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (mine.status, mine.status_reason) == (
        ServerStatus.STOPPING,
        f"Stopped: {BLOCKER_MESSAGES['insufficient_credit']}",
    )
    assert fake.stopped == [{"pid": 1}]
    assert theirs.status == ServerStatus.RUNNING
    assert balance(owner) == 0
    assert Deployment.objects.unscoped().get(pk=my_deployment.pk).status == DeploymentStatus.READY


@pytest.mark.usefixtures("artifact_storage")
def test_a_real_dedicated_server_is_billed_from_its_launch_to_its_stop(owner, billing_on, tmp_path):
    billing_on.LAB_DATA_DIR = tmp_path / "data"
    full = ready_full_checkpoint(owner)
    deployment = deployment_create(
        project=owner.project, actor=Actor(user=owner.user), data={"source": {"type": "checkpoint", "id": full}}
    )
    try:
        settle(lambda: Deployment.objects.unscoped().get(pk=deployment.pk).status == DeploymentStatus.READY)
        server = InferenceServer.objects.get(key=f"weights:{full}")
        assert server.run_started_at is not None and server.run_ended_at is None
        deployment_delete(deployment=Deployment.objects.unscoped().get(pk=deployment.pk), actor=Actor(user=owner.user))
        settle(lambda: InferenceServer.objects.get(pk=server.pk).status == ServerStatus.STOPPED)
        server.refresh_from_db()
        assert server.run_billed
        rows = UsageInterval.objects.unscoped().filter(meter="server", attempt_id=server.pk).order_by("index")
        ran = Decimal((server.run_ended_at - server.run_started_at) // timedelta(microseconds=1)) / 1_000_000
        assert sum(row.gpu_seconds for row in rows) == ran
        assert (rows.first().started_at, rows.last().ended_at) == (server.run_started_at, server.run_ended_at)
        assert set(rows.values_list("deployment_public_id", "resource_type", "project_id")) == {
            (deployment.public_id, "H100", owner.project.pk)
        }
    finally:
        for server in InferenceServer.objects.exclude(handle={}):
            servers.runtime().stop(server.handle, force=True)


def settle(predicate, *, timeout: float = 120.0) -> None:
    """Make serving passes until ``predicate()`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        servers.reconcile()
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(
        f"not settled within {timeout} s: {list(InferenceServer.objects.values('key', 'status', 'status_reason'))}"
    )
