"""Admission on the Kubernetes pool: Lab checks the organization's cap and billing, and at
submit that the spec can ever fit the pool (LAB_POOL); order, room and placement are Kueue's."""

from __future__ import annotations

import pytest

from jobs.launchers import registry

from jobs.pipeline import reconciler
from jobs.admission import admission_pass
from jobs.models import Job
from jobs.services import job_submit
from lab.audit import Actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

POOL = {"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 1}, {"gpu_type": "cpu", "gpus": 0, "count": 1}]}


@pytest.fixture
def kubernetes(settings):
    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_POOL = POOL
    settings.LAB_POOL_CONFIGURED = True
    settings.LAB_LOCAL_SLOTS = 1
    settings.LAB_ORG_MAX_RUNNING_JOBS = 3


def submit(tenant, spec, **resources) -> Job:
    return job_submit(project=tenant.project, actor=Actor(user=tenant.user), data={**spec, "resources": resources})


def statuses(*jobs: Job) -> list[tuple[str, str]]:
    return [tuple(Job.objects.unscoped().filter(pk=job.pk).values_list("status", "status_reason").get()) for job in jobs]


def test_kueue_owns_room_so_lab_admits_up_to_the_organizations_cap(owner, spec, kubernetes):
    jobs = [submit(owner, spec, gpu_type="H100", gpus=8) for _ in range(4)]  # 32 GPUs asked of an 8-GPU pool

    admission_pass()

    assert statuses(*jobs) == [("starting", "")] * 3 + [("queued", "org_concurrency_limit")]


def test_the_local_pool_still_counts_room(owner, spec, settings):
    settings.LAB_POOL = POOL
    settings.LAB_ORG_MAX_RUNNING_JOBS = 3
    jobs = [submit(owner, spec, gpu_type="H100", gpus=8) for _ in range(2)]

    admission_pass()

    assert statuses(*jobs) == [("starting", ""), ("queued", "pool_full")]


@pytest.mark.parametrize("resources, param, message", [
    ({"gpu_type": "B200", "gpus": 8}, "resources.gpu_type", "the pool has no 'B200' nodes; available: H100, cpu"),
    ({"gpu_type": "H100", "gpus": 16}, "resources.gpus", "16 GPUs do not fit on one 'H100' node (at most 8)"),
])
def test_a_spec_that_can_never_fit_is_a_400_at_submit_and_creates_nothing(owner, spec, kubernetes, resources, param, message):
    response = owner.client().post("/api/v1/jobs", {**spec, "resources": resources}, format="json")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_spec", param)
    assert [problem["message"] for problem in error["errors"]] == [message]
    assert Job.objects.unscoped().count() == 0


def node(name: str, *, product: str = "", gpus: int = 0) -> dict:
    """A Node as the kubelet and NVIDIA's GPU feature discovery describe it."""
    labels = {"kubernetes.io/hostname": name, **({"nvidia.com/gpu.product": product} if product else {})}
    allocatable = {"cpu": "96", "memory": "1Ti", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": allocatable, "capacity": allocatable}}


@pytest.fixture
def cluster_nodes(monkeypatch, settings):
    """The Kubernetes pool without LAB_POOL: its inventory is read from the gateway fake's nodes."""
    from jobs import pool
    from jobs.launchers.kubernetes.launcher import KubernetesLauncher
    from jobs.launchers.kubernetes.objects import PoolSettings
    from tests.support.fake_gateway import FakeGateway

    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_POOL_CONFIGURED = False
    cluster = FakeGateway()
    for index in range(2):
        cluster.apply(node(f"h100-{index}", product="NVIDIA-H100-80GB-HBM3", gpus=8))
    cluster.apply(node("l4-0", product="NVIDIA-L4", gpus=1))
    cluster.apply(node("odd-0", product="NVIDIA-Future-GPU", gpus=4))
    cluster.apply(node("cpu-0"))
    launcher = KubernetesLauncher(gateway=cluster, settings=PoolSettings(), background=False)
    monkeypatch.setattr(pool, "get_launcher", lambda: launcher)
    monkeypatch.setattr(registry, "get_launcher", lambda: launcher)
    reconciler.reconcile_all()  # the worker's pass reads the nodes into the cache
    return cluster


def test_without_lab_pool_the_inventory_is_read_from_the_nodes_by_the_pass_not_at_submit(owner, spec, cluster_nodes):
    from jobs.pool import NodeGroup, pool_nodes

    assert pool_nodes() == [
        NodeGroup("H100", 8, 2, "NVIDIA-H100-80GB-HBM3"), NodeGroup("L4", 1, 1, "NVIDIA-L4"),
        NodeGroup("NVIDIA-Future-GPU", 4, 1, "NVIDIA-Future-GPU"), NodeGroup("cpu", 0, 1, ""),
    ]
    owner.client().post("/api/v1/jobs", {**spec, "resources": {"gpu_type": "H100", "gpus": 8}}, format="json")
    reconciler.reconcile_all()  # within CLUSTER_INVENTORY_TTL_S of the last read
    assert [call for call in cluster_nodes.calls if call == ("list", "Node")] == [("list", "Node")]


@pytest.mark.parametrize("resources, param, message", [
    ({"gpu_type": "B200", "gpus": 8}, "resources.gpu_type",
     "the pool has no 'B200' nodes; available: H100, L4, NVIDIA-Future-GPU, cpu"),
    ({"gpu_type": "H100", "gpus": 9}, "resources.gpus", "9 GPUs do not fit on one 'H100' node (at most 8)"),
    ({"gpu_type": "L4", "gpus": 2}, "resources.gpus", "2 GPUs do not fit on one 'L4' node (at most 1)"),
])
def test_a_spec_no_node_can_run_is_a_400_at_submit(owner, spec, cluster_nodes, resources, param, message):
    response = owner.client().post("/api/v1/jobs", {**spec, "resources": resources}, format="json")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_spec", param)
    assert [problem["message"] for problem in error["errors"]] == [message]
    assert Job.objects.unscoped().count() == 0


def test_a_spec_some_node_can_run_is_queued(owner, spec, cluster_nodes):
    response = owner.client().post("/api/v1/jobs", {**spec, "resources": {"gpu_type": "H100", "gpus": 8}}, format="json")

    assert response.status_code == 201, response.content
    assert Job.objects.unscoped().get().status == "queued"


def test_while_the_nodes_cannot_be_read_the_last_inventory_serves_else_kueue_decides(owner, spec, cluster_nodes):
    from django.core.cache import cache

    from jobs.pool import cluster_inventory_refresh

    cluster_nodes.fail("list", 503)
    assert cluster_inventory_refresh(force=True) is False
    refused = owner.client().post("/api/v1/jobs", {**spec, "resources": {"gpu_type": "H100", "gpus": 9}}, format="json")
    assert refused.status_code == 400  # by the last inventory read

    cache.clear()  # nothing was ever read
    accepted = owner.client().post("/api/v1/jobs", {**spec, "resources": {"gpu_type": "H100", "gpus": 9}}, format="json")
    assert accepted.status_code == 201, accepted.content  # Kueue says kueue_inadmissible later
    assert [call for call in cluster_nodes.calls if call == ("list", "Node")] == [("list", "Node")] * 2  # never at submit
