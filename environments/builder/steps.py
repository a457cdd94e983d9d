"""What every step of a build shares: the request, the failure, the log, running a command and
uv's environment (``environments.builder.build`` runs the steps)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: The longest a resolve, a download or an install may take, in seconds.
STEP_TIMEOUT_S = 900


class BuildFailed(Exception):
    """The build cannot go on; the message says why and what to change (the build's ``error``)."""


@dataclass(frozen=True)
class BuildRequest:
    """What one build needs: the wheel, the index and cut-off to resolve against, and where to work.

    ``exclude_newer`` is an RFC 3339 timestamp (the version's push time, or a rebuild's snapshot);
    ``python`` the engine's interpreter the environment is built for; ``sandbox`` whether the
    import step runs in bubblewrap (``sandbox_command``); ``cache`` uv's cache (default beside the wheelhouse);
    ``datasets`` the folder of the organization's pushed datasets (``<owner>/<name>/<files>``,
    ``environments.datasets``), the working directory loading runs in, so that
    ``load_dataset("owner/name")`` reads them (None: an empty one); ``hf_endpoint`` the Hugging Face
    Hub loading may fetch datasets from ("" loads offline), ``hub_datasets`` where the tar of what
    it fetched is written (``environments.builder.hub_datasets``) and ``hub_datasets_max_bytes`` the
    most that may be.
    """

    wheel: Path
    index_url: str
    exclude_newer: str
    wheelhouse: Path
    workdir: Path
    python: str = sys.executable
    uv: str = ""
    sandbox: bool = False
    cache: Path | None = None
    datasets: Path | None = None
    hf_endpoint: str = ""
    hub_datasets: Path | None = None
    hub_datasets_max_bytes: int = 0


def log(message: str) -> None:
    print(f"[build {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_step(
    command: list[str], *, timeout: float = STEP_TIMEOUT_S, env: dict[str, str] | None = None, cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run ``command`` (in ``cwd``, default this process's), its output (both streams) captured as text; the caller reads ``returncode``."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"'{Path(command[0]).name} {command[1] if len(command) > 1 else ''}' took longer than {timeout:.0f} s") from None


# The host's way out to the package index: a CA bundle (a company proxy's certificate) and proxies.
# The worker hands them to the builder (environments.builds) and the builder to uv; nothing else of either.
NETWORK_VARIABLES = (
    "SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy",
)


def uv_environment(request: BuildRequest) -> dict[str, str]:
    """A minimal environment for uv: no ``UV_*``/``PIP_*`` setting of the host, its cache in the wheelhouse's parent."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", *NETWORK_VARIABLES)
    environment = {name: os.environ[name] for name in keep if name in os.environ}
    environment["UV_NO_CONFIG"] = "1"
    environment["UV_CACHE_DIR"] = str(request.cache or request.wheelhouse.parent / "uv-cache")
    environment["UV_PYTHON_DOWNLOADS"] = "never"
    return environment


def engine_python_version(python: str) -> str:
    """The version of ``python`` (``3.11.7``): this process's own when it is this Python."""
    if Path(python).resolve() == Path(sys.executable).resolve():
        return ".".join(map(str, sys.version_info[:3]))
    result = run_step([python, "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"], timeout=60)
    return result.stdout.strip()
