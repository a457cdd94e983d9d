"""An environment build's Job and Secret (jobs/launchers/kubernetes/builds.py) validate as the API
server would take them, only the steps that talk to Lab see the build's token, and nothing reaches its pod."""

from __future__ import annotations

import ipaddress

from environments.build_clusters import BuildPod
from jobs.launchers.kubernetes.builds import (
    BuildSettings,
    build_job_object,
    build_network_policy_object,
    build_secret_object,
)
from jobs.launchers.kubernetes.objects import DNS_EGRESS
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
    assert policy["spec"]["podSelector"] == {"matchLabels": {"lab.dev/environment-build": "42"}}
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["ingress"] == []
    assert job["spec"]["template"]["metadata"]["labels"]["lab.dev/environment-build"] == "42"


def _reachable(policy: dict, address: str) -> bool:
    """Whether ``policy``'s egress ipBlocks let the pod reach ``address`` (selectors aside)."""
    target = ipaddress.ip_address(address)
    for rule in policy["spec"]["egress"]:
        for peer in rule.get("to", []):
            block = peer.get("ipBlock")
            if block and target.version == ipaddress.ip_network(block["cidr"]).version and target in ipaddress.ip_network(block["cidr"]) \
                    and not any(target in ipaddress.ip_network(cidr) for cidr in block.get("except", [])):
                return True
    return False


def test_a_builds_pod_reaches_the_dns_public_addresses_and_what_it_is_given_never_the_metadata_or_private_ones():
    mirror = {"to": [{"ipBlock": {"cidr": "10.20.0.5/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}
    policy = build_network_policy_object(POD, BuildSettings(egress=(mirror,)), owner={
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "lab-build-42", "uid": "u"}})
    validate(policy)
    assert DNS_EGRESS in policy["spec"]["egress"] and mirror in policy["spec"]["egress"]
    for public in ("151.101.0.223", "2a04:4e42::223"):  # a package index's CDN
        assert _reachable(policy, public), public
    for refused in ("169.254.169.254", "fd00:ec2::254", "10.0.0.12", "172.16.3.4", "192.168.1.1", "100.64.0.1", "127.0.0.1", "::1",
                    "::ffff:169.254.169.254", "fe80::1"):
        assert not _reachable(policy, refused), refused
    assert _reachable(policy, "10.20.0.5")  # the private mirror the operator allowed
