"""The objects the Kubernetes launcher builds for an attempt, for a table of specs: each one
validates (kubernetes-validate strict for core kinds, the CRD schemas for Kueue and JobSet)
and says exactly what the pool needs (suspended, queue and priority labels, GPU limits and node
selection, no retry inside an attempt, deadlines, TTL, volumes, image, Lab's labels)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from jobs.launchers.base import LaunchRequest
from jobs.launchers.kubernetes.objects import (
    PoolSettings,
    default_deny_object,
    gpu_products,
    jobset_name,
    jobset_object,
    local_queue_object,
    namespace_object,
    network_policy_object,
    secret_object,
)
from tests.k8s.validation import validate

SETTINGS = PoolSettings(engine_image="registry.example/lab-engine-gpu:1.0", model_dir="/var/lib/lab/models",
                        stop_grace_s=60, shared_pvc="lab-shared", gpu_products=gpu_products({"nodes": [{"gpu_type": "H200", "gpus": 8, "product": "NVIDIA-H200-141GB"}]}))
JOB_ID = "job_0123456789abcdefghij"


def request(**changes) -> LaunchRequest:
    fields = dict(
        job_id=JOB_ID, attempt=1, spec={"name": "addition", "max_runtime_minutes": 90, "env": [{"id": "lab/addition"}]},
        lab_url="https://lab.example", token="job-token-secret", bootstrap_token="ljb_bootstrap-secret", organization="acme", project="default",
        namespace="lab-acme", priority="normal", gpu_type="H100", gpus=1,
    )
    fields.update(changes)
    return LaunchRequest(**fields)


TABLE = [
    pytest.param({}, id="H100 x1 normal"),
    pytest.param({"gpus": 2}, id="H100 x2 split"),
    pytest.param({"gpus": 3, "secrets": {"TEACHER_API_KEY": "k"}}, id="H100 x3 split with a job secret"),
    pytest.param({"gpu_type": "H200", "gpus": 8, "priority": "high", "attempt": 3, "resume_checkpoint_id": "ckpt_abc"}, id="H200 x8 high resumed split"),
    pytest.param({"gpu_type": "cpu", "gpus": 0, "priority": "low"}, id="cpu low"),
    pytest.param({"gpu_type": "cpu", "gpus": 0, "roles": ("inference", "orchestrator", "trainer")}, id="cpu three roles"),
    pytest.param({"namespace": "lab-shared", "attempt": 9999, "gpus": 2}, id="shared namespace, attempt 9999, split"),
    pytest.param({"roles": ("inference", "orchestrator", "trainer")}, id="three roles"),
]


def owner(jobset: dict) -> dict:
    return {**jobset, "metadata": {**jobset["metadata"], "uid": "0b6d4f7e-1111-2222-3333-444455556666"}}


@pytest.mark.parametrize("changes", TABLE)
def test_every_object_of_an_attempt_validates(changes):
    attempt = request(**changes)
    jobset = jobset_object(attempt, SETTINGS)
    for obj in (namespace_object(attempt.namespace, attempt.organization), local_queue_object(attempt.namespace),
                default_deny_object(attempt.namespace), jobset, network_policy_object(attempt, SETTINGS, owner=owner(jobset)),
                secret_object(attempt, owner=owner(jobset))):
        validate(obj)


def engine_pod(jobset: dict, index: int = 0) -> dict:
    return jobset["spec"]["replicatedJobs"][index]["template"]["spec"]["template"]["spec"]


def test_the_jobset_is_suspended_in_the_organizations_queue_at_its_priority():
    jobset = jobset_object(request(priority="high"), SETTINGS)

    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert jobset["metadata"]["name"] == "lab-job-0123456789abcdefghij-a1"
    assert jobset["metadata"]["namespace"] == "lab-acme"
    assert jobset["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "lab", "app.kubernetes.io/component": "engine",
        "lab.dev/job-id": JOB_ID, "lab.dev/attempt": "1", "lab.dev/organization": "acme",
        "kueue.x-k8s.io/queue-name": "lab", "kueue.x-k8s.io/priority-class": "lab-high",
    }
    assert jobset["spec"]["suspend"] is True
    assert jobset["spec"]["ttlSecondsAfterFinished"] == 86_400
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0}
    assert "successPolicy" not in jobset["spec"]


def test_nothing_retries_inside_an_attempt_and_the_deadline_is_a_safety_net():
    job = jobset_object(request(), SETTINGS)["spec"]["replicatedJobs"][0]["template"]["spec"]

    assert job["backoffLimit"] == 0
    assert job["activeDeadlineSeconds"] == 90 * 60 + 60
    assert job["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onExitCodes": {"containerName": "engine", "operator": "NotIn", "values": [0]}},
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    assert job["template"]["spec"]["restartPolicy"] == "Never"


def test_gpu_jobs_get_limits_and_the_products_node_selector():
    pod = engine_pod(jobset_object(request(gpu_type="H200", gpus=8), replace(SETTINGS, engine_roles="single")))
    container = pod["containers"][0]

    assert container["resources"] == {
        "requests": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
        "limits": {"memory": "512Gi", "nvidia.com/gpu": "8"},
    }
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200-141GB"}  # LAB_POOL's product wins
    assert engine_pod(jobset_object(request(), SETTINGS))["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_cpu_jobs_request_cpu_and_memory_only():
    pod = engine_pod(jobset_object(request(gpu_type="cpu", gpus=0), SETTINGS))

    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_the_engine_gets_its_bootstrap_token_from_the_secret_and_the_model_volume_at_lab_model_dir():
    attempt = request(attempt=3, resume_checkpoint_id="ckpt_abc")
    pod = engine_pod(jobset_object(attempt, SETTINGS))
    container = pod["containers"][0]
    name = jobset_name(JOB_ID, 3)

    assert container["image"] == "registry.example/lab-engine-gpu:1.0"
    assert container["command"] == ["python", "-m", "engine"]
    assert container["args"] == ["run", "--spec", "/etc/lab/spec.json", "--job-id", JOB_ID, "--attempt", "3",
                                 "--lab-url", "https://lab.example", "--workdir", "/var/lab/work", "--resume-from", "ckpt_abc"]
    assert "job-token-secret" not in str(pod) and "bootstrap-secret" not in str(pod)  # never on a command line or in the template
    env = {entry["name"]: entry for entry in container["env"]}
    assert env["LAB_JOB_BOOTSTRAP_TOKEN"] == {"name": "LAB_JOB_BOOTSTRAP_TOKEN",
                                              "valueFrom": {"secretKeyRef": {"name": name, "key": "LAB_JOB_BOOTSTRAP_TOKEN"}}}
    assert "LAB_JOB_TOKEN" not in env  # the engine is given its attempt's token when it opens the attempt
    assert env["LAB_POD_UID"] == {"name": "LAB_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
    assert env["LAB_JOBSET_NAME"] == {"name": "LAB_JOBSET_NAME", "value": name}
    assert env["LAB_MODEL_DIR"]["value"] == "/var/lib/lab/models"
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts["models"] == {"name": "models", "mountPath": "/var/lib/lab/models", "readOnly": True}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "lab-models", "readOnly": True}
    assert volumes["spec"]["secret"]["secretName"] == name


def test_the_secret_is_immutable_and_owned_by_the_jobset():
    attempt = request()
    jobset = owner(jobset_object(attempt, SETTINGS))
    secret = secret_object(attempt, owner=jobset)

    assert secret["immutable"] is True
    assert secret["stringData"]["LAB_JOB_BOOTSTRAP_TOKEN"] == "ljb_bootstrap-secret"
    assert "job-token-secret" not in str(secret)  # an attempt's token would outlive its attempt in a readmitted JobSet
    assert secret["metadata"]["ownerReferences"] == [{
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": jobset["metadata"]["name"],
        "uid": jobset["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
    }]


def test_the_jobs_secrets_and_packages_reach_the_engine_through_the_secret_only():
    package = {"id": "acme/count@0.1.0", "sha256": "0" * 64, "url": "https://s3.example/w?X-Amz-Signature=abc",
               "filename": "count-0.1.0-py3-none-any.whl"}
    attempt = request(secrets={"WANDB_API_KEY": "wandb-value-123"}, environment_packages=(package,))
    jobset = owner(jobset_object(attempt, SETTINGS))
    secret = secret_object(attempt, owner=jobset)
    name = jobset_name(JOB_ID, 1)

    assert "wandb-value-123" not in str(jobset) and "X-Amz-Signature" not in str(jobset)
    env = {entry["name"]: entry for entry in engine_pod(jobset)["containers"][0]["env"]}
    for variable in ("WANDB_API_KEY", "LAB_JOB_ENVIRONMENT_PACKAGES", "LAB_JOB_BOOTSTRAP_TOKEN"):
        assert env[variable] == {"name": variable, "valueFrom": {"secretKeyRef": {"name": name, "key": variable}}}
    assert secret["stringData"]["WANDB_API_KEY"] == "wandb-value-123"
    assert "X-Amz-Signature=abc" in secret["stringData"]["LAB_JOB_ENVIRONMENT_PACKAGES"]
    assert secret["stringData"]["LAB_JOB_BOOTSTRAP_TOKEN"] == "ljb_bootstrap-secret"
    validate(secret)


def test_several_roles_complete_with_the_orchestrator():
    jobset = jobset_object(request(roles=("inference", "orchestrator", "trainer")), SETTINGS)

    assert [job["name"] for job in jobset["spec"]["replicatedJobs"]] == ["inference", "orchestrator", "trainer"]
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["orchestrator"]}
    assert engine_pod(jobset, 1)["containers"][0]["args"][0] == "orchestrator"
    assert "successPolicy" not in jobset_object(request(), SETTINGS)["spec"]  # one role: done when it is


def test_a_later_attempt_gets_only_the_runtime_left():
    job = jobset_object(request(), SETTINGS, elapsed_s=80 * 60)["spec"]["replicatedJobs"][0]["template"]["spec"]

    assert job["activeDeadlineSeconds"] == 10 * 60 + 60


def test_the_validator_refuses_what_the_api_server_would():
    jobset = jobset_object(request(), SETTINGS)
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["backofLimit"] = 0  # a typo

    with pytest.raises(AssertionError, match="backofLimit: unknown field"):
        validate(jobset)
    secret = secret_object(request(), owner=owner(jobset_object(request(), SETTINGS)))
    secret["immutable"] = "yes"
    with pytest.raises(AssertionError):
        validate(secret)


def test_the_crd_copies_keep_their_licences():
    data = Path(__file__).parent / "data"

    assert "Apache License" in (data / "LICENSE-kueue").read_text()
    assert "Apache License" in (data / "LICENSE-jobset").read_text()


def test_the_model_volume_source_is_the_operators():
    settings = PoolSettings(model_volume={"nfs": {"server": "nfs.example", "path": "/models", "readOnly": True}})
    jobset = jobset_object(request(), settings)
    volumes = {volume["name"]: volume for volume in engine_pod(jobset)["volumes"]}

    assert volumes["models"] == {"name": "models", "nfs": {"server": "nfs.example", "path": "/models", "readOnly": True}}
    validate(jobset)


def test_the_registry_builds_the_launchers_settings_from_labs(settings):
    from jobs.launchers.registry import kubernetes_pool_settings

    settings.LAB_ENGINE_IMAGE = "registry.example/lab-engine-gpu:2"
    settings.LAB_POOL = {"nodes": [{"gpu_type": "H100", "gpus": 8, "product": "NVIDIA-H100-NVL"}]}
    settings.LAB_STOP_GRACE_S, settings.LAB_KILL_GRACE_S = 30, 15
    pool = kubernetes_pool_settings()

    assert (pool.engine_image, pool.gpu_products["H100"], pool.gpu_products["H200"], pool.stop_grace_s) == (
        "registry.example/lab-engine-gpu:2", "NVIDIA-H100-NVL", "NVIDIA-H200", 45)
    assert pool.model_volume == {"persistentVolumeClaim": {"claimName": "lab-models", "readOnly": True}}
