"""A split attempt on the Kubernetes pool: the engine's three roles (docs/engine.md "Three roles")
as three replicated jobs of one JobSet. Which jobs split, each role's GPUs, command, variables
and volumes, which container gets which secret, DNS between the pods, a pool without a shared
volume; then end to end through the reconciler against the gateway fake: Kueue admits the
three together, the trainer's exit decides, an orchestrator's exit 2 fails the job invalid_spec."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.utils import timezone as django_timezone

from jobs.pipeline import launch, reconciler
from jobs.launchers.base import AttemptPhase, LaunchRequest
from jobs.launchers.kubernetes.launcher import KubernetesLauncher
from jobs.launchers.kubernetes.objects import (
    SPLIT_ROLES,
    PoolSettings,
    SplitUnavailable,
    engine_roles,
    jobset_name,
    jobset_object,
    role_gpus,
    secret_object,
)
from jobs.models import ErrorCode, Job, JobAttempt, JobStatus
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor
from tests.k8s.validation import validate
from tests.support.fake_gateway import FakeGateway, kubernetes_pool

JOB_ID = "job_0123456789abcdefghij"
NAME = jobset_name(JOB_ID, 2)
SETTINGS = PoolSettings(engine_image="registry.example/lab-engine-gpu:1.0", model_dir="/models", shared_pvc="lab-shared",
                        orchestrator_cpu=6, orchestrator_memory_gib=24)
PACKAGE = {"id": "acme/count@0.1.0", "sha256": "0" * 64, "url": "https://s3.example/w?X-Amz-Signature=abc",
           "filename": "count-0.1.0-py3-none-any.whl"}


def request(**changes) -> LaunchRequest:
    fields = dict(
        job_id=JOB_ID, attempt=2, spec={"name": "addition", "model": "Qwen/Qwen3-0.6B", "max_runtime_minutes": 90},
        lab_url="https://lab.example", token="job-token-secret", bootstrap_token="ljb_bootstrap-secret",
        organization="acme", namespace="lab-acme", gpu_type="H100", gpus=2, resume_checkpoint_id="ckpt_abc",
        secrets={"TEACHER_API_KEY": "teacher-key-123"}, environment_packages=(PACKAGE,),
    )
    fields.update(changes)
    return LaunchRequest(**fields)


def pods(jobset: dict) -> dict[str, dict]:
    return {job["name"]: job["template"]["spec"]["template"]["spec"] for job in jobset["spec"]["replicatedJobs"]}


def env(pod: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in pod["containers"][0]["env"]}


@pytest.mark.parametrize(("changes", "mode", "roles"), [
    ({"gpus": 1}, "auto", ("engine",)),
    ({"gpus": 2}, "auto", SPLIT_ROLES),
    ({"gpus": 8}, "auto", SPLIT_ROLES),
    ({"gpus": 8, "no_volume": True}, "auto", ("engine",)),  # a pool without the shared volume runs as before
    ({"gpu_type": "cpu", "gpus": 0}, "auto", ("engine",)),
    ({"gpu_type": "cpu", "gpus": 0}, "split", SPLIT_ROLES),
    ({"gpus": 1}, "split", ("engine",)),  # one GPU cannot serve and train at once
    ({"gpus": 8}, "single", ("engine",)),
    ({"gpus": 1, "roles": SPLIT_ROLES}, "single", SPLIT_ROLES),  # roles the caller names win
])
def test_which_attempts_run_as_three_roles(changes, mode, roles):
    no_volume = changes.pop("no_volume", False)
    attempt = request(**changes)
    settings = replace(SETTINGS, engine_roles=mode, shared_pvc="" if no_volume else SETTINGS.shared_pvc)

    assert engine_roles(attempt, settings) == roles
    jobset = jobset_object(attempt, settings)
    assert [job["name"] for job in jobset["spec"]["replicatedJobs"]] == list(roles)
    validate(jobset)
    validate(secret_object(attempt, owner={**jobset, "metadata": {**jobset["metadata"], "uid": "uid-1"}}))
    with pytest.raises(ValueError, match="LAB_K8S_ENGINE_ROLES"):
        engine_roles(request(), replace(SETTINGS, engine_roles="sometimes"))


@pytest.mark.parametrize(("gpus", "inference", "trainer"), [(2, 1, 1), (3, 2, 1), (8, 4, 4)])
def test_the_gpus_are_split_between_inference_and_the_trainer(gpus, inference, trainer):
    attempt = request(gpus=gpus)
    by_role = pods(jobset_object(attempt, SETTINGS))

    assert [role_gpus(attempt, role) for role in SPLIT_ROLES] == [inference, 0, trainer]
    requested = {role: pod["containers"][0]["resources"] for role, pod in by_role.items()}
    assert requested["inference"]["limits"]["nvidia.com/gpu"] == str(inference)
    assert requested["trainer"]["limits"]["nvidia.com/gpu"] == str(trainer)
    assert requested["inference"]["requests"]["cpu"] == str(8 * inference)
    assert requested["orchestrator"] == {"requests": {"cpu": "6", "memory": "24Gi"}, "limits": {"memory": "24Gi"}}
    assert sum(int(r["requests"].get("nvidia.com/gpu", 0)) for r in requested.values()) == gpus  # what is billed
    assert "nodeSelector" not in by_role["orchestrator"] and "tolerations" not in by_role["orchestrator"]
    assert by_role["trainer"]["nodeSelector"] == by_role["inference"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.mark.parametrize(("resources", "inference", "trainer"), [
    ({"num_train_gpus": 6, "num_infer_gpus": 2}, 2, 6),
    ({"num_train_gpus": 2}, 6, 2),
    ({"num_infer_gpus": 1}, 1, 7),
])
def test_the_specs_split_gives_the_trainer_torchrun_ranks_and_vllm_its_tensor_parallel_size(resources, inference, trainer):
    attempt = request(gpus=8, spec={"model": "Qwen/Qwen3-0.6B", "resources": {"gpu_type": "H100", "gpus": 8, **resources}})
    by_role = {role: pod["containers"][0] for role, pod in pods(jobset_object(attempt, SETTINGS)).items()}

    assert [role_gpus(attempt, role) for role in SPLIT_ROLES] == [inference, 0, trainer]
    assert by_role["inference"]["resources"]["limits"]["nvidia.com/gpu"] == str(inference)
    assert by_role["trainer"]["resources"]["limits"]["nvidia.com/gpu"] == str(trainer)
    split = ["--tensor-parallel-size", str(inference)] if inference > 1 else []
    assert by_role["inference"]["args"] == ["inference", "--model", "Qwen/Qwen3-0.6B", "--host", "0.0.0.0", "--port", "8100",
                                            "--workdir", "/var/lab/work", *split]
    assert by_role["inference"]["command"] == by_role["orchestrator"]["command"] == ["python", "-m", "engine"]
    # One data-parallel rank per trainer GPU, the arguments unchanged (engine/distributed.py).
    assert by_role["trainer"]["command"] == ["torchrun", "--standalone", f"--nproc-per-node={trainer}", "-m", "engine"]
    assert by_role["trainer"]["args"][0] == "trainer"
    validate(jobset_object(attempt, SETTINGS))
    one_each = pods(jobset_object(request(gpus=2), SETTINGS))
    assert one_each["trainer"]["containers"][0]["command"] == ["python", "-m", "engine"]
    assert "--tensor-parallel-size" not in one_each["inference"]["containers"][0]["args"]


def test_each_role_runs_its_command_with_its_variables():
    jobset = jobset_object(request(), SETTINGS)
    by_role = pods(jobset)
    inference, orchestrator, trainer = (by_role[role]["containers"][0] for role in SPLIT_ROLES)

    assert jobset["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": NAME}
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["orchestrator"]}
    assert inference["args"] == ["inference", "--model", "Qwen/Qwen3-0.6B", "--host", "0.0.0.0", "--port", "8100",
                                 "--workdir", "/var/lab/work"]
    assert inference["ports"] == [{"name": "inference", "containerPort": 8100, "protocol": "TCP"}]
    assert env(by_role["inference"])["LAB_ENGINE_ROLLOUT"]["value"] == "vllm"
    assert orchestrator["args"] == ["orchestrator", "--spec", "/etc/lab/spec.json", "--job-id", JOB_ID, "--attempt", "2",
                                    "--workdir", "/var/lab/work"]
    assert env(by_role["orchestrator"])["LAB_ENGINE_SHARED_DIR"]["value"] == "/lab/shared"
    assert env(by_role["orchestrator"])["LAB_ENGINE_INFERENCE_URL"]["value"] == f"http://{NAME}-inference-0-0.{NAME}:8100"
    assert trainer["args"] == ["trainer", "--spec", "/etc/lab/spec.json", "--job-id", JOB_ID, "--attempt", "2",
                               "--lab-url", "https://lab.example", "--workdir", "/var/lab/work", "--resume-from", "ckpt_abc"]
    assert env(by_role["trainer"])["LAB_ENGINE_SHARED_DIR"]["value"] == "/lab/shared"
    for role, pod in by_role.items():
        assert pod["containers"][0]["name"] == "engine"
        assert env(pod)["LAB_MODEL_DIR"]["value"] == "/models"
    for job in jobset["spec"]["replicatedJobs"]:  # each role fails the attempt on its own non-zero exit
        assert job["template"]["spec"]["podFailurePolicy"]["rules"][0] == {
            "action": "FailJob", "onExitCodes": {"containerName": "engine", "operator": "NotIn", "values": [0]}}
        assert job["template"]["spec"]["template"]["metadata"]["labels"]["lab.dev/role"] == job["name"]
    cpu = pods(jobset_object(request(gpu_type="cpu", gpus=0), replace(SETTINGS, engine_roles="split")))
    assert env(cpu["inference"])["LAB_ENGINE_ROLLOUT"]["value"] == "transformers"
    for role in SPLIT_ROLES:  # every role knows the backend: the trainer publishes for it, the orchestrator samples through it
        assert env(by_role[role])["LAB_ENGINE_ROLLOUT"]["value"] == "vllm"
        assert env(cpu[role])["LAB_ENGINE_ROLLOUT"]["value"] == "transformers"
    assert "nvidia.com/gpu" not in cpu["inference"]["containers"][0]["resources"]["requests"]


@pytest.mark.parametrize(("lora_rank", "gpus", "flag"), [(16, 2, ["--max-lora-rank", "16"]), (0, 2, []), (16, 0, [])])
def test_a_lora_jobs_inference_role_makes_room_for_its_adapters_where_vllm_serves_it(lora_rank, gpus, flag):
    """vLLM applies the trainer's adapter each step (on CUDA: LAB_ENGINE_VLLM_WEIGHTS' auto);
    a full fine-tune sends merged weights, and the transformers backend takes nothing else."""
    attempt = request(gpu_type="H100" if gpus else "cpu", gpus=gpus,
                      spec={"model": "Qwen/Qwen3-0.6B", "lora_rank": lora_rank, "max_runtime_minutes": 90})
    inference = pods(jobset_object(attempt, replace(SETTINGS, engine_roles="split")))["inference"]["containers"][0]

    assert inference["args"] == ["inference", "--model", "Qwen/Qwen3-0.6B", "--host", "0.0.0.0", "--port", "8100",
                                 "--workdir", "/var/lab/work", *flag]


def test_only_the_trainer_holds_labs_tokens_and_inference_no_secret_at_all():
    jobset = jobset_object(request(), SETTINGS)
    by_role = pods(jobset)
    secret_refs = {role: {name for name, entry in env(pod).items() if "secretKeyRef" in entry.get("valueFrom", {})}
                   for role, pod in by_role.items()}

    assert secret_refs["trainer"] == {"LAB_JOB_BOOTSTRAP_TOKEN", "TEACHER_API_KEY", "LAB_JOB_ENVIRONMENT_PACKAGES"}
    assert secret_refs["orchestrator"] == {"TEACHER_API_KEY", "LAB_JOB_ENVIRONMENT_PACKAGES"}
    assert secret_refs["inference"] == set()
    for role in ("orchestrator", "inference"):  # nothing to open an attempt or report to Lab with
        assert not {"LAB_JOB_TOKEN", "LAB_JOB_BOOTSTRAP_TOKEN", "LAB_POD_UID", "LAB_PUBLIC_URL"} & set(env(by_role[role]))
    assert env(by_role["trainer"])["LAB_POD_UID"] == {"name": "LAB_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
    for secret in ("job-token-secret", "bootstrap-secret", "teacher-key-123", "X-Amz-Signature"):
        assert secret not in str(jobset)  # values only in the Secret


def test_the_orchestrator_and_trainer_share_a_volume_under_the_jobsets_name():
    by_role = pods(jobset_object(request(), SETTINGS))

    for role in ("orchestrator", "trainer"):
        mounts = {mount["name"]: mount for mount in by_role[role]["containers"][0]["volumeMounts"]}
        volumes = {volume["name"]: volume for volume in by_role[role]["volumes"]}
        assert mounts["shared"] == {"name": "shared", "mountPath": "/lab/shared", "subPath": NAME}
        assert volumes["shared"] == {"name": "shared", "persistentVolumeClaim": {"claimName": "lab-shared"}}
        assert mounts["models"]["readOnly"] is True  # the trainer's weights, the orchestrator's tokenizer
    assert "shared" not in {mount["name"] for mount in by_role["inference"]["containers"][0]["volumeMounts"]}
    assert "models" in {mount["name"] for mount in by_role["inference"]["containers"][0]["volumeMounts"]}


def test_a_split_attempt_without_a_shared_volume_creates_nothing():
    cluster = FakeGateway()
    launcher = KubernetesLauncher(gateway=cluster, settings=replace(SETTINGS, shared_pvc="", engine_roles="split"), background=False)

    with pytest.raises(SplitUnavailable, match="LAB_K8S_SHARED_PVC"):
        launcher.launch(request())
    assert cluster.objects == {}
    assert launcher.launch(request(gpus=1))["jobset"] == NAME  # one role needs no shared volume


def test_the_registry_reads_the_role_settings(settings):
    from jobs.launchers.registry import kubernetes_pool_settings

    settings.LAB_K8S_ENGINE_ROLES, settings.LAB_K8S_SHARED_PVC = "split", "lab-shared-rwx"
    settings.LAB_K8S_ORCHESTRATOR_CPU, settings.LAB_K8S_ORCHESTRATOR_MEMORY_GIB = 3, 12
    pool = kubernetes_pool_settings()

    assert (pool.engine_roles, pool.shared_pvc, pool.orchestrator_cpu, pool.orchestrator_memory_gib) == (
        "split", "lab-shared-rwx", 3, 12)


# --- end to end through the reconciler -------------------------------------------------------

NAMESPACE = "lab-acme"
S = JobStatus


@pytest.fixture
def cluster() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
def launcher(monkeypatch, settings, cluster) -> KubernetesLauncher:
    return kubernetes_pool(settings, monkeypatch, cluster, nodes=[{"gpu_type": "H100", "gpus": 8, "count": 2}], shared_pvc="lab-shared")


def reload(job: Job) -> Job:
    return Job.objects.unscoped().get(pk=job.pk)


def role_pod(cluster: FakeGateway, name: str, role: str) -> dict:
    return next(obj for (kind, _, _), obj in cluster.objects.items()
                if kind == "Pod" and obj["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
                and obj["metadata"]["labels"].get("lab.dev/role") == role)


def running_split(owner, spec, cluster) -> tuple[Job, JobAttempt, str]:
    """A 2-GPU job launched as three roles, admitted by Kueue, its pods running, its trainer's
    pod the one that opened the attempt, its first heartbeat in."""
    from tests.support.k8s import open_attempt

    spec["resources"] = {"gpu_type": "H100", "gpus": 2}
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    launch.attempt_launch(attempt_id=attempt.pk)
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    name = attempt.handle["jobset"]
    assert [job["name"] for job in cluster.jobset(NAMESPACE, name)["spec"]["replicatedJobs"]] == list(SPLIT_ROLES)
    reconciler.reconcile_job(job_id=job.pk)
    assert (reload(job).status, reload(job).status_reason) == (S.STARTING, "kueue_pending")
    cluster.admit(NAMESPACE, name)  # one Workload: the three roles are admitted together
    assert {role_pod(cluster, name, role)["metadata"]["labels"]["lab.dev/role"] for role in SPLIT_ROLES} == set(SPLIT_ROLES)
    cluster.run(NAMESPACE, name)
    opened = open_attempt(cluster, job, name, pod=role_pod(cluster, name, "trainer"))
    assert opened.status_code == 200 and opened.json()["attempt"] == attempt.number
    JobAttempt.objects.filter(pk=attempt.pk).update(last_heartbeat_at=django_timezone.now())
    job_transition(job=reload(job), to=S.RUNNING)
    reconciler.reconcile_job(job_id=job.pk)
    assert reload(job).status == S.RUNNING
    return reload(job), JobAttempt.objects.get(pk=attempt.pk), name



@pytest.mark.django_db
@pytest.mark.usefixtures("commit_callbacks")
@pytest.mark.usefixtures("no_broker")
def test_a_split_job_succeeds_when_its_trainer_and_then_its_orchestrator_exit_0(owner, spec, launcher, cluster):
    job, attempt, name = running_split(owner, spec, cluster)

    cluster.exit(NAMESPACE, name, 0, role="trainer", finished_at="2026-12-01T12:30:00Z")  # reported, exit.json written
    reconciler.reconcile_job(job_id=job.pk)
    assert reload(job).status == S.RUNNING  # the JobSet waits for its orchestrator: not a readmission, not an end
    assert launcher.observe(attempt.handle).phase == AttemptPhase.RUNNING

    cluster.exit(NAMESPACE, name, 0, role="orchestrator", finished_at="2026-12-01T12:30:05Z")
    assert role_pod(cluster, name, "inference")["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    observation = launcher.observe(attempt.handle)
    assert (observation.phase, observation.exit_code) == (AttemptPhase.EXITED, 0)  # the inference pod's 143 does not count
    # Usage is billed for the job's GPUs (the trainer's and the inference pod's requests add up to
    # them) from the first role's start to the last role's end.
    assert (observation.started_at.isoformat(), observation.ended_at.isoformat()) == (
        "2026-12-01T12:01:00+00:00", "2026-12-01T12:30:05+00:00")
    requested = [int(pod["spec"]["containers"][0]["resources"]["requests"].get("nvidia.com/gpu", 0))
                 for pod in (role_pod(cluster, name, role) for role in SPLIT_ROLES)]
    assert requested == [1, 0, 1] and sum(requested) == reload(job).gpus == 2
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.error_code) == (S.SUCCEEDED, "")
    assert JobAttempt.objects.get(pk=attempt.pk).exit_code == 0


@pytest.mark.django_db
@pytest.mark.usefixtures("commit_callbacks")
@pytest.mark.usefixtures("no_broker")
def test_an_orchestrator_exit_2_fails_the_job_invalid_spec(owner, spec, launcher, cluster):
    job, attempt, name = running_split(owner, spec, cluster)

    cluster.exit(NAMESPACE, name, 2, role="orchestrator")  # an environment that does not load
    assert role_pod(cluster, name, "trainer")["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    reconciler.reconcile_job(job_id=job.pk)

    job = reload(job)
    assert (job.status, job.error_code) == (S.FAILED, ErrorCode.INVALID_SPEC)
    assert JobAttempt.objects.get(pk=attempt.pk).exit_code == 2


@pytest.mark.django_db
@pytest.mark.usefixtures("commit_callbacks")
@pytest.mark.usefixtures("no_broker")
def test_the_trainers_exit_decides_a_split_attempt(owner, spec, launcher, cluster):
    job, attempt, name = running_split(owner, spec, cluster)

    cluster.exit(NAMESPACE, name, 4, role="trainer")  # out of memory: the engine's exit 4
    observation = launcher.observe(attempt.handle)
    assert (observation.phase, observation.exit_code) == (AttemptPhase.EXITED, 4)
    reconciler.reconcile_job(job_id=job.pk)
    assert (reload(job).status, reload(job).error_code) == (S.FAILED, ErrorCode.OOM)


@pytest.mark.django_db
@pytest.mark.usefixtures("commit_callbacks")
@pytest.mark.usefixtures("no_broker")
def test_a_split_job_on_a_pool_without_a_shared_volume_fails_to_launch_saying_so(owner, spec, launcher, cluster):
    """LAB_K8S_ENGINE_ROLES=split asks for the roles; without their volume (auto would run the whole engine) it fails."""
    launcher.settings = replace(launcher.settings, shared_pvc="", engine_roles="split")
    spec["resources"] = {"gpu_type": "H100", "gpus": 2}
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    launch.attempt_launch(attempt_id=attempt.pk)

    job = reload(job)
    assert (job.status, job.error_code) == (S.FAILED, ErrorCode.INTERNAL_ERROR)
    assert "LAB_K8S_SHARED_PVC" in job.error_message
    assert not [key for key in cluster.objects if key[0] == "JobSet"]
