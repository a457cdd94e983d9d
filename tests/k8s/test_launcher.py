"""The Kubernetes launcher on its own (no database): orphan sweeping, resume needing object
storage, namespaces made once, and what it says of handles it does not know."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jobs.launchers.base import AttemptPhase, LaunchRequest
from jobs.launchers.kubernetes.kinds import JOBSET
from jobs.launchers.kubernetes.launcher import WATCHES, KubernetesLauncher
from jobs.launchers.kubernetes.objects import PoolSettings
from tests.support.fake_gateway import FakeGateway

NOW = datetime(2026, 12, 1, 13, 0, tzinfo=timezone.utc)  # the fake stamps creationTimestamp 12:00


def make(clock=lambda: NOW) -> tuple[FakeGateway, KubernetesLauncher]:
    cluster = FakeGateway()
    return cluster, KubernetesLauncher(gateway=cluster, settings=PoolSettings(), background=False, clock=clock)


def request(job_id: str = "job_0123456789abcdefghij", **changes) -> LaunchRequest:
    fields = dict(job_id=job_id, attempt=1, spec={"max_runtime_minutes": 60}, lab_url="http://lab", token="t", bootstrap_token="ljb_t",
                  organization="acme", namespace="lab-acme")
    return LaunchRequest(**{**fields, **changes})


def test_it_sweeps_old_jobsets_of_no_live_attempt_only():
    cluster, launcher = make()
    live = launcher.launch(request("job_aaaaaaaaaaaaaaaaaaaa"))
    orphan = launcher.launch(request("job_bbbbbbbbbbbbbbbbbbbb"))
    launcher.observe_many([live])  # the cache is in sync

    assert launcher.sweep_orphans([live]) == [f"lab-acme/{orphan['jobset']}"]
    assert [name for kind, _, name in cluster.objects if kind == "JobSet"] == [live["jobset"]]


def test_it_sweeps_nothing_young_or_while_out_of_sync():
    cluster, launcher = make(clock=lambda: NOW - timedelta(minutes=55))  # five minutes after creation
    launcher.launch(request())
    assert launcher.sweep_orphans([]) == []  # never synced
    launcher.observe_many([])
    assert launcher.sweep_orphans([]) == []  # too young: its launch may not be recorded yet
    assert cluster.get(JOBSET, "lab-job-0123456789abcdefghij-a1", "lab-acme") is not None


def test_a_resume_from_a_local_archive_is_refused_and_creates_nothing():
    cluster, launcher = make()

    with pytest.raises(RuntimeError, match="LAB_STORAGE_URL"):
        launcher.launch(request(resume_archive=Path("/var/lab/checkpoints/ckpt.tar")))

    assert cluster.objects == {}


def test_the_namespace_and_queue_are_made_once_per_namespace():
    cluster, launcher = make()

    launcher.launch(request("job_aaaaaaaaaaaaaaaaaaaa"))
    launcher.launch(request("job_bbbbbbbbbbbbbbbbbbbb"))
    launcher.launch(request("job_cccccccccccccccccccc", namespace="lab-globex", organization="globex"))

    applied = [kind for call, kind in cluster.calls if call == "apply"]
    assert applied.count("Namespace") == 2 and applied.count("LocalQueue") == 2
    assert applied.count("JobSet") == 3 and applied.count("Secret") == 3
    assert cluster.objects[("Namespace", "", "lab-globex")]["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "lab", "lab.dev/organization": "globex"}


def test_a_shared_namespace_carries_no_organization():
    cluster, launcher = make()
    launcher.settings = PoolSettings(shared_namespace="lab-jobs")

    launcher.launch(request(namespace="lab-jobs"))

    assert cluster.objects[("Namespace", "", "lab-jobs")]["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "lab"}


def test_a_handle_of_another_launcher_is_lost():
    _, launcher = make()

    (observation,) = launcher.observe_many([{"workdir": "/var/lab/runs/job_x/attempt-1"}])

    assert observation.phase == AttemptPhase.LOST


def test_a_jobset_created_while_a_listing_was_under_way_is_not_taken_for_deleted():
    cluster, launcher = make()
    launcher.observe_many([])  # first listing done
    listing = cluster.list
    created = {}

    def list_then_launch(kind, **arguments):
        answer = listing(kind, **arguments)  # the snapshot is taken before the launch below
        created["handle"] = launcher.launch(request())
        return answer

    cluster.list = list_then_launch
    launcher.cache._relist(WATCHES[-1])  # a resync of the JobSets, before any watch event of the new one
    handle = created["handle"]

    assert not launcher.cache.was_deleted(handle["namespace"], handle["jobset"])
    assert launcher.cache.group(handle["namespace"], handle["jobset"]).jobset is not None
