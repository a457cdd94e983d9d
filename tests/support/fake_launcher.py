"""A launcher for tests: it starts nothing, records what it is asked, and reports what a test
scripts (``exits``/``observations`` per handle), so the reconciler's rules run without processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from jobs.launchers.base import AttemptPhase, Launcher, LaunchRequest, Observation


class FakeLauncher(Launcher):
    """Handles are ``{"id": n}`` (and ``"workdir"`` when a test gives one)."""

    name = "fake"

    def __init__(self, *, workdir: Path | None = None):
        self.workdir = workdir
        self.requests: list[LaunchRequest] = []
        self.observations: dict[int, Observation] = {}
        self.cancels: list[tuple[int, bool]] = []
        self.cleanups: list[int] = []
        self.observe_calls: list[int] = []  # how many handles each observe_many call had
        self.fail_launch: Exception | None = None
        #: Called inside ``launch`` and ``observe_many`` (e.g. to act while the launcher works).
        self.while_working: Callable[[], None] | None = None

    def launch(self, request: LaunchRequest) -> dict:
        if self.while_working:
            self.while_working()
        if self.fail_launch:
            raise self.fail_launch
        self.requests.append(request)
        handle = {"id": len(self.requests)}
        if self.workdir is not None:
            handle["workdir"] = str(self.workdir)
        return handle

    def exit(self, handle: dict, exit_code: int, **fields) -> None:
        """Script the attempt with ``handle`` as exited with ``exit_code``."""
        self.observations[handle["id"]] = Observation(AttemptPhase.EXITED, exit_code=exit_code, **fields)

    def observe(self, handle: dict) -> Observation:
        return self.observations.get(handle.get("id"), Observation(AttemptPhase.RUNNING))

    def observe_many(self, handles: list[dict]) -> list[Observation]:
        self.observe_calls.append(len(handles))
        if self.while_working:
            self.while_working()
        return [self.observe(handle) for handle in handles]

    def cancel(self, handle: dict, *, force: bool = False) -> None:
        self.cancels.append((handle.get("id"), force))

    def cleanup(self, handle: dict) -> None:
        self.cleanups.append(handle.get("id"))

    def engine_workdir(self, handle: dict) -> Path | None:
        return Path(handle["workdir"]) if "workdir" in handle else None
