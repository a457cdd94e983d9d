"""k8s/sandbox-pool/ (the warm pool of sandbox pods, an opt-in part an overlay adds): every object
validates (kubernetes-validate, strict), the pool's Deployment runs the agent under the
RuntimeClass with the labels Lab claims by, its pods get no egress, each pod's agent gets a key of
its own and never Lab's secret, the Role grants exactly the calls the pool makes, and its
Dockerfile copies only what the repository has."""

from __future__ import annotations

import os
import re
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobs.launchers.kubernetes.sandbox_pods import GatewayPods
from sandboxes.agent import tokens
from sandboxes.runtime.base import SandboxSpec
from sandboxes.runtime.pool import POOL_LABEL, STATE_LABEL, WARM, SandboxPool
from tests.k8s.validation import validate
from tests.support.sandbox_pool import NAMESPACE, PoolCluster

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "k8s" / "sandbox-pool"


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    kustomization = yaml.safe_load((POOL / "kustomization.yaml").read_text())
    found = {}
    for resource in kustomization["resources"]:
        for obj in yaml.safe_load_all((POOL / resource).read_text()):
            if obj:
                found[(obj["kind"], obj["metadata"]["name"])] = obj
    return found


def test_every_object_validates_and_lives_in_the_pools_namespace(objects):
    assert sorted(objects) == [
        ("Deployment", "lab-sandbox-pool-python-3-11"), ("Namespace", "lab-sandboxes"), ("NetworkPolicy", "lab-sandbox-pool"),
        ("Role", "lab-sandbox-pool"), ("RoleBinding", "lab-sandbox-pool"), ("RuntimeClass", "lab-sandbox"),
    ]
    for (kind, _), obj in objects.items():
        validate(obj)
        assert obj["metadata"].get("namespace") == (None if kind in ("Namespace", "RuntimeClass") else NAMESPACE)


def test_the_pool_runs_the_agent_under_its_runtime_class_without_egress(objects):
    pool = objects[("Deployment", "lab-sandbox-pool-python-3-11")]
    spec = pool["spec"]["template"]["spec"]
    container = spec["containers"][0]
    policy = objects[("NetworkPolicy", "lab-sandbox-pool")]

    assert objects[("RuntimeClass", spec["runtimeClassName"])]["handler"] == "runsc"
    assert pool["spec"]["selector"]["matchLabels"] == {POOL_LABEL: "python-3-11", STATE_LABEL: WARM}
    assert container["command"][:3] == ["python", "-m", "sandboxes.agent"] and container["image"] == "lab-sandbox-agent:latest"
    assert container["ports"] == [{"name": "agent", "containerPort": 8765}]
    assert container["resources"]["requests"]["cpu"] and container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["automountServiceAccountToken"] is False and spec["topologySpreadConstraints"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": pool["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]}
    assert (policy["spec"]["policyTypes"], policy["spec"]["egress"]) == (["Ingress", "Egress"], [])


def test_each_pods_agent_gets_a_key_of_its_own_and_never_labs_secret(objects, tmp_path):
    """The init container derives the pod's key from Lab's Secret and the pod's uid into a memory
    folder; the agent container mounts that folder read-only and no Secret at all. Run as the
    manifest says, the init container's command writes the key Lab signs that pod's tokens with."""
    spec = objects[("Deployment", "lab-sandbox-pool-python-3-11")]["spec"]["template"]["spec"]
    (init,), (agent,) = spec["initContainers"], spec["containers"]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    key_mount = next(mount for mount in agent["volumeMounts"] if mount["name"] == "agent-key")
    init_mount = next(mount for mount in init["volumeMounts"] if mount["name"] == "agent-key")
    agent_env = {item["name"]: item for item in agent.get("env", [])}

    assert volumes["agent-key"]["emptyDir"]["medium"] == "Memory" and key_mount["readOnly"] is True
    assert not any("secret" in volume for volume in spec["volumes"]) and "envFrom" not in agent
    assert not any("valueFrom" in item for item in agent.get("env", [])), agent["env"]
    assert agent_env["LAB_SANDBOX_AGENT_SECRET_FILE"]["value"].startswith(key_mount["mountPath"] + "/")
    assert init["image"] == agent["image"] and init_mount["mountPath"] == key_mount["mountPath"]

    secret, uid = secrets.token_hex(32), "6c1d4a8e-7f0b-4e55-9a3e-0d2b7c1f9e11"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("LAB_SANDBOX_AGENT")}
    for item in init["env"]:
        source = item["valueFrom"]
        if "secretKeyRef" in source:
            assert source["secretKeyRef"] == {"name": "lab-sandbox-agent", "key": "secret"}
            environment[item["name"]] = secret
        else:
            assert source["fieldRef"] == {"fieldPath": "metadata.uid"}
            environment[item["name"]] = uid
    command = [sys.executable if part == "python" else part.replace(init_mount["mountPath"], str(tmp_path)) for part in init["command"]]
    subprocess.run(command, cwd=ROOT, env=environment, check=True, timeout=60)

    written = Path(agent_env["LAB_SANDBOX_AGENT_SECRET_FILE"]["value"].replace(key_mount["mountPath"], str(tmp_path)))
    assert stat.S_IMODE(written.stat().st_mode) == 0o400
    key = tokens.secret_from_environment({"LAB_SANDBOX_AGENT_SECRET_FILE": str(written)})
    assert key.decode() == tokens.agent_key(secret.encode(), uid) != tokens.agent_key(secret.encode(), uid[:-1] + "2")
    assert secret.encode() not in key and len(key) == 64
    del environment["LAB_SANDBOX_AGENT_IDENTITY"]
    refused = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "LAB_SANDBOX_AGENT_IDENTITY" in refused.stderr


def test_the_role_grants_exactly_what_the_pool_calls(objects):
    cluster = PoolCluster(replicas=1)
    cluster.gateway.ready_pod(NAMESPACE, cluster.pods()[0]["metadata"]["name"], ip="10.0.0.7")
    pool = SandboxPool(GatewayPods(cluster.gateway, namespace=NAMESPACE), pools={"python:3.11": "python-3-11"})
    pool.release(pool.claim(SandboxSpec(sandbox_id="sbx_rbac", image="python:3.11", cpu_cores=1, memory_gb=1, disk_gb=1)).name)
    pool.claimed()
    used = {(("", "pods"), call) for call, kind in cluster.gateway.calls if kind == "Pod"}
    role = objects[("Role", "lab-sandbox-pool")]
    granted = {((group, resource), verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    subjects = objects[("RoleBinding", "lab-sandbox-pool")]["subjects"]

    assert granted == used == {(("", "pods"), "list"), (("", "pods"), "patch"), (("", "pods"), "delete")}
    assert {(subject["name"], subject["namespace"]) for subject in subjects} == {("lab-web", "lab-system"), ("lab-worker", "lab-system")}


def test_the_agent_dockerfile_copies_only_what_the_repository_has():
    sources = []
    for line in (ROOT / "k8s/images/sandbox-agent/Dockerfile").read_text().splitlines():
        if match := re.match(r"^COPY\s+(?!--from)(.+)$", line.strip()):
            sources += match.group(1).split()[:-1]
    assert "sandboxes/" in sources
    for source in sources:
        listed = subprocess.run(["git", "ls-files", "--", source], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        assert listed.strip(), source
