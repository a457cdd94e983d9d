"""Running the model check (``python -m engine.model_check``) as a subprocess of its own.

Every model Lab adds is checked by the engine's own code in a separate process: an operator's
(``manage.py models add``) and an organization's pushed archive (``jobs.registry.builds``, in a
worker). A pushed archive is hostile input, so with ``LAB_LOCAL_ISOLATION=bubblewrap`` (the
default) the check runs in bubblewrap (``lab.lib.bubblewrap``): no network, nothing of Lab's files
but the Python installation and the engine's code, read-only, and its own scratch folder. The
process group is killed past the timeout; a check dies with the process that started it (a worker
killed mid-check), in bubblewrap or not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from lab.lib.bubblewrap import base_arguments

_REPOSITORY = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CheckResult:
    """What a check found: ``status`` ``ready`` or ``failed`` with ``error``; ``model`` the
    engine's report (``engine.model_check``); ``directory`` the checked directory (for an
    archive, the folder it unpacked to); ``log`` its stderr, as text."""

    status: str
    error: str
    directory: Path
    log: str
    model: dict = field(default_factory=dict)


def _sandboxed(command: list[str], *, scratch: Path, readable: list[Path]) -> list[str]:
    """``command`` under bubblewrap: the system's programs, the Python installation and the
    engine's code read-only, ``scratch`` writable, no network."""
    import_paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), _REPOSITORY / "engine", _REPOSITORY / "sdk"}
    args = base_arguments(hostname="lab-model-check", sysfs=False)
    for path in sorted(import_paths | {path.resolve() for path in readable}):
        args += ["--ro-bind", str(path), str(path)]
    args += ["--bind", str(scratch), str(scratch), "--chdir", str(_REPOSITORY)]
    return [*args, "--", *command]


def run_check(*, scratch: Path, directory: Path, archive: Path | None = None, sandbox: bool, timeout_s: float,
              max_bytes: int = 0) -> CheckResult:
    """Check the model ``directory`` (or unpack ``archive`` into it first), with ``scratch`` (a
    folder holding ``directory``) as the check's working folder; return what it found. A check
    that crashed or ran past ``timeout_s`` seconds is a failed result saying so."""
    result_path = scratch / "check-result.json"
    command = [sys.executable, "-m", "engine.model_check", "--directory", str(directory), "--result", str(result_path)]
    if archive is not None:
        command += ["--archive", str(archive), "--max-bytes", str(max_bytes)]
    readable = [path for path in (archive, directory) if path is not None and not path.resolve().is_relative_to(scratch.resolve())]
    if sandbox:
        command = _sandboxed(command, scratch=scratch.resolve(), readable=readable)
    else:  # the check ends with this process however it ends, as bubblewrap's --die-with-parent does
        command += ["--parent", str(os.getpid())]
    environment = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(scratch), "LANG": "C.UTF-8",
        "TMPDIR": str(scratch), "PYTHONPATH": str(_REPOSITORY), "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
    }
    process = subprocess.Popen(
        command, cwd=_REPOSITORY, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        output, _ = process.communicate()
        log = output.decode("utf-8", errors="replace")
        return CheckResult("failed", f"the check took longer than {timeout_s:.0f} s", directory, log)
    except BaseException:
        _kill_group(process)
        process.wait()
        raise
    log = output.decode("utf-8", errors="replace")
    try:
        found = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return CheckResult("failed", f"the check crashed (exit {process.returncode}): see its log", directory, log)
    checked = directory / found["directory"] if found.get("directory") else directory
    return CheckResult(found["status"], found.get("error", ""), checked, log, found.get("model") or {})


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def check_sandboxed() -> bool:
    """Whether checks of pushed models run in bubblewrap (``LAB_LOCAL_ISOLATION``)."""
    return settings.LAB_LOCAL_ISOLATION == "bubblewrap"
