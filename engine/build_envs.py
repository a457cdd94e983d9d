"""The virtual environment a job runs an environment's build in, installed from the build's lock
and cached on the machine by the lock's hash.

Lab hands the build with the package (``LAB_JOB_ENVIRONMENT_PACKAGES``, each package's
``build``: ``{"number", "api", "lock": [{"name", "version", "filename", "sha256", "url"}]}``,
``url`` a ``file://`` path into the wheelhouse or a pre-signed URL, fetched like the package's own
wheel, through the engine's egress). ``ensure_environment`` returns the Python of the
environment for that lock:

- its folder is ``<cache>/<lock hash>`` (``lock_hash``: the SHA-256 of the lock's name, version and
  wheel SHA-256 lines and the engine's Python version), where ``<cache>`` is
  ``LAB_ENGINE_ENV_CACHE`` (the launcher's cache folder on the machine, shared by the jobs of one
  organization) or the attempt's own ``<workdir>/environments/cache``;
- a folder that is there (it holds ``.lab-ready``) is used as it is: the second job on a build
  starts without installing anything;
- otherwise, holding ``<cache>/<lock hash>.lock`` (``flock``: one installer per lock at a time,
  across jobs), each wheel is fetched into the attempt's work dir and its SHA-256 checked, a
  relocatable venv is made with uv (``uv venv --relocatable``) beside the target and the lock is
  installed into it offline (``uv pip install --offline --no-index --no-deps --require-hashes``),
  then the venv is renamed into place and marked ready.

uv is ``LAB_ENGINE_UV`` (the launcher passes the path of the uv it ships), else the ``uv`` beside
the engine's Python, else ``python -m uv``. Nothing is fetched from an index: the lock's wheels
are the only packages installed. The package itself is not installed here: it goes into the
attempt's site folder as every package does (``engine.packages``) and the bridge appends that.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from engine.config import environment
from engine.environments.base import InvalidEnvironment

CACHE_VARIABLE = "LAB_ENGINE_ENV_CACHE"
UV_VARIABLE = "LAB_ENGINE_UV"
READY_MARK = ".lab-ready"
#: Seconds creating the venv and installing the lock may take.
INSTALL_TIMEOUT_S = 600


def lock_hash(lock: list[dict]) -> str:
    """The key of ``lock``'s environment: a SHA-256 over its entries (name, version, wheel
    SHA-256, sorted) and the engine's Python version, hex."""
    lines = sorted(f"{entry['name']}=={entry['version']} {entry['sha256']}" for entry in lock)
    lines.append(f"python {sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def cache_root(workdir: Path, environ=None) -> Path:
    """Where built environments are kept: ``LAB_ENGINE_ENV_CACHE``, else ``<workdir>/environments/cache``."""
    value = (environment() if environ is None else environ).get(CACHE_VARIABLE)
    return Path(value) if value else workdir / "environments" / "cache"


def uv_command(environ=None) -> list[str]:
    """The command that runs uv (``LAB_ENGINE_UV``, the uv beside this Python, or ``python -m uv``)."""
    value = (environment() if environ is None else environ).get(UV_VARIABLE)
    if value:
        return [value]
    beside = Path(sys.executable).parent / "uv"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "uv"]


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_environment(
    package_id: str, lock: list[dict], workdir: Path, fetch: Callable[[dict, Path], Path], log: Callable[[str], None] = print,
) -> tuple[Path, bool]:
    """Return ``(the Python of lock's environment, whether it was installed now)``.

    ``fetch(entry, folder)`` copies one lock entry's wheel into ``folder`` and checks its SHA-256
    (``engine.packages``' fetch). Raises InvalidEnvironment naming the package when a wheel cannot
    be fetched or uv fails.
    """
    root = cache_root(workdir)
    root.mkdir(parents=True, exist_ok=True)
    key = lock_hash(lock)
    venv = root / key
    if (venv / READY_MARK).is_file():
        return _python(venv), False
    with (root / f"{key}.lock").open("a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        try:
            if (venv / READY_MARK).is_file():  # another job installed it meanwhile
                return _python(venv), False
            started = time.monotonic()
            wheels = workdir / "environments" / "build-wheels"
            shutil.rmtree(wheels, ignore_errors=True)
            wheels.mkdir(parents=True)
            for entry in lock:
                fetch(entry, wheels)
            staging = root / f"{key}.{os.getpid()}.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            try:
                _install(package_id, lock, wheels, staging)
                shutil.rmtree(venv, ignore_errors=True)  # a half-made one of a crashed job
                staging.rename(venv)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            (venv / READY_MARK).write_text(f"{len(lock)} distributions\n")
            shutil.rmtree(wheels, ignore_errors=True)
            log(f"environment {package_id}: installed its build's {len(lock)} locked distributions in "
                f"{time.monotonic() - started:.1f} s ({venv})")
            return _python(venv), True
        finally:
            fcntl.flock(holder, fcntl.LOCK_UN)


def _install(package_id: str, lock: list[dict], wheels: Path, venv: Path) -> None:
    uv = uv_command()
    uv_environment = {
        **{name: value for name, value in environment().items() if name in ("PATH", "HOME", "LANG", "TMPDIR")},
        "UV_OFFLINE": "1", "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never",
        "UV_CACHE_DIR": str(venv.parent / ".uv-cache"),
    }
    (wheels / "lock.txt").write_text(
        "".join(f"{entry['name']}=={entry['version']} --hash=sha256:{entry['sha256']}\n" for entry in lock)
    )
    steps = [
        [*uv, "venv", "--quiet", "--relocatable", "--python", sys.executable, str(venv)],
        [*uv, "pip", "install", "--quiet", "--python", str(_python(venv)), "--offline", "--no-index",
         "--find-links", str(wheels), "--no-deps", "--require-hashes", "-r", str(wheels / "lock.txt")],
    ]
    for command in steps[: 2 if lock else 1]:
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=uv_environment, check=False)
        except subprocess.TimeoutExpired:
            raise InvalidEnvironment(f"environment {package_id}: installing its build took more than {INSTALL_TIMEOUT_S} s") from None
        except OSError as error:
            raise InvalidEnvironment(f"environment {package_id}: cannot run uv to install its build: {error}") from None
        if result.returncode != 0:
            message = " ".join(result.stderr.split())[-400:] or "no output"
            raise InvalidEnvironment(f"environment {package_id}: installing its build failed: {message}")
