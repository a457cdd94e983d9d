"""Environment builds on the pool: one batch Job per build, in the engine image
(``environments.build_clusters``' ``BuildCluster`` on the ``ClusterGateway``).

The Job (``lab-build-<build id>`` in ``BuildSettings.namespace``, created once: a second create
is the existing object) runs ``environments.builder.pod``'s three steps: ``fetch`` and ``run`` as
init containers, ``report`` as its container. Only ``fetch`` and ``report`` get the build's token
(from the build's Secret, owned by the Job); ``run``, where the package's code runs, has none.
No retry (``backoffLimit: 0``), ``activeDeadlineSeconds`` = the build's limit + ``report_grace_s``,
no service-account token, non-root, a read-only root filesystem, requests and a memory limit, and
a NetworkPolicy (owned by the Job) that lets nothing reach the pod and lets the pod reach the
cluster DNS, public addresses (the package index, the Hugging Face Hub) and ``BuildSettings.egress``
(Lab and the object store, as an engine pod, and the operator's ``LAB_K8S_BUILD_EGRESS``), never a
private, shared, loopback or link-local address (the cloud's metadata, Lab's database).
``outcome`` reads the Job (and its pod for an OOM kill). No Django here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from environments.build_clusters import (
    CRASHED,
    DEADLINE,
    FAILED,
    GONE,
    OUT_OF_MEMORY,
    RUNNING,
    SUCCEEDED,
    BuildOutcome,
    BuildPod,
)
from environments.builder.pod import BUILD_DIR, HOME_DIR, TOKEN_VARIABLE
from jobs.launchers.kubernetes.gateway import ClusterGateway
from jobs.launchers.kubernetes.kinds import JOB, POD
from jobs.launchers.kubernetes.objects import (
    COMPONENT_LABEL,
    DNS_EGRESS,
    ENGINE_GID,
    ENGINE_UID,
    MANAGED_BY_LABEL,
    ORGANIZATION_LABEL,
    SECONDS_PER_DAY,
    TMP_DIR,
    _owned_by,
    namespace_object,
)

#: The label of a build's Job and pod: the build's id.
BUILD_LABEL = "lab.dev/environment-build"
BUILD_COMPONENT = "environment-build"
#: Public addresses: every one but the private (RFC 1918, RFC 4193), shared (RFC 6598), loopback
#: and link-local ranges (the cloud's metadata address, 169.254.169.254, among them).
PUBLIC_EGRESS = {"to": [
    {"ipBlock": {"cidr": "0.0.0.0/0", "except": [
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/8",
    ]}},
    {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10", "::1/128", "::ffff:0:0/96"]}},
]}


@dataclass(frozen=True)
class BuildSettings:
    """``image`` the engine image (``LAB_ENGINE_IMAGE``), ``namespace`` where builds run
    (``LAB_K8S_BUILD_NAMESPACE``), ``cpu`` (cores) and ``memory_gib`` the builder's requests (its
    memory also its limit), ``report_grace_s`` the time past the builder's limit the Job has to
    fetch and report, ``egress`` the NetworkPolicy egress rules the pod is given besides the DNS
    and public addresses (Lab's web pods and the object store, a private package index)."""

    image: str = "lab-engine:latest"
    namespace: str = "lab-builds"
    cpu: int = 2
    memory_gib: int = 8
    report_grace_s: int = 300
    egress: tuple[dict, ...] = ()


def build_job_name(build_id: int) -> str:
    return f"lab-build-{build_id}"


def build_labels(pod: BuildPod) -> dict[str, str]:
    return {MANAGED_BY_LABEL: "lab", COMPONENT_LABEL: BUILD_COMPONENT, BUILD_LABEL: str(pod.build_id),
            ORGANIZATION_LABEL: pod.organization}


def _container(name: str, settings: BuildSettings, args: list[str], *, token: bool, cpu: str, memory: str) -> dict:
    env = [{"name": "HOME", "value": HOME_DIR}, {"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "LANG", "value": "C.UTF-8"}]
    if token:
        env.append({"name": TOKEN_VARIABLE, "valueFrom": {"secretKeyRef": {"name": "", "key": TOKEN_VARIABLE}}})
    return {
        "name": name,
        "image": settings.image,
        "command": ["python", "-m", "environments.builder.pod"],
        "args": args,
        "env": env,
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "volumeMounts": [{"name": "build", "mountPath": BUILD_DIR}, {"name": "tmp", "mountPath": TMP_DIR}],
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }


def build_job_object(pod: BuildPod, settings: BuildSettings) -> dict:
    """The build's Job (see the module's docstring)."""
    name = build_job_name(pod.build_id)
    common = ["--dir", BUILD_DIR, "--lab-url", pod.lab_url, "--build", str(pod.build_id)]
    memory = f"{settings.memory_gib}Gi"
    containers = [
        _container("fetch", settings, ["fetch", *common, "--filename", pod.wheel_filename], token=True, cpu="100m", memory="512Mi"),
        _container("build", settings, ["run", "--dir", BUILD_DIR, "--timeout", str(pod.timeout_s), "--",
                                       "python", "-m", "environments.builder", *pod.builder_args],
                   token=False, cpu=str(settings.cpu), memory=memory),
        _container("report", settings, ["report", *common, "--timeout", str(pod.timeout_s)], token=True, cpu="100m", memory="512Mi"),
    ]
    for container in containers:
        for variable in container["env"]:
            if "valueFrom" in variable:
                variable["valueFrom"]["secretKeyRef"]["name"] = name
    labels = build_labels(pod)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": pod.timeout_s + settings.report_grace_s,
            "ttlSecondsAfterFinished": SECONDS_PER_DAY,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": ENGINE_UID, "runAsGroup": ENGINE_GID,
                                        "fsGroup": ENGINE_GID, "seccompProfile": {"type": "RuntimeDefault"}},
                    "initContainers": containers[:2],
                    "containers": containers[2:],
                    "volumes": [{"name": "build", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def build_secret_object(pod: BuildPod, settings: BuildSettings, *, owner: dict) -> dict:
    """The build's token, in an immutable Secret owned by its Job (``owner``, as stored)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": build_job_name(pod.build_id), "namespace": settings.namespace, "labels": build_labels(pod),
                     "ownerReferences": _owned_by(owner)},
        "type": "Opaque",
        "immutable": True,
        "stringData": {TOKEN_VARIABLE: pod.token},
    }


def build_network_policy_object(pod: BuildPod, settings: BuildSettings, *, owner: dict) -> dict:
    """The NetworkPolicy of the build's pod, owned by its Job: no ingress at all (nothing reaches
    a build); egress to the cluster DNS, public addresses (``PUBLIC_EGRESS``: the package index and
    the Hub) and ``settings.egress`` (Lab, the object store), so the package's code has no route to
    the cloud's metadata address nor to anything of the cluster's that ``settings.egress`` does not name."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": build_job_name(pod.build_id), "namespace": settings.namespace, "labels": build_labels(pod),
                     "ownerReferences": _owned_by(owner)},
        "spec": {"podSelector": {"matchLabels": {BUILD_LABEL: str(pod.build_id)}}, "policyTypes": ["Ingress", "Egress"], "ingress": [],
                 "egress": copy.deepcopy([DNS_EGRESS, PUBLIC_EGRESS, *settings.egress])},
    }


def _condition(job: dict, kind: str) -> dict | None:
    return next((entry for entry in (job.get("status") or {}).get("conditions") or []
                 if entry.get("type") == kind and entry.get("status") == "True"), None)


class KubernetesBuilds:
    """Builds as batch Jobs on ``gateway`` (a ``BuildCluster``)."""

    def __init__(self, *, gateway: ClusterGateway, settings: BuildSettings):
        self.gateway, self.settings = gateway, settings

    def start(self, pod: BuildPod) -> str:
        self.gateway.apply(namespace_object(self.settings.namespace, ""))
        job = self.gateway.apply(build_job_object(pod, self.settings))
        self.gateway.apply(build_secret_object(pod, self.settings, owner=job))
        self.gateway.apply(build_network_policy_object(pod, self.settings, owner=job))
        return job["metadata"]["name"]

    def outcome(self, build_id: int) -> BuildOutcome:
        job = self.gateway.get(JOB, build_job_name(build_id), self.settings.namespace)
        if job is None:
            return BuildOutcome(GONE)
        if _condition(job, "Complete"):
            return BuildOutcome(SUCCEEDED)
        failed = _condition(job, "Failed")
        if failed is None:
            return BuildOutcome(RUNNING)
        if failed.get("reason") == "DeadlineExceeded":
            return BuildOutcome(FAILED, DEADLINE, failed.get("message", ""))
        pods = self.gateway.list(POD, namespace=self.settings.namespace, label_selector=f"{BUILD_LABEL}={build_id}").items
        for pod in pods:
            status = pod.get("status") or {}
            for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
                terminated = (container.get("state") or {}).get("terminated") or {}
                if terminated.get("reason") == "OOMKilled":
                    return BuildOutcome(FAILED, OUT_OF_MEMORY, f"container {container.get('name')} was OOM-killed")
        return BuildOutcome(FAILED, CRASHED, failed.get("message") or failed.get("reason", ""))

