"""What an engine pod on the Kubernetes pool may touch, since environment code (users' pushed
packages) runs in it: the pod's security context (its own user, no capability, the runtime's
seccomp profile, no host namespace, a read-only root with the work dir and /tmp writable and
every cache in the work dir), and the NetworkPolicies (the namespace's default deny of every
engine pod, and each attempt's own: its JobSet's pods, the DNS, Lab's web pods, nothing else),
for single and split attempts in per-organization and shared namespaces; created on launch
before the Secret and gone with the JobSet, with the gateway fake and with the real client
against a fake API server."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from werkzeug import Request, Response

from jobs.pipeline import launch, reconciler
from jobs.launchers.base import LaunchRequest
from jobs.launchers.kubernetes.gateway import ClusterError, KubernetesGateway
from jobs.launchers.kubernetes.kinds import NETWORK_POLICY
from jobs.launchers.kubernetes.launcher import KubernetesLauncher
from jobs.launchers.kubernetes.objects import (
    DEFAULT_ENGINE_EGRESS,
    PoolSettings,
    default_deny_object,
    jobset_name,
    jobset_object,
    network_policy_object,
)
from jobs.models import Job, JobAttempt, JobStatus
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from lab.lib.http import UnsafeURL
from tests.k8s.validation import validate
from tests.support.fake_gateway import FakeGateway, kubernetes_pool

ROOT = Path(__file__).resolve().parents[2]
JOB_ID = "job_0123456789abcdefghij"
OTHER_JOB_ID = "job_zyxwvutsrqponmlkjihg"
NAME = jobset_name(JOB_ID, 1)
SETTINGS = PoolSettings(shared_pvc="lab-shared")
DNS = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
               "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
       "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
LAB_WEB = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "lab-system"}},
                   "podSelector": {"matchLabels": {"app.kubernetes.io/name": "lab-web"}}}],
           "ports": [{"protocol": "TCP", "port": 8000}]}
OWN_PODS = {"podSelector": {"matchLabels": {"lab.dev/job-id": JOB_ID, "lab.dev/attempt": "1"}}}
INFERENCE_PORT = [{"protocol": "TCP", "port": 8100}]


def request(**changes) -> LaunchRequest:
    fields = {"job_id": JOB_ID, "attempt": 1, "spec": {"model": "Qwen/Qwen3-0.6B", "max_runtime_minutes": 60},
              "lab_url": "http://lab-web.lab-system.svc:8000", "token": "t", "bootstrap_token": "ljb_bootstrap",
              "organization": "acme", "namespace": "lab-acme", "gpu_type": "H100", "gpus": 1}
    return LaunchRequest(**{**fields, **changes})


def stored(jobset: dict, uid: str = "uid-jobset") -> dict:
    return {**jobset, "metadata": {**jobset["metadata"], "uid": uid}}


def pods(jobset: dict) -> dict[str, dict]:
    """Return each role's pod template (metadata and spec)."""
    return {job["name"]: job["template"]["spec"]["template"] for job in jobset["spec"]["replicatedJobs"]}


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


ATTEMPTS = [
    pytest.param({}, ("engine",), id="single, per organization"),
    pytest.param({"gpus": 2}, ("inference", "orchestrator", "trainer"), id="split, per organization"),
    pytest.param({"namespace": "lab-jobs"}, ("engine",), id="single, shared namespace"),
    pytest.param({"namespace": "lab-jobs", "gpus": 4}, ("inference", "orchestrator", "trainer"), id="split, shared namespace"),
    pytest.param({"gpu_type": "cpu", "gpus": 0}, ("engine",), id="cpu"),
]


# --- the pod ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("changes", "roles"), ATTEMPTS)
def test_every_engine_pod_runs_unprivileged_with_a_read_only_root(changes, roles):
    templates = pods(jobset_object(request(**changes), SETTINGS))

    assert tuple(templates) == roles
    for role, template in templates.items():
        pod = template["spec"]
        container = pod["containers"][0]
        assert pod["securityContext"] == {
            "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        }, role
        assert container["securityContext"] == {
            "privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }, role
        assert (pod["hostNetwork"], pod["hostPID"], pod["hostIPC"], pod["shareProcessNamespace"]) == (False, False, False, False)
        assert (pod["automountServiceAccountToken"], pod["enableServiceLinks"]) == (False, False)
        assert "serviceAccountName" not in pod and "hostAliases" not in pod


@pytest.mark.parametrize(("changes", "roles"), ATTEMPTS)
def test_what_the_engine_writes_lands_on_its_own_empty_dirs(changes, roles):
    for role, template in pods(jobset_object(request(**changes), SETTINGS)).items():
        pod = template["spec"]
        container = pod["containers"][0]
        env = {entry["name"]: entry.get("value") for entry in container["env"]}
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        writable = {mount["mountPath"]: volumes[mount["name"]] for mount in container["volumeMounts"] if not mount.get("readOnly")}
        assert writable["/var/lab/work"] == {"name": "work", "emptyDir": {}}, role
        assert writable["/tmp"] == {"name": "tmp", "emptyDir": {}}, role
        assert writable["/dev/shm"] == {"name": "shm", "emptyDir": {"medium": "Memory"}}, role
        assert set(writable) == ({"/var/lab/work", "/tmp", "/dev/shm", "/lab/shared"} if role in ("orchestrator", "trainer")
                                 else {"/var/lab/work", "/tmp", "/dev/shm"}), role
        assert (env["HOME"], env["XDG_CACHE_HOME"]) == ("/var/lab/work/home", "/var/lab/work/home/.cache"), role
        assert (env["VLLM_NO_USAGE_STATS"], env["DO_NOT_TRACK"], env["HF_HUB_OFFLINE"]) == ("1", "1", "1"), role


@pytest.mark.parametrize("dockerfile", ["engine-cpu.Dockerfile", "engine-gpu.Dockerfile"])
def test_the_engine_images_run_as_the_pods_user_and_write_nothing_beside_their_code(dockerfile):
    text = (ROOT / "k8s" / "images" / dockerfile).read_text()

    assert "useradd --uid 1000" in text and text.rstrip().splitlines()[-2] == "USER 1000"
    # No bytecode written next to the code at run time, nor a pip cache under the (read-only) home.
    assert "PYTHONDONTWRITEBYTECODE=1" in text and "PIP_NO_CACHE_DIR=1" in text


# --- the NetworkPolicies ----------------------------------------------------------------------


def test_a_single_engine_takes_no_connection_and_reaches_only_the_dns_and_lab():
    attempt = request()
    jobset = stored(jobset_object(attempt, SETTINGS))
    policy = network_policy_object(attempt, SETTINGS, owner=jobset)

    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    assert policy["metadata"] == {
        "name": NAME, "namespace": "lab-acme",
        "labels": {"app.kubernetes.io/managed-by": "lab", "app.kubernetes.io/component": "engine",
                   "lab.dev/job-id": JOB_ID, "lab.dev/attempt": "1", "lab.dev/organization": "acme"},
        "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": NAME, "uid": "uid-jobset",
                             "controller": True, "blockOwnerDeletion": True}],
    }
    assert policy["spec"] == {
        "podSelector": OWN_PODS["podSelector"],
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [DNS, LAB_WEB],
    }
    validate(policy)


def test_a_split_attempts_roles_reach_each_other_on_the_inference_port_only():
    attempt = request(gpus=2)
    policy = network_policy_object(attempt, SETTINGS, owner=stored(jobset_object(attempt, SETTINGS)))

    assert policy["spec"] == {
        "podSelector": OWN_PODS["podSelector"],
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [OWN_PODS], "ports": INFERENCE_PORT}],
        "egress": [{"to": [OWN_PODS], "ports": INFERENCE_PORT}, DNS, LAB_WEB],
    }
    validate(policy)


@pytest.mark.parametrize(("changes", "roles"), ATTEMPTS)
def test_each_attempts_policy_selects_its_own_pods_and_no_other_attempts(changes, roles):
    """Two organizations' attempts side by side in one namespace (or each in its own): neither
    policy selects, nor lets through, the other's pods."""
    mine, theirs = request(**changes), request(**{**changes, "job_id": OTHER_JOB_ID, "organization": "globex"})
    policy = network_policy_object(mine, SETTINGS, owner=stored(jobset_object(mine, SETTINGS)))
    my_pods = [template["metadata"]["labels"] for template in pods(jobset_object(mine, SETTINGS)).values()]
    their_pods = [template["metadata"]["labels"] for template in pods(jobset_object(theirs, SETTINGS)).values()]
    later_attempt = [template["metadata"]["labels"] for template in pods(jobset_object(request(**changes, attempt=2), SETTINGS)).values()]
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    peers += [peer for rule in policy["spec"]["egress"] for peer in rule["to"] if "namespaceSelector" not in peer]

    assert len(my_pods) == len(roles)
    assert all(selects(policy["spec"]["podSelector"], labels) for labels in my_pods)
    assert not any(selects(policy["spec"]["podSelector"], labels) for labels in their_pods + later_attempt)
    for peer in peers:  # a peer without a namespace selector is in the policy's namespace: only this JobSet's pods
        assert all(selects(peer["podSelector"], labels) for labels in my_pods)
        assert not any(selects(peer["podSelector"], labels) for labels in their_pods + later_attempt)
    assert policy["metadata"]["namespace"] == mine.namespace


def test_the_operators_egress_rules_replace_the_default_and_are_not_shared():
    store = {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"protocol": "TCP", "port": 443}]}
    settings = replace(SETTINGS, engine_egress=(LAB_WEB, store))
    attempt = request()

    policy = network_policy_object(attempt, settings, owner=stored(jobset_object(attempt, settings)))
    policy["spec"]["egress"][-1]["ports"][0]["port"] = 80  # a caller changing its copy

    assert policy["spec"]["egress"][:2] == [DNS, LAB_WEB]
    assert store["ports"] == [{"protocol": "TCP", "port": 443}]
    assert list(DEFAULT_ENGINE_EGRESS) == [LAB_WEB] and PoolSettings().engine_egress == DEFAULT_ENGINE_EGRESS


def test_the_namespaces_default_deny_selects_every_engine_pod_and_allows_nothing():
    policy = default_deny_object("lab-jobs")

    assert policy == {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "lab-engine-default-deny", "namespace": "lab-jobs", "labels": {"app.kubernetes.io/managed-by": "lab"}},
        "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "lab", "app.kubernetes.io/component": "engine"}},
                 "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []},
    }
    for changes, _ in (param.values for param in ATTEMPTS):
        for template in pods(jobset_object(request(**changes), SETTINGS)).values():
            assert selects(policy["spec"]["podSelector"], template["metadata"]["labels"])
    assert not selects(policy["spec"]["podSelector"], {"app.kubernetes.io/name": "minio"})  # an operator's own pod
    validate(policy)


# --- launching and cleaning up, with the gateway fake -----------------------------------------


def launcher_on(cluster, **settings) -> KubernetesLauncher:
    return KubernetesLauncher(gateway=cluster, settings=replace(SETTINGS, **settings), background=False)


@pytest.mark.parametrize(("changes", "roles"), ATTEMPTS)
def test_a_launch_creates_the_attempts_policy_and_its_cleanup_removes_it(changes, roles):
    cluster = FakeGateway()
    launcher = launcher_on(cluster, shared_namespace="lab-jobs" if changes.get("namespace") == "lab-jobs" else "")
    attempt = request(**changes)

    handle = launcher.launch(attempt)

    namespace = attempt.namespace
    jobset = cluster.jobset(namespace, NAME)
    policy = cluster.objects[("NetworkPolicy", namespace, NAME)]
    expected = network_policy_object(attempt, launcher.settings, owner=jobset)
    assert {key: policy[key] for key in expected} == {**expected, "metadata": {**expected["metadata"], **{
        key: policy["metadata"][key] for key in ("uid", "creationTimestamp", "resourceVersion")}}}
    assert policy["metadata"]["ownerReferences"][0]["uid"] == jobset["metadata"]["uid"]
    assert cluster.objects[("NetworkPolicy", namespace, "lab-engine-default-deny")]["spec"]["egress"] == []
    applied = [kind for call, kind in cluster.calls if call == "apply"]
    assert applied == ["Namespace", "LocalQueue", "NetworkPolicy", "JobSet", "NetworkPolicy", "Secret"]

    launcher.cleanup(handle)

    assert sorted(key for key in cluster.objects if key[1] == namespace) == [
        ("LocalQueue", namespace, "lab"), ("NetworkPolicy", namespace, "lab-engine-default-deny")]


def test_the_default_deny_is_made_once_per_namespace_and_a_repeated_launch_makes_nothing_twice():
    cluster = FakeGateway()
    launcher = launcher_on(cluster)

    launcher.launch(request())
    launcher.launch(request())  # a retried task: every create answers 409
    launcher.launch(request(job_id=OTHER_JOB_ID))
    launcher.launch(request(job_id="job_aaaaaaaaaaaaaaaaaaaa", organization="globex", namespace="lab-globex"))

    policies = sorted((namespace, name) for kind, namespace, name in cluster.objects if kind == "NetworkPolicy")
    assert policies == [("lab-acme", "lab-engine-default-deny"), ("lab-acme", NAME),
                        ("lab-acme", jobset_name(OTHER_JOB_ID, 1)), ("lab-globex", "lab-engine-default-deny"),
                        ("lab-globex", jobset_name("job_aaaaaaaaaaaaaaaaaaaa", 1))]
    applied = [kind for call, kind in cluster.calls if call == "apply"]
    assert applied.count("NetworkPolicy") == 2 + 4 and cluster.conflicts == 3  # JobSet, policy, Secret again


def test_without_its_policy_an_attempt_gets_no_secret_so_no_pod_of_it_runs_until_a_relaunch():
    cluster = FakeGateway()
    launcher = launcher_on(cluster)
    apply = cluster.apply

    def refuse_the_attempts_policy(obj):
        if obj["kind"] == "NetworkPolicy" and obj["metadata"]["name"] == NAME:
            raise ClusterError(403, 'networkpolicies.networking.k8s.io is forbidden')
        return apply(obj)

    cluster.apply = refuse_the_attempts_policy
    with pytest.raises(ClusterError):
        launcher.launch(request())

    assert ("JobSet", "lab-acme", NAME) in cluster.objects  # suspended in Kueue: its pods need the Secret
    assert ("Secret", "lab-acme", NAME) not in cluster.objects
    assert ("NetworkPolicy", "lab-acme", "lab-engine-default-deny") in cluster.objects
    cluster.apply = apply
    launcher.launch(request())
    assert ("NetworkPolicy", "lab-acme", NAME) in cluster.objects and ("Secret", "lab-acme", NAME) in cluster.objects


# --- the real client against a fake API server ------------------------------------------------


class FakeAPIServer:
    """The API server's create (409 for a name taken), get and delete, over a dict of objects by
    URL path, with the garbage collector's Background propagation (a deleted object's dependents,
    by ``ownerReferences`` uid, go too); every request is recorded as ``(method, path)``."""

    def __init__(self):
        self.objects: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.deletes: list[dict] = []
        self._uids = itertools.count(1)

    def __call__(self, request: Request) -> Response:
        self.requests.append((request.method, request.path))
        if request.method == "POST":
            body = request.get_json()
            path = f"{request.path}/{body['metadata']['name']}"
            if path in self.objects:
                return self._status(409, "AlreadyExists")
            body["metadata"]["uid"] = f"uid-{next(self._uids)}"
            self.objects[path] = body
            return Response(json.dumps(body), status=201, content_type="application/json")
        if request.method == "GET":
            found = self.objects.get(request.path)
            return Response(json.dumps(found), content_type="application/json") if found else self._status(404, "NotFound")
        if request.method == "DELETE":
            self.deletes.append(request.get_json())
            gone = self.objects.pop(request.path, None)
            if gone is None:
                return self._status(404, "NotFound")
            self._collect(gone["metadata"]["uid"])
            return self._status(200, "Success")
        return self._status(405, "MethodNotAllowed")

    def _collect(self, uid: str) -> None:
        for path, obj in list(self.objects.items()):
            if any(owner["uid"] == uid for owner in obj["metadata"].get("ownerReferences") or []):
                del self.objects[path]
                self._collect(obj["metadata"]["uid"])

    @staticmethod
    def _status(code: int, reason: str) -> Response:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Success" if code < 300 else "Failure", "code": code, "reason": reason}
        return Response(json.dumps(body), status=code, content_type="application/json")


@pytest.mark.parametrize("shared", [False, True], ids=["per organization", "shared namespace"])
def test_the_real_client_creates_the_policies_before_the_secret_and_the_jobsets_deletion_takes_them_away(httpserver, shared):
    api = FakeAPIServer()
    httpserver.expect_request(re.compile(r"^/.*$")).respond_with_handler(api)
    configuration = client.Configuration()
    configuration.host = httpserver.url_for("/").rstrip("/")
    configuration.api_key = {"authorization": "Bearer test-token"}
    namespace = "lab-jobs" if shared else "lab-acme"
    launcher = KubernetesLauncher(gateway=KubernetesGateway(configuration, max_retries=0),
                                  settings=replace(SETTINGS, shared_namespace="lab-jobs" if shared else ""), background=False)
    attempt = request(gpus=2, namespace=namespace)
    policies = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    jobsets = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"

    handle = launcher.launch(attempt)

    assert api.requests == [
        ("POST", "/api/v1/namespaces"),
        ("POST", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/localqueues"),
        ("POST", policies),
        ("POST", jobsets),
        ("POST", policies),
        ("POST", f"/api/v1/namespaces/{namespace}/secrets"),
    ]
    jobset = api.objects[f"{jobsets}/{NAME}"]
    policy = api.objects[f"{policies}/{NAME}"]
    assert policy == {**network_policy_object(attempt, launcher.settings, owner=jobset),
                      "metadata": {**network_policy_object(attempt, launcher.settings, owner=jobset)["metadata"],
                                   "uid": policy["metadata"]["uid"]}}
    assert policy["metadata"]["ownerReferences"][0]["uid"] == jobset["metadata"]["uid"] == "uid-4"
    assert api.objects[f"{policies}/lab-engine-default-deny"]["spec"]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/managed-by": "lab", "app.kubernetes.io/component": "engine"}}
    validate(policy)

    launcher.cleanup(handle)

    assert api.requests[-1] == ("DELETE", f"{jobsets}/{NAME}")
    assert api.deletes == [{"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}]
    assert sorted(api.objects) == sorted([
        f"/api/v1/namespaces/{namespace}", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/localqueues/lab",
        f"{policies}/lab-engine-default-deny"])
    assert launcher.gateway.get(NETWORK_POLICY, NAME, namespace) is None


# --- the setting ------------------------------------------------------------------------------


def test_lab_k8s_engine_egress_defaults_to_labs_web_pods_and_reaches_the_launcher(settings):
    from jobs.launchers.registry import kubernetes_pool_settings
    from lab.settings import LAB_K8S_ENGINE_EGRESS

    assert LAB_K8S_ENGINE_EGRESS == [LAB_WEB] == list(DEFAULT_ENGINE_EGRESS)
    store = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "169.254.0.0/16"]}}],
             "ports": [{"protocol": "TCP", "port": 443}]}
    settings.LAB_K8S_ENGINE_EGRESS = [LAB_WEB, store]
    assert kubernetes_pool_settings().engine_egress == (LAB_WEB, store)


@pytest.mark.parametrize("value", [
    '{"to": []}',
    "[{}]",  # a rule with no "to" and no "ports" lets everything out
    '[{"to": []}]',  # so does an empty "to"
    '[{"ports": []}]',
    '[{"to": [{}]}]',
    '[{"to": [{"podSelector": {}}], "from": []}]',
    '[{"to": [{"ipBlok": {"cidr": "10.0.0.0/8"}}]}]',
    '[{"ports": [{"port": 443, "protocl": "TCP"}]}]',
    '[{"to": {"podSelector": {}}}]',
    "not json",
])
def test_lab_k8s_engine_egress_refuses_what_would_open_everything_or_is_not_a_rule(monkeypatch, value):
    from django.core.exceptions import ImproperlyConfigured

    from lab.settings import _engine_egress

    monkeypatch.setenv("LAB_K8S_ENGINE_EGRESS", value)

    with pytest.raises(ImproperlyConfigured, match="LAB_K8S_ENGINE_EGRESS"):
        _engine_egress("LAB_K8S_ENGINE_EGRESS")


def test_lab_k8s_engine_egress_takes_pod_namespace_and_ip_block_rules(monkeypatch):
    from lab.settings import _engine_egress

    rules = [LAB_WEB, {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}, {"ports": [{"protocol": "TCP", "port": 443, "endPort": 444}]}]
    monkeypatch.setenv("LAB_K8S_ENGINE_EGRESS", json.dumps(rules))

    assert _engine_egress("LAB_K8S_ENGINE_EGRESS") == rules


def test_the_example_overlays_egress_is_taken_and_its_policy_validates(monkeypatch):
    from lab.settings import _engine_egress

    patch = yaml.safe_load((ROOT / "k8s" / "overlays" / "example" / "config-patch.yaml").read_text())
    monkeypatch.setenv("LAB_K8S_ENGINE_EGRESS", patch["data"]["LAB_K8S_ENGINE_EGRESS"])
    rules = _engine_egress("LAB_K8S_ENGINE_EGRESS")
    settings = replace(SETTINGS, engine_egress=tuple(rules))
    attempt = request(namespace="lab-jobs")

    policy = network_policy_object(attempt, settings, owner=stored(jobset_object(attempt, settings)))

    assert rules[0] == LAB_WEB and len(rules) == 3  # Lab's web pods, the ingress controller's, the object store
    assert policy["spec"]["egress"] == [DNS, *rules]
    validate(policy)


# --- through the reconciler -------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("commit_callbacks")
@pytest.mark.usefixtures("no_broker")
def test_a_jobs_attempt_is_confined_from_its_launch_until_its_jobset_is_gone(owner, spec, monkeypatch, settings):
    cluster = FakeGateway()
    kubernetes_pool(settings, monkeypatch, cluster, nodes=[{"gpu_type": "H100", "gpus": 8, "count": 1}], shared_pvc="lab-shared")
    spec["resources"] = {"gpu_type": "H100", "gpus": 2}
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)

    launch.attempt_launch(attempt_id=attempt.pk)

    name = JobAttempt.objects.get(pk=attempt.pk).handle["jobset"]
    namespace = JobAttempt.objects.get(pk=attempt.pk).handle["namespace"]
    policy = cluster.objects[("NetworkPolicy", namespace, name)]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"lab.dev/job-id": job.public_id, "lab.dev/attempt": "1"}}
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": policy["spec"]["podSelector"]}], "ports": INFERENCE_PORT}]
    cluster.admit(namespace, name)
    cluster.run(namespace, name)
    for pod in (obj for (kind, _, _), obj in cluster.objects.items() if kind == "Pod"):
        assert selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    cluster.exit(namespace, name, 1, role="trainer")  # a crash; the JobSet goes, the next attempt gets a new one
    reconciler.reconcile_job(job_id=job.pk)

    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED
    assert ("JobSet", namespace, name) not in cluster.objects
    assert ("NetworkPolicy", namespace, name) not in cluster.objects
    assert ("NetworkPolicy", namespace, "lab-engine-default-deny") in cluster.objects


def test_the_real_client_creates_a_policy_that_allows_the_judges_the_job_declares_and_refuses_a_private_one(httpserver):
    """Each judge endpoint the job declares (``[[env]] judge``) is allowed on its port at the
    addresses its host resolves to at launch; a ``judge_base_url`` the job does not declare is not,
    nor is Lab's own origin (a deployment as the judge: the operator's rules allow it already);
    a judge at a private address is refused before anything is created."""
    api = FakeAPIServer()
    httpserver.expect_request(re.compile(r"^/.*$")).respond_with_handler(api)
    configuration = client.Configuration()
    configuration.host = httpserver.url_for("/").rstrip("/")
    configuration.api_key = {"authorization": "Bearer test-token"}
    launcher = KubernetesLauncher(gateway=KubernetesGateway(configuration, max_retries=0), settings=SETTINGS, background=False)
    lab_judge = "http://lab-web.lab-system.svc:8000/api/v1/openai/v1"
    spec = {
        "model": "Qwen/Qwen3-0.6B", "max_runtime_minutes": 60,
        "env": [
            {"id": "acme/judge-qa", "judge": {"base_url": "https://93.184.215.14:8443/v1"},
             "args": {"judge_base_url": "https://93.184.215.14:8443/v1"}},
            {"id": "acme/other", "args": {"judge_base_url": "https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/v1"}},
        ],
        "eval": {"env": [
            {"id": "acme/judge-qa", "judge": {"base_url": "http://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/v1"},
             "args": {"judge_base_url": "http://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/v1"}},
            {"id": "acme/judge-qa", "judge": {"deployment": "dep_1", "api_key_var": "K"}, "args": {"judge_base_url": lab_judge}},
        ]},
    }
    attempt = request(spec=spec)

    launcher.launch(attempt)

    policy = api.objects[f"/apis/networking.k8s.io/v1/namespaces/lab-acme/networkpolicies/{NAME}"]
    assert policy["spec"]["egress"] == [
        DNS, LAB_WEB,
        {"to": [{"ipBlock": {"cidr": "93.184.215.14/32"}}], "ports": [{"protocol": "TCP", "port": 8443}]},
        {"to": [{"ipBlock": {"cidr": "2606:2800:21f:cb07:6820:80da:af6b:8b2c/128"}}], "ports": [{"protocol": "TCP", "port": 80}]},
    ]
    validate(policy)

    created = len(api.requests)
    private = {**spec, "env": [{"id": "acme/judge-qa", "judge": {"base_url": "http://10.0.0.7:8100/v1"},
                                "args": {"judge_base_url": "http://10.0.0.7:8100/v1"}}], "eval": {}}
    with pytest.raises(UnsafeURL, match="private or loopback"):
        launcher.launch(request(job_id=OTHER_JOB_ID, spec=private))
    assert len(api.requests) == created
