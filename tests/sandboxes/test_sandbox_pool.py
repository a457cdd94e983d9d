"""Sandboxes on the Kubernetes warm pool (``LAB_SANDBOX_RUNTIME=kubernetes``): the fake cluster
runs the pool's Deployment from k8s/sandbox-pool/pool.yaml with its ReplicaSet, and its pods
point at three real agent processes on this machine. A create claims a warm pod (nothing is
created on the hot path) and its commands go straight to that pod's agent; a delete deletes the
pod and the pool refills; two claims never get one pod; no warm pod is a 503 that changes
nothing; a claimed pod that goes loses its sandbox; an outsider still gets 404; each pod's agent
has a key of its own, and what signs with one pod's key opens nothing on another pod."""

from __future__ import annotations

import secrets
import threading
import time

import httpx
import pytest

from jobs.launchers.kubernetes.kinds import POD
from jobs.launchers.kubernetes.sandbox_pods import GatewayPods
from lab.models import AuditLogEntry
from sandboxes import placement, services
from sandboxes.agent import tokens
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import SandboxSpec
from sandboxes.runtime.pool import CLAIMED_AT, SANDBOX_LABEL, STATE_LABEL, SandboxPool, quantity
from sandboxes.tasks import reap_sandboxes
from tests.support.sandbox_agent import RunningAgent
from tests.support.sandbox_pool import CLUSTER_PATH, NAMESPACE, PoolCluster
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db]

BASE = "/api/v1/sandboxes"
SECRET = secrets.token_hex(32)


@pytest.fixture
def cluster(settings) -> PoolCluster:
    """A fresh pool of two Ready warm pods, each with its agent, and Lab pointed at it."""
    cluster = PoolCluster(secret=SECRET, replicas=2)
    try:
        cluster.ready_all()
        settings.LAB_SANDBOX_RUNTIME = "kubernetes"
        settings.LAB_SANDBOX_POOL_CLUSTER = CLUSTER_PATH
        settings.LAB_SANDBOX_POOL_NAMESPACE = NAMESPACE
        settings.LAB_SANDBOX_POOL_WAIT_S = 0
        settings.LAB_SANDBOX_AGENT_SECRET = SECRET
        yield cluster
    finally:
        cluster.close()


def spec(sandbox_id: str, **fields) -> SandboxSpec:
    return SandboxSpec(**{"sandbox_id": sandbox_id, "image": "python:3.11", "cpu_cores": 1.0, "memory_gb": 1.0, "disk_gb": 1.0, **fields})


def create(tenant, **body) -> httpx.Response:
    return tenant.client().post(BASE, body, format="json")


def data_plane(created: dict) -> httpx.Client:
    access = created["data_plane"]
    return httpx.Client(base_url=access["url"], headers={"Authorization": f"Bearer {access['token']}"}, timeout=60)


def held_by(agent: RunningAgent) -> frozenset[str]:
    return AgentRuntime(agent.url, secret=agent.secret.encode()).held()[1]


def test_a_create_claims_a_warm_pod_and_its_commands_go_straight_to_that_pods_agent(owner, cluster):
    warm_before = {pod["metadata"]["name"] for pod in cluster.warm()}
    answer = create(owner)
    assert answer.status_code == 201, answer.content
    created = answer.json()
    sandbox = Sandbox.objects.unscoped().get(public_id=created["id"])

    assert sandbox.status == SandboxStatus.RUNNING and sandbox.pod_name in warm_before
    pod = cluster.gateway.objects[("Pod", NAMESPACE, sandbox.pod_name)]
    assert (pod["metadata"]["labels"][STATE_LABEL], pod["metadata"]["labels"][SANDBOX_LABEL]) == ("claimed", sandbox.public_id)
    assert pod["metadata"]["ownerReferences"] == []  # its ReplicaSet let it go
    agent = cluster.agent_of(sandbox.pod_name)
    assert created["data_plane"]["url"] == agent.url == sandbox.agent_url
    assert [sandbox.public_id in held_by(other) for other in cluster.agents.values()] == [
        other is agent for other in cluster.agents.values()]
    with data_plane(created) as client:
        ran = client.post(f"/v1/sandboxes/{sandbox.public_id}/commands", json={"command": "echo from the pod"})
    assert (ran.status_code, ran.json()["stdout"]) == (200, "from the pod\n")
    logs = owner.client().get(f"{BASE}/{sandbox.public_id}/logs")
    assert "from the pod" in logs.json()["logs"]

    # No pod was created on the hot path: one list and one patch; the ReplicaSet made the new one.
    assert [call for call in cluster.gateway.calls if call[1] == "Pod"] == [("list", "Pod"), ("patch", "Pod")]
    warm_after = cluster.warm()
    assert len(warm_after) == 2 and sandbox.pod_name not in {item["metadata"]["name"] for item in warm_after}
    assert [item["status"]["phase"] for item in warm_after].count("Pending") == 1


def test_a_delete_deletes_the_pod_and_the_pool_refills(owner, cluster):
    created = create(owner).json()
    pod_name = Sandbox.objects.unscoped().get(public_id=created["id"]).pod_name
    agent = cluster.agent_of(pod_name)
    cluster.ready_all()  # the replacement becomes Ready

    assert owner.client().delete(f"{BASE}/{created['id']}").status_code == 204

    assert ("Pod", pod_name, None) in cluster.gateway.deletes
    assert cluster.gateway.objects[("Pod", NAMESPACE, pod_name)]["metadata"]["deletionTimestamp"]
    assert created["id"] not in held_by(agent)
    with data_plane(created) as client:
        assert client.post(f"/v1/sandboxes/{created['id']}/commands", json={"command": "true"}).status_code == 404
    assert sorted(pod["status"]["phase"] for pod in cluster.warm()) == ["Running", "Running"]
    # The next create claims one of the refilled pool's pods.
    again = create(owner)
    assert again.status_code == 201 and again.json()["status"] == "running"


def test_no_warm_pod_is_a_503_that_creates_nothing(owner, cluster):
    assert create(owner).status_code == 201 and create(owner).status_code == 201  # both warm pods
    rows, audit = Sandbox.objects.unscoped().count(), AuditLogEntry.objects.count()

    refused = create(owner)  # the replacements are still Pending

    assert refused.status_code == 503
    document = served_document()
    assert document["paths"]["/api/v1/sandboxes"]["post"]["responses"]["503"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
    assert_matches(document, "Error", refused.json())
    assert (refused.json()["error"]["code"], refused.headers["Retry-After"]) == ("sandbox_capacity", "5")
    assert (Sandbox.objects.unscoped().count(), AuditLogEntry.objects.count()) == (rows, audit)
    assert [pod["metadata"]["labels"][STATE_LABEL] for pod in cluster.warm()] == ["warm", "warm"]


def test_a_create_waits_a_short_while_for_a_pod_to_become_ready(owner, cluster, settings):
    create(owner), create(owner)
    settings.LAB_SANDBOX_POOL_WAIT_S = 10
    threading.Timer(0.5, cluster.ready_all).start()

    started = time.monotonic()
    answer = create(owner)

    assert answer.status_code == 201 and 0.4 < time.monotonic() - started < 10


def test_a_create_the_cap_refuses_claims_no_pod(owner, cluster, settings):
    settings.LAB_SANDBOX_MAX_PER_ORG = 1
    assert create(owner).status_code == 201
    cluster.ready_all()
    patches = cluster.gateway.calls.count(("patch", "Pod"))

    assert create(owner).status_code == 429
    assert cluster.gateway.calls.count(("patch", "Pod")) == patches
    assert [pod["metadata"]["labels"][STATE_LABEL] for pod in cluster.warm()] == ["warm", "warm"]


class RacingPods(GatewayPods):
    """Pods whose listing waits until ``parties`` claims have listed: every claim sees the same pods."""

    def __init__(self, gateway, *, parties: int) -> None:
        super().__init__(gateway, namespace=NAMESPACE)
        self.barrier = threading.Barrier(parties, timeout=10)

    def pods(self, labels):
        listed = super().pods(labels)
        self.barrier.wait()
        return listed


@pytest.mark.parametrize("parties", [2, 3])
def test_concurrent_claims_never_get_one_pod(parties):
    """Every claim lists the same warm pods and tries them in the same order: the patches carry
    the resourceVersion each was read at, so one wins each pod and the others move on."""
    cluster = PoolCluster(replicas=parties)
    for pod in cluster.pods():  # claims reach no agent: the pods need none
        cluster.gateway.ready_pod(NAMESPACE, pod["metadata"]["name"], ip="10.0.0.7")
    pool = SandboxPool(RacingPods(cluster.gateway, parties=parties), pools={"python:3.11": "python-3-11"},
                       shuffle=lambda pods: pods.sort(key=lambda pod: pod.name))
    claimed, errors = {}, []

    def claim(index: int) -> None:
        try:
            claimed[index] = pool.claim(spec(f"sbx_race{index}")).name
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=claim, args=(index,)) for index in range(parties)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == [] and len(set(claimed.values())) == parties
    for index, name in claimed.items():
        assert cluster.gateway.objects[("Pod", NAMESPACE, name)]["metadata"]["labels"][SANDBOX_LABEL] == f"sbx_race{index}"


def test_a_claimed_pod_that_goes_or_restarts_loses_its_sandbox(owner, cluster):
    first = create(owner).json()
    second = create(owner).json()
    assert reap_sandboxes() == 0  # both pods hold theirs
    gone = Sandbox.objects.unscoped().get(public_id=first["id"]).pod_name
    restarted = Sandbox.objects.unscoped().get(public_id=second["id"]).pod_name

    cluster.gateway.delete(POD, gone, NAMESPACE, grace_period_s=0)
    cluster.gateway.objects[("Pod", NAMESPACE, restarted)]["status"]["containerStatuses"][0]["restartCount"] = 1

    assert reap_sandboxes() == 2
    for created in (first, second):
        lost = Sandbox.objects.unscoped().get(public_id=created["id"])
        assert (lost.status, lost.error) == (SandboxStatus.FAILED, services.LOST_ERROR)
    assert ("Pod", restarted, None) in cluster.gateway.deletes
    assert AuditLogEntry.objects.filter(action="sandbox.lost").count() == 2


def test_the_reconcile_ends_nothing_while_the_cluster_does_not_answer(owner, cluster):
    created = create(owner).json()
    cluster.gateway.fail("list", 503)

    assert reap_sandboxes() == 0
    assert Sandbox.objects.unscoped().get(public_id=created["id"]).status == SandboxStatus.RUNNING


def test_the_reconcile_deletes_a_pod_claimed_long_ago_for_no_sandbox(cluster):
    young, old = (pod["metadata"]["name"] for pod in cluster.warm())
    for name, claimed_at in ((young, time.time() - 10), (old, time.time() - placement.ORPHAN_GRACE_S - 10)):
        pod = cluster.gateway.objects[("Pod", NAMESPACE, name)]
        cluster.gateway.patch(POD, name, NAMESPACE, {"metadata": {
            "labels": {STATE_LABEL: "claimed", SANDBOX_LABEL: f"sbx_{name}"}, "annotations": {CLAIMED_AT: str(int(claimed_at))},
            "resourceVersion": pod["metadata"]["resourceVersion"]}})

    reap_sandboxes()

    deleted = {name for kind, name, _ in cluster.gateway.deletes if kind == "Pod"}
    assert deleted == {old}


def test_an_outsider_gets_404_and_the_pod_stays_claimed(owner, outsider, cluster):
    created = create(owner).json()
    pod_name = Sandbox.objects.unscoped().get(public_id=created["id"]).pod_name

    for method, path in (("get", ""), ("delete", ""), ("post", "/auth"), ("get", "/logs")):
        assert getattr(outsider.client(), method)(f"{BASE}/{created['id']}{path}").status_code == 404

    assert cluster.gateway.deletes == []
    assert cluster.gateway.objects[("Pod", NAMESPACE, pod_name)]["metadata"]["labels"][SANDBOX_LABEL] == created["id"]


def test_a_sandbox_larger_than_the_pools_pods_or_wanting_egress_is_refused_and_claims_nothing(owner, cluster, settings):
    settings.LAB_SANDBOX_ALLOW_EGRESS = True
    too_large = create(owner, memory_gb=4)  # the pods' limit is 2Gi (k8s/sandbox-pool/pool.yaml)
    egress = create(owner, network="egress")  # the pool's pods have no egress, and no egress pool is named

    assert (too_large.status_code, too_large.json()["error"]["code"]) == (400, "invalid_request")
    assert "at most 2.0 cores and 2 GB" in too_large.json()["error"]["message"]
    assert (egress.status_code, egress.json()["error"]["param"]) == (400, "network")
    assert Sandbox.objects.unscoped().count() == 0 and ("patch", "Pod") not in cluster.gateway.calls


@pytest.mark.parametrize(("text", "value"), [("500m", 0.5), ("2", 2.0), ("2Gi", 2 * 2**30), ("512Mi", 2**29), ("1G", 1e9)])
def test_it_reads_kubernetes_quantities(text, value):
    assert quantity(text) == value


def test_a_sandbox_token_opens_nothing_on_another_organizations_pod(owner, outsider, cluster):
    mine, theirs = create(owner).json(), create(outsider).json()
    assert mine["data_plane"]["url"] != theirs["data_plane"]["url"]  # two pods, two agents
    token = {"Authorization": f"Bearer {mine['data_plane']['token']}"}
    for sandbox_id in (theirs["id"], mine["id"]):
        for method, path, body in (("post", "/commands", {"command": "id"}), ("get", "", None), ("delete", "", None),
                                   ("get", "/logs", None), ("post", "/files/read", {"path": "/etc/hostname"})):
            answer = httpx.request(method.upper(), f"{theirs['data_plane']['url']}/v1/sandboxes/{sandbox_id}{path}",
                                   json=body, headers=token, timeout=30)
            assert answer.status_code in (401, 403, 404), (sandbox_id, method, path, answer.status_code, answer.text)
    their_pod = Sandbox.objects.unscoped().get(public_id=theirs["id"])
    assert their_pod.status == SandboxStatus.RUNNING
    assert cluster.gateway.objects[("Pod", NAMESPACE, their_pod.pod_name)]["metadata"]["labels"][SANDBOX_LABEL] == theirs["id"]
    with httpx.Client(base_url=theirs["data_plane"]["url"], headers={"Authorization": f"Bearer {theirs['data_plane']['token']}"}) as own:
        ran = own.post(f"/v1/sandboxes/{theirs['id']}/commands", json={"command": "echo still mine"}, timeout=60)
    assert (ran.status_code, ran.json()["stdout"]) == (200, "still mine\n")


def _signed(key: str, sandbox_id: str, scope: str = tokens.SANDBOX_SCOPE) -> dict[str, str]:
    token = tokens.issue(key.encode(), sandbox_id=sandbox_id, scope=scope, expires_at=int(time.time()) + 600)
    return {"Authorization": f"Bearer {token}"}


def _answers(url: str, sandbox_id: str, headers: dict[str, str]) -> dict[str, int]:
    """What the agent at ``url`` answers each data-plane and control route of ``sandbox_id``."""
    calls = (("POST", f"/v1/sandboxes/{sandbox_id}/commands", {"json": {"command": "echo opened > /workspace/mark"}}),
             ("POST", f"/v1/sandboxes/{sandbox_id}/background", {"json": {"command": "sleep 60"}}),
             ("PUT", f"/v1/sandboxes/{sandbox_id}/files", {"params": {"path": "mark"}, "content": b"forged"}),
             ("GET", f"/v1/sandboxes/{sandbox_id}/files", {"params": {"path": "mark"}}),
             ("GET", f"/v1/sandboxes/{sandbox_id}/logs", {}),
             ("GET", f"/v1/sandboxes/{sandbox_id}", {}),
             ("DELETE", f"/v1/sandboxes/{sandbox_id}", {}),
             ("PUT", "/v1/sandboxes/sbx_planted", {"json": {"image": "python:3.11", "cpu_cores": 1, "memory_gb": 1, "disk_gb": 1,
                                                           "network": "none", "environment": {}, "expires_at": time.time() + 600}}),
             ("GET", "/v1/sandboxes", {}))
    return {f"{method} {path}": httpx.request(method, f"{url}{path}", headers=headers, timeout=30, **options).status_code
            for method, path, options in calls}


def test_each_pods_agent_has_its_own_key_and_one_pods_key_opens_nothing_on_another(owner, outsider, cluster):
    """Code that took over pod A's agent holds A's key (the file its init container wrote): every
    token it signs, for B's sandbox by id or a control token, is refused by B's agent, and B's key
    opens nothing on A; Lab's secret is in neither pod."""
    mine, theirs = create(owner).json(), create(outsider).json()
    pod_a = Sandbox.objects.unscoped().get(public_id=mine["id"])
    pod_b = Sandbox.objects.unscoped().get(public_id=theirs["id"])
    agent_a, agent_b = cluster.agent_of(pod_a.pod_name), cluster.agent_of(pod_b.pod_name)
    uid_a = cluster.gateway.objects[("Pod", NAMESPACE, pod_a.pod_name)]["metadata"]["uid"]
    assert pod_a.pod_uid == uid_a and agent_a is not agent_b
    assert len({agent_a.secret, agent_b.secret, SECRET}) == 3
    assert agent_a.secret == tokens.agent_key(SECRET.encode(), uid_a)
    # A's key is what A's agent checks: it opens A's own sandbox, so the refusals below are B's key check.
    with httpx.Client(base_url=agent_a.url, headers=_signed(agent_a.secret, mine["id"]), timeout=60) as own:
        assert own.post(f"/v1/sandboxes/{mine['id']}/commands", json={"command": "echo mine"}).json()["stdout"] == "mine\n"
    with httpx.Client(base_url=agent_b.url, headers={"Authorization": f"Bearer {theirs['data_plane']['token']}"}, timeout=60) as own:
        assert own.put(f"/v1/sandboxes/{theirs['id']}/files", params={"path": "mark"}, content=b"theirs").status_code == 200

    for headers in (_signed(agent_a.secret, theirs["id"]), _signed(agent_a.secret, "*", tokens.CONTROL_SCOPE),
                    _signed(agent_a.secret, theirs["id"], tokens.CONTROL_SCOPE)):
        assert set(_answers(agent_b.url, theirs["id"], headers).values()) == {401}
    for headers in (_signed(agent_b.secret, mine["id"]), _signed(agent_b.secret, "*", tokens.CONTROL_SCOPE)):
        assert set(_answers(agent_a.url, mine["id"], headers).values()) == {401}

    assert held_by(agent_b) == {theirs["id"]} and held_by(agent_a) == {mine["id"]}
    with httpx.Client(base_url=agent_b.url, headers={"Authorization": f"Bearer {theirs['data_plane']['token']}"}, timeout=60) as own:
        assert own.get(f"/v1/sandboxes/{theirs['id']}/files", params={"path": "mark"}).content == b"theirs"
        assert own.post(f"/v1/sandboxes/{theirs['id']}/commands", json={"command": "ls /workspace"}).json()["stdout"] == "mark\n"
    # Lab signs each sandbox's tokens with its own pod's key: /auth's token opens it, and only there.
    token = owner.client().post(f"{BASE}/{mine['id']}/auth").json()["token"]
    assert tokens.verify(agent_a.secret.encode(), token) is not None
    assert tokens.verify(agent_b.secret.encode(), token) is None and tokens.verify(SECRET.encode(), token) is None
