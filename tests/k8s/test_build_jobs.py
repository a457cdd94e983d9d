"""An environment build's Job and Secret (jobs/launchers/kubernetes/builds.py) validate as the API
server would take them, only the steps that talk to Lab see the build's token, and nothing reaches its pod."""

from __future__ import annotations

from environments.build_clusters import BuildPod
from jobs.launchers.kubernetes.builds import (
    BuildSettings,
    build_job_object,
    build_network_policy_object,
    build_secret_object,
)
from tests.k8s.validation import validate

POD = BuildPod(build_id=42, organization="acme", lab_url="http://lab-web.lab-system:8000", token="lbt_x",
               wheel_filename="echo_env-0.1.0-py3-none-any.whl", builder_args=("build", "--wheel", "/var/lab/build/in/x.whl"),
               timeout_s=1800)


def test_a_builds_job_and_secret_validate_and_its_builder_step_has_no_token():
    job = build_job_object(POD, BuildSettings(cpu=4, memory_gib=16))
    stored = {**job, "metadata": {**job["metadata"], "uid": "uid-job"}}
    secret = build_secret_object(POD, BuildSettings(), owner=stored)
    policy = build_network_policy_object(POD, BuildSettings(), owner=stored)
    validate(job)
    validate(secret)
    validate(policy)
    spec = job["spec"]["template"]["spec"]
    steps = {container["name"]: container for container in spec["initContainers"] + spec["containers"]}

    assert [container["name"] for container in spec["initContainers"]] == ["fetch", "build"]
    assert job["spec"]["activeDeadlineSeconds"] == 1800 + 300 and job["spec"]["backoffLimit"] == 0
    assert steps["build"]["resources"] == {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "16Gi"}}
    assert ["secretKeyRef" in str(container["env"]) for container in steps.values()] == [True, False, True]
    assert all(container["securityContext"]["readOnlyRootFilesystem"] for container in steps.values())
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert secret["stringData"] == {"LAB_BUILD_TOKEN": "lbt_x"} and secret["metadata"]["ownerReferences"][0]["uid"] == "uid-job"
    # nothing reaches a build's pod: the policy selects it (by its build's label) and allows no ingress
    assert policy["spec"] == {"podSelector": {"matchLabels": {"lab.dev/environment-build": "42"}}, "policyTypes": ["Ingress"], "ingress": []}
    assert job["spec"]["template"]["metadata"]["labels"]["lab.dev/environment-build"] == "42"
