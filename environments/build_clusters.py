"""Where a build runs when it is not a subprocess of the worker: a cluster's batch Job.

``environments.pod_builds`` asks a ``BuildCluster`` to start a build (``BuildPod``) and what became
of it (``BuildOutcome``); the app that owns the launchers registers one per launcher
(``register``: the Kubernetes pool's is ``jobs.launchers.kubernetes.builds``), since this app
never imports ``jobs``. No Django here: the cluster side reads these plain classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

#: What became of a build's Job: still running, ended 0 (the pod reported), or ended otherwise.
RUNNING, SUCCEEDED, FAILED, GONE = "running", "succeeded", "failed", "gone"
#: Why a failed Job failed: its deadline passed, a container was OOM-killed, anything else.
DEADLINE, OUT_OF_MEMORY, CRASHED = "deadline", "out_of_memory", "crashed"
#: How long past ``LAB_ENVIRONMENT_BUILD_TIMEOUT_S`` (the builder's limit) a build's Job may run:
#: fetching the wheel before, reporting after (its ``activeDeadlineSeconds``).
REPORT_GRACE_S = 300


@dataclass(frozen=True)
class BuildPod:
    """One build as a pod runs it (``environments.builder.pod``): ``builder_args`` are the
    builder's arguments after ``python -m environments.builder`` (the pod's paths), ``token`` the
    build's callback token (``environments.pod_builds``), ``timeout_s`` the builder's limit."""

    build_id: int
    organization: str
    lab_url: str
    token: str
    wheel_filename: str
    builder_args: tuple[str, ...]
    timeout_s: int


@dataclass(frozen=True)
class BuildOutcome:
    """``state`` one of RUNNING, SUCCEEDED, FAILED, GONE; for FAILED, ``reason`` (DEADLINE,
    OUT_OF_MEMORY, CRASHED) and the cluster's ``message``."""

    state: str
    reason: str = ""
    message: str = ""


class BuildCluster(Protocol):
    def start(self, pod: BuildPod) -> str:
        """Create the build's Job (once: a second start finds the first); return its name."""

    def outcome(self, build_id: int) -> BuildOutcome:
        """What became of the build's Job."""


_factories: dict[str, Callable[[], BuildCluster]] = {}


def register(launcher: str, factory: Callable[[], BuildCluster]) -> None:
    """Run the builds of a Lab whose ``LAB_LAUNCHER`` is ``launcher`` on ``factory()``'s cluster."""
    _factories[launcher] = factory


def for_launcher(launcher: str) -> BuildCluster | None:
    """The cluster builds run on with ``launcher``, or None: they run as the worker's subprocesses."""
    factory = _factories.get(launcher)
    return factory() if factory is not None else None
