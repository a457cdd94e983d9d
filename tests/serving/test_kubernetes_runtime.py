"""Inference servers on the Kubernetes pool (serving/runtime/kubernetes.py): each start is a
Deployment, a Service and a Secret that Kubernetes 1.37 accepts (strict), sized from the model,
observed through its Deployment and pods, and stopped by deleting its Deployment; through the
in-memory gateway fake, the real client against a fake API server, and the serving pass."""

from __future__ import annotations

import json
from datetime import timedelta

import kubernetes_validate
import pytest
from django.utils import timezone
from kubernetes import client
from werkzeug import Response

from jobs.launchers.kubernetes.gateway import KubernetesGateway
from jobs.launchers.kubernetes.objects import PoolSettings
from lab.audit import Actor
from serving import servers
from serving.models import Deployment, DeploymentStatus, InferenceServer, ServerStatus
from serving.runtime.base import ServerObservation, ServerPhase, ServerSpec
from serving.runtime.kubernetes import KubernetesServerRuntime, object_name, server_gpus
from serving.services import deployment_create
from tests.support.fake_gateway import FakeGateway

NAMESPACE = "lab-serving"
WEIGHTS = "/var/lab/data/serving/weights"
SPEC = ServerSpec(server_id="srv_abc123", generation=3, model="lab/tiny-random-llama", served_model="ckpt_full",
                  max_adapters=8, weights_dir=f"{WEIGHTS}/ckpt_full", token="t0ken")
POOL = PoolSettings(engine_image="registry.example.com/lab-engine:1", model_dir="/models")


def runtime(gateway, parameters=135_000_000, gpu_type="H100", claim="lab-serving-weights") -> KubernetesServerRuntime:
    return KubernetesServerRuntime(gateway, namespace=NAMESPACE, pool=POOL, gpu_type=gpu_type, weights_claim=claim,
                                   weights_root=WEIGHTS, parameters=lambda model: parameters)


def stored(cluster: FakeGateway, kind: str, name: str = "lab-srv-abc123-g3") -> dict:
    return cluster.objects[(kind, NAMESPACE, name)]


def test_a_start_is_a_deployment_a_service_and_a_secret_kubernetes_accepts():
    cluster = FakeGateway()
    handle = runtime(cluster).start(SPEC)
    assert handle == {"namespace": NAMESPACE, "name": "lab-srv-abc123-g3", "server": "srv-abc123", "generation": 3}
    deployment, service, secret = stored(cluster, "Deployment"), stored(cluster, "Service"), stored(cluster, "Secret")
    for obj in (cluster.objects[("Namespace", "", NAMESPACE)], deployment, service, secret):
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert deployment["spec"]["replicas"] == 1
    assert container["image"] == POOL.engine_image and container["command"] == ["python", "-m", "engine"]
    assert container["args"] == ["serve", "--model", "lab/tiny-random-llama", "--served-model", "ckpt_full", "--max-adapters", "8",
                                 "--backend", "transformers", "--max-lora-rank", "64", "--workdir", "/var/lab/work",
                                 "--host", "0.0.0.0", "--port", "8000", "--weights", f"{WEIGHTS}/ckpt_full"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"name": "weights", "mountPath": WEIGHTS, "readOnly": True} in container["volumeMounts"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True and pod["spec"]["automountServiceAccountToken"] is False
    assert "t0ken" not in str(deployment)  # the token is in the Secret only
    assert secret["stringData"] == {"LAB_SERVING_TOKEN": "t0ken"} and secret["immutable"] is True
    for owned in (service, secret):
        assert owned["metadata"]["ownerReferences"][0]["uid"] == deployment["metadata"]["uid"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert set(service["spec"]["selector"].items()) <= set(pod["metadata"]["labels"].items())


def test_a_start_repeated_creates_nothing_more_and_the_next_generation_gets_names_of_its_own():
    cluster = FakeGateway()
    runtime(cluster).start(SPEC)
    before = set(cluster.objects)
    runtime(cluster).start(SPEC)
    assert set(cluster.objects) == before
    runtime(cluster).start(ServerSpec(**{**SPEC.__dict__, "generation": 4}))
    assert ("Deployment", NAMESPACE, "lab-srv-abc123-g4") in cluster.objects
    assert object_name(SPEC) == "lab-srv-abc123-g3"


def test_full_weights_need_the_shared_weights_claim_and_a_cpu_pool_asks_for_no_gpu():
    with pytest.raises(RuntimeError, match="LAB_K8S_SERVING_WEIGHTS_PVC"):
        runtime(FakeGateway(), claim="").start(SPEC)
    cluster = FakeGateway()
    runtime(cluster, gpu_type="cpu", claim="").start(ServerSpec(**{**SPEC.__dict__, "weights_dir": None}))
    container = stored(cluster, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"]["limits"] and "--weights" not in container["args"]


def test_a_stored_base_model_reaches_the_pod_through_the_secret():
    manifest = {"id": "acme/my-model", "revision": "r1", "files": [{"path": "config.json", "url": "https://s3.example.com/x?X-Amz-Signature=s1g"}]}
    cluster = FakeGateway()
    runtime(cluster).start(ServerSpec(**{**SPEC.__dict__, "model": "acme/my-model", "weights_dir": None, "stored_model": manifest}))
    deployment, secret = stored(cluster, "Deployment"), stored(cluster, "Secret")
    kubernetes_validate.validate(deployment, "1.37.0", strict=True)
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "LAB_JOB_MODEL", "valueFrom": {"secretKeyRef": {"name": "lab-srv-abc123-g3", "key": "LAB_JOB_MODEL"}}} in env
    assert json.loads(secret["stringData"]["LAB_JOB_MODEL"]) == manifest and "s1g" not in str(deployment)
    assert "s1g" not in repr(ServerSpec(**{**SPEC.__dict__, "stored_model": manifest}))


@pytest.mark.parametrize("parameters, gpu_type, gpus", [
    (None, "H100", 1), (135_000_000, "H100", 1), (8_000_000_000, "H100", 1), (70_000_000_000, "H100", 3),
    (70_000_000_000, "H200", 2), (70_000_000_000, "cpu", 0), (70_000_000_000, "TPU", 1),
])
def test_gpus_follow_the_models_size(parameters, gpu_type, gpus):
    assert server_gpus(parameters, gpu_type) == gpus


def test_it_observes_starting_listening_a_crash_an_image_it_cannot_pull_and_a_deleted_deployment():
    cluster = FakeGateway()
    serving = runtime(cluster)
    handle = serving.start(SPEC)
    assert serving.observe(handle).phase == ServerPhase.STARTING
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lab-srv-abc123-g3-x", "namespace": NAMESPACE,
                                                           "labels": stored(cluster, "Deployment")["spec"]["template"]["metadata"]["labels"]},
           "status": {"containerStatuses": [{"name": "engine", "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                             "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": "engine: unknown model"}}}]}}
    cluster.apply(pod)
    assert serving.observe(handle) == ServerObservation(ServerPhase.EXITED, detail="exit code 2 (Error): engine: unknown model")
    cluster.objects[("Pod", NAMESPACE, "lab-srv-abc123-g3-x")]["status"] = {
        "containerStatuses": [{"name": "engine", "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]}
    assert serving.observe(handle).detail == "ImagePullBackOff: not found"
    del cluster.objects[("Pod", NAMESPACE, "lab-srv-abc123-g3-x")]
    stored(cluster, "Deployment")["status"] = {"readyReplicas": 1}
    seen = serving.observe(handle)
    assert (seen.phase, seen.url) == (ServerPhase.LISTENING, f"http://lab-srv-abc123-g3.{NAMESPACE}.svc:8000")
    serving.stop(handle, force=True)
    assert ("Deployment", "lab-srv-abc123-g3", 0) in cluster.deletes
    assert serving.observe(handle).phase == ServerPhase.LOST


def test_the_real_client_creates_the_objects_on_the_api_server(httpserver):
    configuration = client.Configuration()
    configuration.host = httpserver.url_for("/").rstrip("/")
    configuration.api_key = {"authorization": "Bearer test-token"}
    gateway = KubernetesGateway(configuration, sleep=lambda seconds: None)
    created = []

    def create(request):
        body = request.get_json()
        created.append((request.path, body["kind"]))
        body["metadata"]["uid"] = f"uid-{len(created)}"
        return Response(json.dumps(body), status=201, content_type="application/json")

    httpserver.expect_request("/api/v1/namespaces", method="POST").respond_with_handler(create)
    for path in ("/apis/apps/v1/namespaces/lab-serving/deployments", "/api/v1/namespaces/lab-serving/secrets", "/api/v1/namespaces/lab-serving/services"):
        httpserver.expect_request(path, method="POST").respond_with_handler(create)
    runtime(gateway).start(SPEC)
    assert created == [("/api/v1/namespaces", "Namespace"), ("/apis/apps/v1/namespaces/lab-serving/deployments", "Deployment"),
                       ("/api/v1/namespaces/lab-serving/secrets", "Secret"), ("/api/v1/namespaces/lab-serving/services", "Service")]


@pytest.mark.django_db
def test_the_serving_pass_starts_a_deployment_on_the_cluster_fails_it_with_the_pods_reason_and_scales_a_server_to_zero(owner, settings, monkeypatch):
    settings.LAB_SERVING_RUNTIME = "kubernetes"
    cluster = FakeGateway()
    monkeypatch.setattr(servers, "_kubernetes_runtime", lambda: runtime(cluster, claim=""))
    deployment = deployment_create(project=owner.project, actor=Actor(user=owner.user), data={"source": {"type": "model", "id": "lab/tiny-random-llama"}})
    servers.reconcile()
    server = InferenceServer.objects.get()
    assert (Deployment.objects.unscoped().get(pk=deployment.pk).status, server.status) == (DeploymentStatus.DEPLOYING, ServerStatus.STARTING)
    name = server.handle["name"]
    labels = cluster.objects[("Deployment", NAMESPACE, name)]["spec"]["template"]["metadata"]["labels"]
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-x", "namespace": NAMESPACE, "labels": labels},
                   "status": {"containerStatuses": [{"name": "engine", "restartCount": 1, "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}})
    servers.reconcile()
    assert InferenceServer.objects.get().status == ServerStatus.FAILED
    failed = Deployment.objects.unscoped().get(pk=deployment.pk)
    assert failed.status == DeploymentStatus.FAILED and "exit code 137 (OOMKilled)" in failed.status_reason

    assert ("Deployment", name, 0) in cluster.deletes  # a failed server's crash-looping pod goes

    # A ready deployment on a running server nobody called for LAB_SERVING_IDLE_S: its Deployment goes.
    Deployment.objects.unscoped().filter(pk=deployment.pk).update(status=DeploymentStatus.READY)
    assert servers.server_wake(server.pk)
    servers.reconcile()
    server.refresh_from_db()
    assert server.generation == 2 and ("Deployment", NAMESPACE, server.handle["name"]) in cluster.objects
    long_ago = timezone.now() - timedelta(hours=1)
    InferenceServer.objects.filter(pk=server.pk).update(status=ServerStatus.RUNNING, status_changed_at=long_ago, last_request_at=long_ago)
    cluster.objects[("Deployment", NAMESPACE, server.handle["name"])]["status"] = {"readyReplicas": 1}
    servers.reconcile()
    assert InferenceServer.objects.get().status == ServerStatus.STOPPING and ("Deployment", server.handle["name"], None) in cluster.deletes
    servers.reconcile()
    assert InferenceServer.objects.get().status == ServerStatus.STOPPED
    assert Deployment.objects.unscoped().get(pk=deployment.pk).status == DeploymentStatus.READY
