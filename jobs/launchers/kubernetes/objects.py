"""The objects one attempt needs on the cluster, built from its ``LaunchRequest``.

- a Namespace per organization (``lab-<organization slug>``) unless ``LAB_K8S_NAMESPACE`` names
  a shared one, with its Kueue LocalQueue ``lab`` pointing at the ClusterQueue ``lab``;
- the attempt's JobSet (``jobset.x-k8s.io/v1alpha2``), created suspended for Kueue, one
  replicated job per engine role (``engine_roles``: the whole engine as ``engine``, or the
  ``inference``, ``orchestrator`` and ``trainer`` roles of docs/engine.md sharing a volume), no
  retry inside an attempt (``backoffLimit: 0``, a ``podFailurePolicy`` whose every rule is
  ``FailJob``, ``failurePolicy.maxRestarts: 0``);
- a NetworkPolicy of the attempt's pods, owned by the JobSet: ingress only from the JobSet's own
  pods (to the inference role's port), egress only to them, to the cluster DNS and to the rules of
  ``LAB_K8S_ENGINE_EGRESS`` (Lab's web pods by default); and in every jobs' namespace Lab uses,
  a NetworkPolicy that denies every engine pod everything, so a pod whose own policy is missing
  reaches nothing;
- an immutable Secret with the job's bootstrap token and the spec, owned by the JobSet so it
  goes with it (the engine opens each attempt the JobSet runs with it: ``jobs.readmission``).

The engine pods run as uid/gid 1000 with no capability, no privilege escalation, the runtime's
seccomp profile, no host namespace, no shared process namespace, no service-account token and
a read-only root filesystem; what they write goes to their work dir (``HOME`` and
``XDG_CACHE_HOME`` are in it), ``/tmp``, both ``emptyDir`` volumes, and ``/dev/shm``, a
memory-backed one (a container runtime's own is 64 MiB; vLLM's merged weights and a split
engine's weight hand-over are written there), which counts against the pod's memory.

docs/kubernetes.md pins every name and label used here. Names are deterministic per job
attempt (``lab-<job id>-a<attempt>``: the attempt that launched it; a JobSet Kueue readmits after a
preemption runs later attempts under the same name), so a repeated launch finds what the first
one created.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from labsdk.spec.model import ResourcesConfig

from jobs.launchers.base import LaunchRequest, engine_args, engine_package_environment

#: Label keys Lab puts on everything it creates (docs/kubernetes.md).
JOB_LABEL = "lab.dev/job-id"
ATTEMPT_LABEL = "lab.dev/attempt"
ORGANIZATION_LABEL = "lab.dev/organization"
#: On pod templates only: the engine role the pod runs (docs/kubernetes.md "Roles").
ROLE_LABEL = "lab.dev/role"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"
#: Kueue's labels: the LocalQueue a workload queues in, and its WorkloadPriorityClass.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: NVIDIA's GPU feature discovery labels each GPU node with its product name.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"

LOCAL_QUEUE = "lab"
CLUSTER_QUEUE = "lab"
#: The WorkloadPriorityClass of each spec ``priority`` (k8s/base/kueue.yaml defines them).
PRIORITY_CLASSES = {"low": "lab-low", "normal": "lab-normal", "high": "lab-high"}

#: ``nvidia.com/gpu.product`` of the catalogue's GPU types, as GPU feature discovery names them;
#: a ``LAB_POOL`` node group's ``product`` overrides its type's entry.
DEFAULT_GPU_PRODUCTS = {
    "A100": "NVIDIA-A100-SXM4-80GB",
    "H100": "NVIDIA-H100-80GB-HBM3",
    "H200": "NVIDIA-H200",
    "B200": "NVIDIA-B200",
    "L4": "NVIDIA-L4",
    "L40S": "NVIDIA-L40S",
}

#: Where the engine finds its inputs inside the pod; the only places it writes are the work dir
#: (``HOME`` and ``XDG_CACHE_HOME`` in it: torch's, Triton's, vLLM's and Hugging Face's caches)
#: and ``/tmp``, as the root filesystem is read-only.
SPEC_DIR = "/etc/lab"
WORK_DIR = "/var/lab/work"
HOME_DIR = f"{WORK_DIR}/home"
TMP_DIR = "/tmp"  # an emptyDir of the pod's own
SHM_DIR = "/dev/shm"  # a memory-backed emptyDir of the pod's own
#: The engine image's user (k8s/images/engine-*.Dockerfile: ``useradd --uid 1000``) and its group.
ENGINE_UID = ENGINE_GID = 1000
SECONDS_PER_DAY = 86_400

#: The whole engine in one pod, and the three roles of a split attempt (docs/engine.md "Three roles").
ENGINE_ROLE = "engine"
SPLIT_ROLES = ("inference", "orchestrator", "trainer")
#: Where the orchestrator and trainer mount the attempt's shared directory, and the inference role's port.
SHARED_DIR = "/lab/shared"
INFERENCE_PORT = 8100
#: ``LAB_K8S_ENGINE_ROLES``: ``auto`` splits jobs of 2 GPUs or more, ``split`` every job that can
#: be split, ``single`` none.
ROLE_MODES = ("auto", "split", "single")

#: The NetworkPolicy in every jobs' namespace that denies every engine pod all traffic; each
#: attempt's own policy (named as its JobSet) then allows what that attempt needs.
DEFAULT_DENY_POLICY = "lab-engine-default-deny"
#: The cluster DNS every engine pod may ask: kube-system's kube-dns (CoreDNS keeps that label).
DNS_EGRESS = {
    "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}
#: ``LAB_K8S_ENGINE_EGRESS``'s default: Lab's web pods (k8s/base/web.yaml in the namespace of
#: k8s/base/namespace.yaml) on their HTTP port, where ``LAB_PUBLIC_URL`` is the ``lab-web`` Service.
DEFAULT_ENGINE_EGRESS = (
    {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "lab-system"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "lab-web"}}}],
     "ports": [{"protocol": "TCP", "port": 8000}]},
)


class SplitUnavailable(ValueError):
    """A split attempt cannot be launched on this pool (no shared volume configured)."""


@dataclass(frozen=True)
class PoolSettings:
    """What the launcher needs to know of the pool and of Lab (from settings, via the registry).

    ``gpu_products`` maps Lab GPU types to ``nvidia.com/gpu.product`` values; ``cpu_per_gpu``
    (cores) and ``memory_per_gpu_gib`` size a GPU job's requests, ``cpu_job_cpu`` and
    ``cpu_job_memory_gib`` a CPU job's; ``model_volume`` is the volume source of the model cache
    (``LAB_K8S_MODEL_VOLUME``), mounted read-only at ``model_dir``; ``stop_grace_s`` is the time Lab gives an engine to
    checkpoint after asking it to stop (``LAB_STOP_GRACE_S`` + ``LAB_KILL_GRACE_S``);
    ``engine_roles`` is ``LAB_K8S_ENGINE_ROLES`` (one of ``ROLE_MODES``); ``shared_pvc`` names the
    ReadWriteMany PersistentVolumeClaim (in the jobs' namespace) a split attempt's orchestrator and
    trainer share (``LAB_K8S_SHARED_PVC``; empty: split attempts cannot launch);
    ``orchestrator_cpu`` (cores) and ``orchestrator_memory_gib`` size the orchestrator's pod;
    ``engine_egress`` is ``LAB_K8S_ENGINE_EGRESS``: the NetworkPolicy egress rules (``to``,
    ``ports``) of what engine pods may reach besides their own JobSet's pods and the cluster DNS
    (Lab, the object store); ``allow_private_egress`` (``LAB_ENGINE_EGRESS_ALLOW_PRIVATE``) lets a
    declared judge endpoint resolve to a private address (a server in the cluster's own network).
    """

    engine_image: str = "lab-engine:latest"
    model_dir: str = "/models"
    model_volume: dict = field(default_factory=lambda: {"persistentVolumeClaim": {"claimName": "lab-models", "readOnly": True}})
    gpu_products: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_GPU_PRODUCTS))
    cpu_per_gpu: int = 8
    memory_per_gpu_gib: int = 64
    cpu_job_cpu: int = 2
    cpu_job_memory_gib: int = 8
    stop_grace_s: int = 60
    shared_namespace: str = ""
    engine_roles: str = "auto"
    shared_pvc: str = ""
    orchestrator_cpu: int = 4
    orchestrator_memory_gib: int = 16
    engine_egress: tuple[dict, ...] = DEFAULT_ENGINE_EGRESS
    allow_private_egress: bool = False


def gpu_products(pool: dict) -> dict[str, str]:
    """Return the GPU product of each GPU type: the defaults, overridden by ``LAB_POOL`` node
    groups that name a ``product`` (``{"nodes": [{"gpu_type": "H100", "product": "...", ...}]}``)."""
    products = dict(DEFAULT_GPU_PRODUCTS)
    for node in pool.get("nodes", []):
        if isinstance(node, dict) and node.get("product"):
            products[str(node["gpu_type"])] = str(node["product"])
    return products


def jobset_name(job_id: str, attempt: int) -> str:
    """Return the JobSet (and Secret) name of an attempt: ``lab-job-<id>-a<attempt>``.

    Public ids are ``job_`` and 20 base-36 characters, so the name is 32 characters at most for
    attempts below 10,000: a DNS-1123 label with room for JobSet's Job and pod suffixes.
    """
    return f"lab-{job_id.replace('_', '-').lower()}-a{attempt}"


def labels(request: LaunchRequest) -> dict[str, str]:
    """Return Lab's labels of an attempt's objects."""
    return {
        MANAGED_BY_LABEL: "lab",
        COMPONENT_LABEL: "engine",
        JOB_LABEL: request.job_id,
        ATTEMPT_LABEL: str(request.attempt),
        ORGANIZATION_LABEL: request.organization,
    }


def namespace_object(namespace: str, organization: str) -> dict:
    """Return the Namespace of an organization (or the shared one, without an organization)."""
    metadata: dict = {"name": namespace, "labels": {MANAGED_BY_LABEL: "lab"}}
    if organization:
        metadata["labels"][ORGANIZATION_LABEL] = organization
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def local_queue_object(namespace: str) -> dict:
    """Return the LocalQueue Lab's JobSets in ``namespace`` queue in (Kueue v1beta2)."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": namespace, "labels": {MANAGED_BY_LABEL: "lab"}},
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }


def engine_pod_selector() -> dict:
    """Return the label selector of every engine pod Lab runs (whatever its job or attempt)."""
    return {"matchLabels": {MANAGED_BY_LABEL: "lab", COMPONENT_LABEL: "engine"}}


def default_deny_object(namespace: str) -> dict:
    """Return the NetworkPolicy of a jobs' namespace that denies every engine pod in it all
    ingress and egress. NetworkPolicies add up, so each attempt's own policy
    (``network_policy_object``) opens only what its pods need; a pod without one (its policy not
    created yet, or deleted) reaches nothing, not even the DNS. Pods that are not Lab's engines
    (in a shared namespace of the operator's) are not selected."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": DEFAULT_DENY_POLICY, "namespace": namespace, "labels": {MANAGED_BY_LABEL: "lab"}},
        "spec": {"podSelector": engine_pod_selector(), "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []},
    }


def attempt_pod_selector(request: LaunchRequest) -> dict:
    """Return the label selector of the pods of the attempt's JobSet (and of nothing else: in a
    shared namespace another job's or organization's pods have another job id; a JobSet Kueue
    readmits runs later attempts with the labels it was launched with)."""
    return {"matchLabels": {JOB_LABEL: request.job_id, ATTEMPT_LABEL: str(request.attempt)}}


def judge_egress_rule(addresses: Sequence[str], port: int) -> dict:
    """Return the NetworkPolicy egress rule that lets a pod reach a judge endpoint: TCP ``port``
    on each of ``addresses`` (IPv4 or IPv6, as its host resolved at launch), one ``ipBlock`` each."""
    blocks = [{"ipBlock": {"cidr": f"{address}/{128 if ':' in address else 32}"}} for address in addresses]
    return {"to": blocks, "ports": [{"protocol": "TCP", "port": port}]}


def network_policy_object(request: LaunchRequest, settings: PoolSettings, *, owner: dict, judges: Sequence[dict] = ()) -> dict:
    """Return the attempt's NetworkPolicy (named as its JobSet, owned by the JobSet ``owner`` as
    stored, with its uid), selecting the JobSet's pods only.

    Ingress: a split attempt's pods may reach its inference role's port from the JobSet's own
    pods; nothing else reaches them (a single engine pod takes no connection at all). Egress: the
    JobSet's own pods on that port (split only), the cluster DNS (``DNS_EGRESS``), and
    ``settings.engine_egress`` (Lab and the object store), and ``judges``: the rules
    (``judge_egress_rule``) of the judge endpoints the job declares (``[[env]] judge``), which the
    launcher resolves at launch. So environment code has no route to Lab's database or Redis, to
    the cloud's metadata address, nor to any other attempt's pods, whether they share the
    namespace or not.
    """
    split = "inference" in engine_roles(request, settings)
    own_pods = {"podSelector": attempt_pod_selector(request)}
    inference_port = [{"protocol": "TCP", "port": INFERENCE_PORT}]
    own = [{"to": [own_pods], "ports": inference_port}] if split else []
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": jobset_name(request.job_id, request.attempt),
            "namespace": request.namespace,
            "labels": labels(request),
            "ownerReferences": _owned_by(owner),
        },
        "spec": {
            "podSelector": attempt_pod_selector(request),
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [own_pods], "ports": inference_port}] if split else [],
            "egress": [*own, *copy.deepcopy([DNS_EGRESS, *settings.engine_egress, *judges])],
        },
    }


def secret_variables(request: LaunchRequest) -> dict[str, str]:
    """Return the engine's variables that travel in the attempt's Secret, never in the pod
    template: the job's bootstrap token (``LAB_JOB_BOOTSTRAP_TOKEN``: the engine opens its
    attempt with it at every pod start and is given the attempt's job token then, so a JobSet
    Kueue readmits after a preemption runs the next attempt; docs/kubernetes.md), the job's own
    secrets (``LaunchRequest.secrets``, names Lab never sets itself) and its environment
    packages (whose URLs may be signed). Raises ValueError without a bootstrap token."""
    if not request.bootstrap_token:
        raise ValueError("a Kubernetes attempt needs the job's bootstrap token")
    return {**request.secrets, **engine_package_environment(request), "LAB_JOB_BOOTSTRAP_TOKEN": request.bootstrap_token}


def _owned_by(owner: dict) -> list[dict]:
    """Return the ``ownerReferences`` that make an object go with the JobSet ``owner`` (as stored,
    with its uid): the garbage collector deletes it after the JobSet."""
    return [{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
    }]


def secret_object(request: LaunchRequest, *, owner: dict) -> dict:
    """Return the attempt's immutable Secret: the variables of ``secret_variables`` and the spec,
    owned by the JobSet ``owner`` (as stored, with its uid)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": jobset_name(request.job_id, request.attempt),
            "namespace": request.namespace,
            "labels": labels(request),
            "ownerReferences": _owned_by(owner),
        },
        "type": "Opaque",
        "immutable": True,
        "stringData": {**secret_variables(request), "spec.json": json.dumps(request.spec, sort_keys=True)},
    }


def active_deadline_s(request: LaunchRequest, settings: PoolSettings, *, elapsed_s: float = 0.0) -> int:
    """Return the attempt's ``activeDeadlineSeconds``: the job's remaining ``max_runtime_minutes``
    plus the stop grace. A safety net only: Lab's own runtime stop (exit 3 after a checkpoint)
    comes first; at least the grace, so an attempt past its runtime can still stop cleanly."""
    remaining = max(0.0, request.spec.get("max_runtime_minutes", 600) * 60 - elapsed_s)
    return int(math.ceil(remaining)) + settings.stop_grace_s


def engine_roles(request: LaunchRequest, settings: PoolSettings) -> tuple[str, ...]:
    """Return the replicated jobs (engine roles) of the attempt's JobSet.

    ``request.roles`` when the caller named roles other than the whole engine; else, by
    ``settings.engine_roles``: ``auto`` splits a GPU job of 2 GPUs or more into ``SPLIT_ROLES``
    when the pool has the roles' shared volume (``shared_pvc``; without it the whole engine runs
    as before), as one GPU cannot be shared by the trainer and the inference role; ``split``
    (which requires the volume) also every CPU
    job, ``single`` none; everything else, and an evaluation, runs as ``("engine",)``. Raises ValueError for an
    unknown mode.
    """
    if tuple(request.roles) != (ENGINE_ROLE,):
        return tuple(request.roles)
    if request.kind == "evaluation":  # it trains nothing: one engine samples and scores
        return (ENGINE_ROLE,)
    mode = settings.engine_roles or "auto"
    if mode not in ROLE_MODES:
        raise ValueError(f"LAB_K8S_ENGINE_ROLES must be one of {', '.join(ROLE_MODES)}, not {mode!r}")
    on_gpu = request.gpu_type != "cpu" and request.gpus > 0
    if mode == "single" or (on_gpu and request.gpus < 2) or (mode == "auto" and not (on_gpu and settings.shared_pvc)):
        return (ENGINE_ROLE,)
    return SPLIT_ROLES


def role_gpus(request: LaunchRequest, role: str) -> int:
    """Return the GPUs of ``role``'s pod: the whole engine has the spec's ``gpus``; split, the
    trainer and the inference role have ``resources.num_train_gpus`` and ``num_infer_gpus``
    (default: inference the larger half, ``ceil(gpus / 2)``, as sampling is most of a step;
    ``ResourcesConfig.gpu_split``), the orchestrator none. The roles' GPUs add up to the spec's
    (what is billed)."""
    if request.gpu_type == "cpu" or request.gpus <= 0:
        return 0
    if role == ENGINE_ROLE:
        return request.gpus
    resources = request.spec.get("resources") or {}
    train, infer = ResourcesConfig(
        gpu_type=request.gpu_type, gpus=request.gpus,
        num_train_gpus=resources.get("num_train_gpus"), num_infer_gpus=resources.get("num_infer_gpus"),
    ).gpu_split()
    return {"inference": infer, "trainer": train}.get(role, 0)


def inference_url(name: str) -> str:
    """Return the inference role's URL inside a split attempt's JobSet ``name``: its pod's DNS
    name (``spec.network.enableDNSHostnames``, subdomain = the JobSet's name:
    ``<jobset>-<replicated job>-<job index>-<pod index>.<subdomain>``) and ``INFERENCE_PORT``."""
    return f"http://{name}-inference-0-0.{name}:{INFERENCE_PORT}"


def role_secret_variables(request: LaunchRequest, role: str) -> list[str]:
    """Return the names of the Secret's variables ``role``'s container gets (sorted): the whole
    engine and the trainer all of ``secret_variables`` (the bootstrap token among them: the role
    that reports to Lab); the orchestrator, which runs users' environment code, only the job's
    own secrets (a teacher's key, ...) and its environment packages, never a token of Lab's; the
    inference role none."""
    if role in (ENGINE_ROLE, "trainer"):
        return sorted(secret_variables(request))
    if role == "orchestrator":
        return sorted({**request.secrets, **engine_package_environment(request)})
    return []


def _resources(request: LaunchRequest, settings: PoolSettings, role: str) -> dict:
    gpus = role_gpus(request, role)
    if role == "orchestrator":
        requests = {"cpu": str(settings.orchestrator_cpu), "memory": f"{settings.orchestrator_memory_gib}Gi"}
        return {"requests": requests, "limits": {"memory": requests["memory"]}}
    if gpus == 0:
        requests = {"cpu": str(settings.cpu_job_cpu), "memory": f"{settings.cpu_job_memory_gib}Gi"}
        return {"requests": requests, "limits": {"memory": requests["memory"]}}
    requests = {"cpu": str(settings.cpu_per_gpu * gpus), "memory": f"{settings.memory_per_gpu_gib * gpus}Gi"}
    return {
        "requests": {**requests, GPU_RESOURCE: str(gpus)},
        "limits": {"memory": requests["memory"], GPU_RESOURCE: str(gpus)},
    }


def role_program(request: LaunchRequest, role: str) -> list[str]:
    """Return the container's command for ``role``: ``python -m engine``, or for a trainer of
    several GPUs ``torchrun --standalone --nproc-per-node <its GPUs> -m engine``, one
    data-parallel rank per GPU (engine/distributed.py; the arguments are the same)."""
    gpus = role_gpus(request, role)
    if role == "trainer" and gpus > 1:
        return ["torchrun", "--standalone", f"--nproc-per-node={gpus}", "-m", "engine"]
    return ["python", "-m", "engine"]


def _role_command(request: LaunchRequest, role: str, name: str) -> tuple[list[str], list[dict]]:
    """Return the engine's arguments for ``role`` and the role's own variables."""
    args = engine_args(request, spec_path=f"{SPEC_DIR}/spec.json", workdir=WORK_DIR, resume_dir=None)
    if role == ENGINE_ROLE:
        return args, []
    # vLLM serves the policy where the inference role has GPUs; a LoRA job's trainer then sends
    # its adapter each step and vLLM applies it (docs/engine.md "How new weights reach inference"):
    # the inference role makes room for the adapter's rank; the trainer role, which never
    # samples, knows the backend it publishes for, and the orchestrator which sampling options
    # the backend takes (sampling.extra_body).
    vllm = role_gpus(request, "inference") > 0
    rollout = {"name": "LAB_ENGINE_ROLLOUT", "value": "vllm" if vllm else "transformers"}
    if role == "inference":
        gpus = role_gpus(request, role)
        split = ["--tensor-parallel-size", str(gpus)] if gpus > 1 else []  # vLLM over the role's GPUs
        lora_rank = int(request.spec.get("lora_rank") or 0)
        adapters = ["--max-lora-rank", str(lora_rank)] if vllm and lora_rank else []
        return (["inference", "--model", str(request.spec.get("model", "")), "--host", "0.0.0.0",
                 "--port", str(INFERENCE_PORT), "--workdir", WORK_DIR, *split, *adapters], [rollout])
    shared = [{"name": "LAB_ENGINE_SHARED_DIR", "value": SHARED_DIR}]
    if role == "orchestrator":  # no Lab URL nor checkpoint: it never talks to Lab
        attempt_args = ["--spec", f"{SPEC_DIR}/spec.json", "--job-id", request.job_id,
                        "--attempt", str(request.attempt), "--workdir", WORK_DIR]
        return ["orchestrator", *attempt_args], [*shared, rollout, {"name": "LAB_ENGINE_INFERENCE_URL", "value": inference_url(name)}]
    return [role, *args[1:]], [*shared, rollout]


def _pod_template(request: LaunchRequest, settings: PoolSettings, role: str) -> dict:
    name = jobset_name(request.job_id, request.attempt)
    args, role_env = _role_command(request, role, name)
    reports = role in (ENGINE_ROLE, "trainer")  # the role that opens the attempt and reports to Lab
    env = [{"name": variable, "valueFrom": {"secretKeyRef": {"name": name, "key": variable}}}
           for variable in role_secret_variables(request, role)]
    if reports:  # who opens the attempt (POST /attempts): this pod, of this JobSet
        env += [
            {"name": "LAB_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "LAB_JOBSET_NAME", "value": name},
            {"name": "LAB_PUBLIC_URL", "value": request.lab_url},
        ]
    env += [
        *role_env,
        {"name": "LAB_MODEL_DIR", "value": settings.model_dir},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # The root filesystem is read-only: every cache that defaults to the home directory
        # (torch, Triton, CUDA's, vLLM's, Hugging Face's, verifiers') lands in the work dir.
        {"name": "HOME", "value": HOME_DIR},
        {"name": "XDG_CACHE_HOME", "value": f"{HOME_DIR}/.cache"},
        # No usage reports: they could reach nothing past the attempt's NetworkPolicy anyway.
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "DO_NOT_TRACK", "value": "1"},
    ]
    mounts = [
        {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
        {"name": "models", "mountPath": settings.model_dir, "readOnly": True},
        {"name": "work", "mountPath": WORK_DIR},
        {"name": "tmp", "mountPath": TMP_DIR},
        {"name": "shm", "mountPath": SHM_DIR},
    ]
    volumes = [
        {"name": "spec", "secret": {"secretName": name, "items": [{"key": "spec.json", "path": "spec.json"}]}},
        {"name": "models", **settings.model_volume},
        {"name": "work", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    if role in ("orchestrator", "trainer"):
        if not settings.shared_pvc:
            raise SplitUnavailable(
                f"a job of {request.gpus} GPUs runs as the engine's three roles, which need a shared volume: "
                "set LAB_K8S_SHARED_PVC to a ReadWriteMany PersistentVolumeClaim of the jobs' namespace "
                "(or LAB_K8S_ENGINE_ROLES=single)")
        mounts.append({"name": "shared", "mountPath": SHARED_DIR, "subPath": name})
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": settings.shared_pvc}})
    # Environment code runs in these pods (the whole engine's, the orchestrator's and the
    # trainer's): nothing of the node, of other pods or of the cluster's API is theirs to see.
    spec: dict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.stop_grace_s,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": ENGINE_UID, "runAsGroup": ENGINE_GID, "fsGroup": ENGINE_GID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "engine",
            "image": settings.engine_image,
            "command": role_program(request, role),
            "args": args,
            "env": env,
            "resources": _resources(request, settings, role),
            "volumeMounts": mounts,
            "securityContext": {
                "privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
        }],
        "volumes": volumes,
    }
    if role == "inference":
        spec["containers"][0]["ports"] = [{"name": "inference", "containerPort": INFERENCE_PORT, "protocol": "TCP"}]
    if role_gpus(request, role):
        spec["nodeSelector"] = {GPU_PRODUCT_LABEL: settings.gpu_products.get(request.gpu_type, request.gpu_type)}
        spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": {**labels(request), ROLE_LABEL: role}}, "spec": spec}


def jobset_object(request: LaunchRequest, settings: PoolSettings, *, elapsed_s: float = 0.0) -> dict:
    """Return the attempt's JobSet: suspended, in the organization's LocalQueue at the spec's
    priority, one replicated job per role of ``engine_roles``; ``elapsed_s`` is the runtime the
    job has used in earlier attempts (seconds). Split, its pods have DNS hostnames under the
    JobSet's name and the JobSet succeeds with its orchestrator. Raises SplitUnavailable for a
    split attempt without ``settings.shared_pvc``."""
    roles = engine_roles(request, settings)
    name = jobset_name(request.job_id, request.attempt)
    replicated_jobs = []
    for role in roles:
        replicated_jobs.append({
            "name": role,
            "replicas": 1,
            "template": {
                "metadata": {"labels": {**labels(request), ROLE_LABEL: role}},
                "spec": {
                    "parallelism": 1,
                    "completions": 1,
                    "backoffLimit": 0,
                    "activeDeadlineSeconds": active_deadline_s(request, settings, elapsed_s=elapsed_s),
                    # Every pod failure ends the attempt with a reason Lab reads back: an engine
                    # exit (2 invalid spec, 3 stopped, 4 OOM, other crash) or a disruption
                    # (preemption, node drain). Lab decides what comes next, never the Job.
                    "podFailurePolicy": {"rules": [
                        {"action": "FailJob", "onExitCodes": {"containerName": "engine", "operator": "NotIn", "values": [0]}},
                        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    ]},
                    "template": _pod_template(request, settings, role),
                },
            },
        })
    spec: dict = {
        "suspend": True,
        "ttlSecondsAfterFinished": SECONDS_PER_DAY,  # outlasts an API outage: Lab reads how it ended
        "failurePolicy": {"maxRestarts": 0},
        "replicatedJobs": replicated_jobs,
    }
    if "orchestrator" in roles and len(roles) > 1:
        # The inference role never exits by itself: the attempt is done when the orchestrator is
        # (it exits 0 once the trainer has reported the attempt's end).
        spec["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["orchestrator"]}
    if "inference" in roles:  # the orchestrator reaches it at inference_url(name)
        spec["network"] = {"enableDNSHostnames": True, "subdomain": name}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": request.namespace,
            "labels": {
                **labels(request),
                QUEUE_LABEL: LOCAL_QUEUE,
                PRIORITY_LABEL: PRIORITY_CLASSES.get(request.priority, PRIORITY_CLASSES["normal"]),
            },
        },
        "spec": spec,
    }
