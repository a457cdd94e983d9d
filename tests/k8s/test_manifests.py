"""k8s/ renders and validates: the kustomization's resources resolve (and ``kubectl kustomize``
agrees where kubectl is installed), every object validates (kubernetes-validate strict for core
kinds, the CRD schemas for Kueue kinds), every long-running container has resources and probes,
the launcher's RBAC grants exactly what the launcher calls, and the Dockerfiles copy only what
the repository has (they are not built here: no container engine)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from environments.build_clusters import BuildPod
from jobs.launchers.base import LaunchRequest
from jobs.launchers.kubernetes.builds import BuildSettings, KubernetesBuilds
from jobs.launchers.kubernetes.launcher import KubernetesLauncher
from jobs.launchers.kubernetes.objects import CLUSTER_QUEUE, DEFAULT_GPU_PRODUCTS, PRIORITY_CLASSES, PoolSettings
from serving.runtime.base import ServerSpec
from serving.runtime.kubernetes import KubernetesServerRuntime
from tests.k8s.validation import CRD_FILES, DATA, validate
from tests.support.fake_gateway import FakeGateway

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "ClusterQueue", "Cohort",
                  "ResourceFlavor", "WorkloadPriorityClass"}


def _merge(base: dict, patch: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in patch.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def resolve(directory: Path) -> list[dict]:
    """Build a kustomization as kustomize does for the features k8s/ uses: resources (files and
    directories), ``images``, patches by kind and name, and metadata ``labels``."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objects: list[dict] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        assert path.exists(), f"{directory.relative_to(ROOT)}: resource {resource} is missing"
        if path.is_dir():
            objects += resolve(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for patch in kustomization.get("patches", []):
        body = yaml.safe_load((directory / patch["path"]).read_text())
        targets = [index for index, obj in enumerate(objects)
                   if (obj["kind"], obj["metadata"]["name"]) == (body["kind"], body["metadata"]["name"])]
        assert len(targets) == 1, f"patch {patch['path']} matches {len(targets)} objects"
        objects[targets[0]] = _merge(objects[targets[0]], body)
    images = {image["name"]: f"{image['newName']}:{image['newTag']}" for image in kustomization.get("images", [])}
    for obj in objects:
        for container in containers(obj):
            container["image"] = images.get(container["image"].split(":")[0], container["image"])
        for entry in kustomization.get("labels", []):
            obj["metadata"].setdefault("labels", {}).update(entry["pairs"])
    return objects


def containers(obj: dict) -> list[dict]:
    template = (obj.get("spec") or {}).get("template") or {}
    return (template.get("spec") or {}).get("containers") or []


def identity(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return resolve(K8S / "overlays" / "example")


def test_the_example_overlay_renders_every_part_issue_14_names(rendered):
    kinds = sorted({obj["kind"] for obj in rendered})

    assert kinds == sorted([
        "ClusterQueue", "ClusterRole", "ClusterRoleBinding", "Cohort", "ConfigMap", "Deployment", "Ingress", "Job",
        "LocalQueue", "Namespace", "PersistentVolumeClaim", "PodDisruptionBudget", "PriorityClass", "ResourceFlavor",
        "Service", "ServiceAccount", "WorkloadPriorityClass",
    ])
    assert {obj["metadata"]["name"] for obj in rendered if obj["kind"] == "Deployment"} == {"lab-web", "lab-worker", "lab-beat"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed; resolve() covers the build")
def test_kubectl_kustomize_renders_the_same_objects(rendered):
    output = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / "example")], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    built = [doc for doc in yaml.safe_load_all(output) if doc]

    assert sorted(map(identity, built)) == sorted(map(identity, rendered))
    by_identity = {identity(obj): obj for obj in built}
    for obj in rendered:
        assert by_identity[identity(obj)] == obj, identity(obj)


def test_every_object_validates(rendered):
    for obj in rendered:
        validate(obj)


def test_cluster_scoped_kinds_have_no_namespace_and_the_others_have_one(rendered):
    for obj in rendered:
        namespaced = obj["kind"] not in CLUSTER_SCOPED
        assert ("namespace" in obj["metadata"]) == namespaced, identity(obj)
        if (group := obj["apiVersion"].rpartition("/")[0], obj["kind"]) in CRD_FILES:
            scope = yaml.safe_load((DATA / CRD_FILES[(group, obj["kind"])]).read_text())["spec"]["scope"]
            assert scope == ("Namespaced" if namespaced else "Cluster"), identity(obj)


def test_every_long_running_container_has_resources_and_probes(rendered):
    for obj in rendered:
        for container in containers(obj):
            resources = container["resources"]
            assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"], identity(obj)
            if obj["kind"] == "Deployment":
                assert "readinessProbe" in container and "livenessProbe" in container, identity(obj)
    web = next(obj for obj in rendered if identity(obj) == ("Deployment", "lab-system", "lab-web"))
    container = containers(web)[0]
    assert (container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]) == ("/readyz", "/healthz")


def test_beat_runs_as_a_single_replica_and_lab_pods_run_at_high_priority(rendered):
    deployments = {obj["metadata"]["name"]: obj for obj in rendered if obj["kind"] == "Deployment"}

    assert deployments["lab-beat"]["spec"]["replicas"] == 1
    assert deployments["lab-beat"]["spec"]["strategy"] == {"type": "Recreate"}
    for deployment in deployments.values():
        assert deployment["spec"]["template"]["spec"]["priorityClassName"] == "lab-system-high"
        assert containers(deployment)[0]["image"] == "registry.example.com/lab/lab:0.1.0"


def test_the_kueue_objects_are_the_ones_the_launcher_names(rendered):
    names = {kind: {obj["metadata"]["name"] for obj in rendered if obj["kind"] == kind}
             for kind in ("WorkloadPriorityClass", "ClusterQueue", "ResourceFlavor")}

    assert names["WorkloadPriorityClass"] == set(PRIORITY_CLASSES.values())
    assert names["ClusterQueue"] == {CLUSTER_QUEUE}
    products = {obj["spec"]["nodeLabels"]["nvidia.com/gpu.product"] for obj in rendered
                if obj["kind"] == "ResourceFlavor" and obj.get("spec", {}).get("nodeLabels")}
    assert products <= set(DEFAULT_GPU_PRODUCTS.values())
    queue = next(obj for obj in rendered if obj["kind"] == "ClusterQueue")
    assert queue["spec"]["cohortName"] == "lab"
    assert {flavor["name"] for group in queue["spec"]["resourceGroups"] for flavor in group["flavors"]} == names["ResourceFlavor"]


#: The gateway call each RBAC verb stands for (``apply`` creates, and gets on 409).
VERBS = {"apply": ["create", "get"], "get": ["get"], "list": ["list"], "watch": ["watch"], "delete": ["delete"],
         "pending_workloads": ["get"]}
RESOURCES = {"Namespace": ("", "namespaces"), "Secret": ("", "secrets"), "Pod": ("", "pods"), "Job": ("batch", "jobs"),
             "JobSet": ("jobset.x-k8s.io", "jobsets"), "LocalQueue": ("kueue.x-k8s.io", "localqueues"),
             "Workload": ("kueue.x-k8s.io", "workloads"), "Node": ("", "nodes"),
             "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
             "Deployment": ("apps", "deployments"), "Service": ("", "services"),
             "PendingWorkloadsSummary": ("visibility.kueue.x-k8s.io", "clusterqueues/pendingworkloads")}


def test_the_launchers_rbac_grants_exactly_what_it_the_inference_servers_and_environment_builds_call(rendered):
    cluster = FakeGateway()
    launcher = KubernetesLauncher(gateway=cluster, settings=PoolSettings(), background=False,
                                  clock=lambda: datetime.now(timezone.utc))
    request = LaunchRequest(job_id="job_0123456789abcdefghij", attempt=1, spec={"max_runtime_minutes": 60}, lab_url="http://lab",
                            token="t", bootstrap_token="ljb_t", organization="acme", namespace="lab-acme")
    handle = launcher.launch(request)
    launcher.launch(request)  # again: 409s, answered by get
    launcher.observe_many([handle])
    cluster.admit("lab-acme", handle["jobset"])
    launcher.observe_many([handle])
    launcher.cancel(handle)
    launcher.cleanup(handle)
    launcher.sweep_orphans([])
    launcher.pool_inventory()
    launcher.queue_places()
    serving = KubernetesServerRuntime(cluster, namespace="lab-serving", pool=PoolSettings(), gpu_type="H100",
                                      weights_claim="lab-serving-weights", weights_root="/var/lab/serving/weights")
    server = ServerSpec(server_id="srv_0123456789abcdefghij", generation=1, model="m", served_model="m", max_adapters=1, token="t")
    served = serving.start(server)
    serving.start(server)
    serving.observe(served)
    serving.stop(served)
    builds = KubernetesBuilds(gateway=cluster, settings=BuildSettings())
    build = BuildPod(build_id=7, organization="acme", lab_url="http://lab", token="lbt_t", wheel_filename="x-1-py3-none-any.whl",
                     builder_args=("build",), timeout_s=60)
    builds.start(build)
    builds.start(build)  # again: 409s, answered by get
    builds.outcome(7)
    cluster.objects[("Job", "lab-builds", "lab-build-7")]["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    builds.outcome(7)  # a failed build's pod is read for an OOM kill
    used = {(RESOURCES[kind], verb) for call, kind in cluster.calls for verb in VERBS[call]}
    role = next(obj for obj in rendered if obj["kind"] == "ClusterRole")
    granted = {((group, resource), verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}

    assert granted == used


IMAGES = K8S / "images"


def copies(dockerfile: Path) -> list[str]:
    sources = []
    for line in dockerfile.read_text().splitlines():
        if match := re.match(r"^COPY\s+(?!--from)(.+)$", line.strip()):
            sources += match.group(1).split()[:-1]
    return sources


def tracked(path: str) -> bool:
    listed = subprocess.run(["git", "ls-files", "--", path], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return bool(listed.strip())


@pytest.mark.parametrize("dockerfile", sorted(IMAGES.glob("*.Dockerfile")), ids=lambda path: path.name)
def test_every_file_a_dockerfile_copies_is_in_the_repository(dockerfile):
    sources = copies(dockerfile)

    assert sources
    missing = [source for source in sources if not (ROOT / source).exists()]
    assert missing == []
    if shutil.which("git") and (ROOT / ".git").exists():
        assert [source for source in sources if not tracked(source)] == []


def test_vllm_is_only_in_the_gpu_image():
    assert sorted(path.name for path in IMAGES.glob("*.Dockerfile")) == ["engine-cpu.Dockerfile", "engine-gpu.Dockerfile", "lab.Dockerfile"]
    assert "requirements-gpu.txt" in copies(IMAGES / "engine-gpu.Dockerfile")
    for name in ("lab.Dockerfile", "engine-cpu.Dockerfile"):
        text = (IMAGES / name).read_text()
        assert "requirements-gpu" not in text and "pip install vllm" not in text
