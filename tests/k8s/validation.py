"""Validate Kubernetes objects as the API server would, without one.

Core kinds (Namespace, Secret, Deployment, ...) go through ``kubernetes-validate`` with the
Kubernetes 1.37 schemas in strict mode (unknown fields are errors). Kueue and JobSet kinds go
through ``jsonschema`` against their CRD's ``openAPIV3Schema`` (tests/k8s/data/), plus the same
strictness: a field the schema does not declare is an error unless the schema preserves unknown
fields there (the API server's strict field validation).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

DATA = Path(__file__).parent / "data"
KUBERNETES_VERSION = "1.37.0"
CRD_FILES = {
    ("jobset.x-k8s.io", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
    ("kueue.x-k8s.io", "ClusterQueue"): "kueue.x-k8s.io_clusterqueues.yaml",
    ("kueue.x-k8s.io", "Cohort"): "kueue.x-k8s.io_cohorts.yaml",
    ("kueue.x-k8s.io", "LocalQueue"): "kueue.x-k8s.io_localqueues.yaml",
    ("kueue.x-k8s.io", "ResourceFlavor"): "kueue.x-k8s.io_resourceflavors.yaml",
    ("kueue.x-k8s.io", "WorkloadPriorityClass"): "kueue.x-k8s.io_workloadpriorityclasses.yaml",
}


@cache
def crd_schema(group: str, version: str, kind: str) -> dict:
    """Return the openAPIV3Schema of ``kind`` at ``version`` from its CRD file."""
    crd = yaml.safe_load((DATA / CRD_FILES[(group, kind)]).read_text())
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise KeyError(f"{kind} has no version {version} in {CRD_FILES[(group, kind)]}")


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Return the dotted paths of fields in ``obj`` that ``schema`` does not declare."""
    problems = []
    if isinstance(obj, dict) and schema.get("type") == "object" and not schema.get("x-kubernetes-preserve-unknown-fields"):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if properties is not None and key in properties:
                problems += unknown_fields(value, properties[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                problems += unknown_fields(value, extra, f"{path}.{key}")
            elif properties is not None:
                problems.append(f"{path}.{key}".lstrip("."))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            problems += unknown_fields(item, schema["items"], f"{path}.{index}")
    return problems


def validate(obj: dict) -> None:
    """Raise AssertionError naming every problem of ``obj`` (a manifest as a dict)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    if (group, obj["kind"]) in CRD_FILES:
        schema = crd_schema(group, version, obj["kind"])
        errors = [f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
                  for error in jsonschema.Draft7Validator(schema).iter_errors(obj)]
        errors += [f"{field}: unknown field" for field in unknown_fields(obj, schema)]
        assert not errors, f"{obj['kind']} {obj['metadata'].get('name')}: " + "; ".join(errors)
        return
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        raise AssertionError(f"{obj['kind']} {obj['metadata'].get('name')}: {error.path}: {error.message}") from None
