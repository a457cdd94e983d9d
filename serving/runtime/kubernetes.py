"""Inference servers on the Kubernetes pool: one Deployment and one Service per start of a server
(``LAB_SERVING_RUNTIME=kubernetes``; docs/serving.md "On Kubernetes").

Each start (a server's generation) is, in the namespace ``LAB_K8S_SERVING_NAMESPACE`` (default
``lab-serving``, created on first use), named ``lab-<server id>-g<generation>`` (``_`` made ``-``):

- a Deployment of one replica running ``python -m engine serve`` on port 8000 in the engine image,
  with a readiness probe on ``/health``, GPUs from the base model's size (``server_gpus``) and
  the engine pods' confinement (non-root, no capability, read-only root filesystem, no
  service-account token); the model cache mounted read-only at ``LAB_MODEL_DIR`` as in engine
  pods, and the deployments' unpacked weights, the ReadWriteMany PersistentVolumeClaim
  ``LAB_K8S_SERVING_WEIGHTS_PVC`` that Lab's worker also mounts at ``LAB_DATA_DIR/serving/weights``,
  read-only at the same path;
- a Service selecting its pods, which Lab's web and worker reach at
  ``http://<name>.<namespace>.svc:8000``;
- an immutable Secret with its ``LAB_SERVING_TOKEN`` (and, for a base model Lab's model store
  holds, its ``LAB_JOB_MODEL``: the files the server fetches into the pod before loading), owned
  by the Deployment.

Stopping a server (scaled to zero, or with nothing left on it) deletes its Deployment, with
Background propagation, and the Service and Secret with it (they are owned by it); the next start
creates new ones under the next generation's name, so a start never meets the last one's objects
while they terminate. The gateway is the launcher's (``jobs.launchers.kubernetes.gateway``).
"""

from __future__ import annotations

import json
import math

from engine.model_store import MODEL_VARIABLE
from jobs.launchers.kubernetes.gateway import ClusterGateway
from jobs.launchers.kubernetes.kinds import DEPLOYMENT, POD
from jobs.launchers.kubernetes.objects import (
    COMPONENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    MANAGED_BY_LABEL,
    PoolSettings,
)
from serving.runtime.base import ServerObservation, ServerPhase, ServerRuntime, ServerSpec

#: Label keys of a server's objects (docs/serving.md "On Kubernetes").
SERVER_LABEL = "lab.dev/server"
GENERATION_LABEL = "lab.dev/generation"
COMPONENT = "inference-server"
PORT = 8000
HOME_DIR = "/var/lab/work/home"
#: GPU memory of the pool's GPU types, GB, for ``server_gpus``.
GPU_MEMORY_GB = {"A100": 80, "H100": 80, "H200": 141, "B200": 180, "L4": 24, "L40S": 48}
#: Bytes a parameter takes when served (bf16), and the share of a GPU's memory the weights may fill
#: (the rest holds the key/value cache and the adapters).
SERVED_BYTES_PER_PARAMETER = 2
WEIGHTS_SHARE = 0.6
#: Waiting reasons of a container that will not start by itself.
_STUCK = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerError", "CrashLoopBackOff"}


def server_gpus(parameters: int | None, gpu_type: str) -> int:
    """Return the GPUs a server of a model of ``parameters`` needs on ``gpu_type``: its bf16
    weights within ``WEIGHTS_SHARE`` of their memory (1 when the size or the type is unknown; 0 on
    a CPU pool)."""
    if gpu_type == "cpu":
        return 0
    memory = GPU_MEMORY_GB.get(gpu_type)
    if not parameters or not memory:
        return 1
    return max(1, math.ceil(parameters * SERVED_BYTES_PER_PARAMETER / (memory * 1e9 * WEIGHTS_SHARE)))


def object_name(spec: ServerSpec) -> str:
    """Return the name of one start's objects: ``lab-<server id>-g<generation>``, DNS-1123."""
    return f"lab-{spec.server_id.replace('_', '-').lower()}-g{spec.generation}"


def server_labels(spec: ServerSpec) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: "lab", COMPONENT_LABEL: COMPONENT,
        SERVER_LABEL: spec.server_id.replace("_", "-").lower(), GENERATION_LABEL: str(spec.generation),
    }


def deployment_object(spec: ServerSpec, *, namespace: str, pool: PoolSettings, gpu_type: str, gpus: int,
                      weights_claim: str, weights_root: str) -> dict:
    """Return the Deployment of one start of a server (module docstring)."""
    name, labels = object_name(spec), server_labels(spec)
    args = ["serve", "--model", spec.model, "--served-model", spec.served_model, "--max-adapters", str(spec.max_adapters),
            "--backend", spec.backend, "--max-lora-rank", str(spec.max_lora_rank), "--workdir", "/var/lab/work",
            "--host", "0.0.0.0", "--port", str(PORT)]
    if spec.weights_dir:
        args += ["--weights", spec.weights_dir]
    mounts = [
        {"name": "models", "mountPath": pool.model_dir, "readOnly": True},
        {"name": "work", "mountPath": "/var/lab/work"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    volumes = [
        {"name": "models", **pool.model_volume},
        {"name": "work", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    if weights_claim:
        mounts.append({"name": "weights", "mountPath": weights_root, "readOnly": True})
        volumes.append({"name": "weights", "persistentVolumeClaim": {"claimName": weights_claim, "readOnly": True}})
    if gpus:
        requests = {"cpu": str(pool.cpu_per_gpu * gpus), "memory": f"{pool.memory_per_gpu_gib * gpus}Gi", GPU_RESOURCE: str(gpus)}
        resources = {"requests": requests, "limits": {"memory": requests["memory"], GPU_RESOURCE: str(gpus)}}
    else:
        requests = {"cpu": str(pool.cpu_job_cpu), "memory": f"{pool.cpu_job_memory_gib}Gi"}
        resources = {"requests": requests, "limits": {"memory": requests["memory"]}}
    pod_spec: dict = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "engine",
            "image": pool.engine_image,
            "command": ["python", "-m", "engine"],
            "args": args,
            "env": [
                {"name": "LAB_SERVING_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "LAB_SERVING_TOKEN"}}},
                {"name": "LAB_MODEL_DIR", "value": pool.model_dir},
                {"name": "HF_HUB_OFFLINE", "value": "1"},
                {"name": "PYTHONUNBUFFERED", "value": "1"},
                {"name": "HOME", "value": HOME_DIR},
                {"name": "XDG_CACHE_HOME", "value": f"{HOME_DIR}/.cache"},
                *([{"name": MODEL_VARIABLE, "valueFrom": {"secretKeyRef": {"name": name, "key": MODEL_VARIABLE}}}]
                  if spec.stored_model is not None else []),
            ],
            "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 2, "failureThreshold": 3},
            "resources": resources,
            "volumeMounts": mounts,
            "securityContext": {"privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
        }],
        "volumes": volumes,
    }
    if gpus:
        pod_spec["nodeSelector"] = {GPU_PRODUCT_LABEL: pool.gpu_products.get(gpu_type, gpu_type)}
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {SERVER_LABEL: labels[SERVER_LABEL], GENERATION_LABEL: labels[GENERATION_LABEL]}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def _owned_by(deployment: dict) -> list[dict]:
    return [{"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"],
             "uid": deployment["metadata"]["uid"], "controller": True, "blockOwnerDeletion": False}]


def service_object(spec: ServerSpec, *, namespace: str, owner: dict) -> dict:
    """Return the Service of one start of a server, owned by its Deployment."""
    labels = server_labels(spec)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": object_name(spec), "namespace": namespace, "labels": labels, "ownerReferences": _owned_by(owner)},
        "spec": {"selector": {SERVER_LABEL: labels[SERVER_LABEL], GENERATION_LABEL: labels[GENERATION_LABEL]},
                 "ports": [{"name": "http", "port": PORT, "targetPort": PORT, "protocol": "TCP"}]},
    }


def secret_object(spec: ServerSpec, *, namespace: str, owner: dict) -> dict:
    """Return the immutable Secret of one start's token, owned by its Deployment."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
        "metadata": {"name": object_name(spec), "namespace": namespace, "labels": server_labels(spec), "ownerReferences": _owned_by(owner)},
        "stringData": {
            "LAB_SERVING_TOKEN": spec.token,
            # A stored base model's files (their URLs may be pre-signed), fetched before it loads.
            **({MODEL_VARIABLE: json.dumps(spec.stored_model, separators=(",", ":"))} if spec.stored_model is not None else {}),
        },
    }


class KubernetesServerRuntime(ServerRuntime):
    """Runs inference servers as Deployments and Services through ``gateway`` (module docstring).

    ``parameters`` maps a model id to its parameter count (None: unknown), for ``server_gpus``.
    """

    def __init__(self, gateway: ClusterGateway, *, namespace: str, pool: PoolSettings, gpu_type: str,
                 weights_claim: str, weights_root: str, parameters=lambda model: None):
        self.gateway, self.namespace, self.pool, self.gpu_type = gateway, namespace, pool, gpu_type
        self.weights_claim, self.weights_root, self.parameters = weights_claim, weights_root, parameters

    def start(self, spec: ServerSpec) -> dict:
        if spec.weights_dir and not self.weights_claim:
            raise RuntimeError("full weights on Kubernetes need LAB_K8S_SERVING_WEIGHTS_PVC (a ReadWriteMany claim the worker shares)")
        self.gateway.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace, "labels": {MANAGED_BY_LABEL: "lab"}}})
        gpus = server_gpus(self.parameters(spec.model), self.gpu_type)
        deployment = self.gateway.apply(deployment_object(
            spec, namespace=self.namespace, pool=self.pool, gpu_type=self.gpu_type, gpus=gpus,
            weights_claim=self.weights_claim, weights_root=self.weights_root,
        ))
        self.gateway.apply(secret_object(spec, namespace=self.namespace, owner=deployment))
        self.gateway.apply(service_object(spec, namespace=self.namespace, owner=deployment))
        return {"namespace": self.namespace, "name": object_name(spec), "server": server_labels(spec)[SERVER_LABEL], "generation": spec.generation}

    def observe(self, handle: dict) -> ServerObservation:
        namespace, name = handle.get("namespace"), handle.get("name")
        if not namespace or not name:
            return ServerObservation(ServerPhase.LOST, detail="no Deployment named")
        deployment = self.gateway.get(DEPLOYMENT, name, namespace)
        if deployment is None:
            return ServerObservation(ServerPhase.LOST, detail=f"Deployment {namespace}/{name} is gone")
        if int((deployment.get("status") or {}).get("readyReplicas") or 0) >= 1:
            return ServerObservation(ServerPhase.LISTENING, url=f"http://{name}.{namespace}.svc:{PORT}")
        selector = f"{SERVER_LABEL}={handle['server']},{GENERATION_LABEL}={handle['generation']}"
        for pod in self.gateway.list(POD, namespace=namespace, label_selector=selector).items:
            ended = _ended(pod)
            if ended:
                return ServerObservation(ServerPhase.EXITED, detail=ended)
        return ServerObservation(ServerPhase.STARTING)

    def stop(self, handle: dict, *, force: bool = False) -> None:
        if handle.get("namespace") and handle.get("name"):
            self.gateway.delete(DEPLOYMENT, handle["name"], handle["namespace"], grace_period_s=0 if force else None)


def _ended(pod: dict) -> str:
    """Return why a server's pod will not serve (its container exited, or cannot start), or ""."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("lastState") or {}).get("terminated") or (status.get("state") or {}).get("terminated")
        waiting = (status.get("state") or {}).get("waiting") or {}
        if terminated and int(status.get("restartCount") or 0) >= 1:
            return f"exit code {terminated.get('exitCode')} ({terminated.get('reason', '')}): {terminated.get('message', '')}".strip()
        if waiting.get("reason") in _STUCK and waiting.get("reason") != "CrashLoopBackOff":
            return f"{waiting['reason']}: {waiting.get('message', '')}".strip()
    return ""

