"""Environment builds' batch Jobs on the in-memory cluster: ``BuildJobsGateway`` adds the Job
controller of a build's Job (a pod per Job; ``end_build``, ``pass_deadline``) to ``FakeGateway``,
and ``run_build_pod`` plays the kubelet: it runs the pod's containers (init containers first, as
real local subprocesses of the command the manifest names, ``python`` this interpreter) with the
pod's variables (a ``secretKeyRef`` read from the Secret it names) and its volumes as local
folders, then ends the Job as their exits say."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

from environments.builder.pod import BUILD_DIR
from jobs.launchers.kubernetes.builds import BUILD_COMPONENT
from jobs.launchers.kubernetes.kinds import JOB, POD, kind_of
from jobs.launchers.kubernetes.objects import COMPONENT_LABEL, TMP_DIR
from tests.support.fake_gateway import FakeGateway

REPO = Path(__file__).resolve().parents[2]


class BuildJobsGateway(FakeGateway):
    """A FakeGateway whose Job controller makes the pod of a build's Job."""

    def apply(self, obj: dict) -> dict:
        created = ("Job", obj["metadata"].get("namespace", ""), obj["metadata"]["name"]) not in self.objects
        stored = super().apply(obj)
        if created and kind_of(obj) is JOB and (stored["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == BUILD_COMPONENT:
            template = stored["spec"]["template"]
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"{stored['metadata']['name']}-pod", "namespace": stored["metadata"]["namespace"],
                                "uid": f"uid-{next(self._uids)}", "labels": dict(template["metadata"].get("labels") or {}),
                                "ownerReferences": [self._owner(stored)]},
                   "spec": copy.deepcopy(template["spec"]), "status": {"phase": "Pending"}}
            self._store(POD, pod, "ADDED")
        return stored

    def build_pod(self, namespace: str, job_name: str) -> dict:
        """The stored pod of a build's Job (not a copy)."""
        return self.objects[("Pod", namespace, f"{job_name}-pod")]

    def end_build(self, namespace: str, job_name: str, exit_codes: dict[str, int], *, reasons: dict[str, str] | None = None) -> None:
        """The pod's containers ended with ``exit_codes`` (by name; one missing never ran: an init
        container before it failed), ``reasons`` their terminated reasons (``OOMKilled``); the Job
        completes when all exited 0, else fails (``backoffLimit: 0``)."""
        pod, reasons = self.build_pod(namespace, job_name), reasons or {}

        def statuses(containers: list[dict]) -> list[dict]:
            return [{"name": container["name"], "ready": False, "restartCount": 0, "state": (
                {"terminated": {"exitCode": exit_codes[container["name"]], "reason": reasons.get(container["name"])
                                or ("Completed" if exit_codes[container["name"]] == 0 else "Error")}}
                if container["name"] in exit_codes else {"waiting": {"reason": "PodInitializing"}})} for container in containers]

        failed = any(code != 0 for code in exit_codes.values())
        pod["status"] = {"phase": "Failed" if failed else "Succeeded", "initContainerStatuses": statuses(pod["spec"]["initContainers"]),
                         "containerStatuses": statuses(pod["spec"]["containers"])}
        self._store(POD, pod, "MODIFIED")
        job = self.objects[("Job", namespace, job_name)]
        job["status"] = ({"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                                        "message": "Job has reached the specified backoff limit"}]} if failed
                         else {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True", "reason": "Completed"}]})
        self._store(JOB, job, "MODIFIED")

    def pass_deadline(self, namespace: str, job_name: str) -> None:
        """The Job ran past its ``activeDeadlineSeconds``: failed, its pod killed and deleted."""
        job = self.objects[("Job", namespace, job_name)]
        job["status"] = {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                                      "message": "Job was active longer than specified deadline"}]}
        self._store(JOB, job, "MODIFIED")
        self._delete(("Pod", namespace, f"{job_name}-pod"))


def run_build_pod(cluster: BuildJobsGateway, namespace: str, job_name: str, root: Path) -> tuple[dict[str, int], dict[str, str]]:
    """Run the build pod's containers locally (see the module's docstring) with ``root`` as its
    volumes, end its Job, and return each container's exit status and output."""
    pod = cluster.build_pod(namespace, job_name)
    volumes = {BUILD_DIR: root / "build", TMP_DIR: root / "tmp"}
    for folder in volumes.values():
        folder.mkdir(parents=True, exist_ok=True)

    def local(value: str) -> str:
        for mount, folder in volumes.items():
            if value == mount or value.startswith(mount + "/"):
                return str(folder) + value[len(mount):]
        return value

    exit_codes, outputs = {}, {}
    for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
        for variable in container["env"]:
            if "valueFrom" in variable:
                reference = variable["valueFrom"]["secretKeyRef"]
                secret = cluster.objects[("Secret", namespace, reference["name"])]
                environment[variable["name"]] = secret["stringData"][reference["key"]]
            else:
                environment[variable["name"]] = local(variable["value"])
        argv = [sys.executable if part == "python" else local(part) for part in container["command"] + container["args"]]
        done = subprocess.run(argv, cwd=REPO, env=environment, capture_output=True, text=True, timeout=900)
        exit_codes[container["name"]], outputs[container["name"]] = done.returncode, done.stdout + done.stderr
        if done.returncode != 0:
            break
    cluster.end_build(namespace, job_name, exit_codes)
    return exit_codes, outputs
