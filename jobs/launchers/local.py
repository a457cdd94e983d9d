"""The local launcher: each attempt is ``python -m engine run ...`` on this machine.

Each attempt gets its own work dir ``LAB_DATA_DIR/runs/<job>/attempt-<n>`` holding the spec, the
engine's stdout/stderr, and the pid and exit files of ``jobs.launchers.supervise``. The number of
attempts running at once is bounded by admission (``LAB_LOCAL_SLOTS``), not here. Deleting a job
deletes ``LAB_DATA_DIR/runs/<job>`` (``delete_job_files``).

The engine does not inherit the worker's environment, which holds Lab's secrets (``SECRET_KEY``
signs job tokens; ``DATABASE_URL``, ``STRIPE_*``, ``AWS_*``, ``EMAIL_*``, ``*_FILE``): it gets
``engine_environment``, an allow-list of what it reads, plus its job token.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from engine.catalog import SMOLLM2_ID
from engine.egress import EGRESS_VARIABLE, FORWARDS_VARIABLE, origin_of
from jobs.launchers.base import (
    AttemptPhase,
    CapturedLine,
    Launcher,
    LaunchRequest,
    Observation,
    engine_args,
    engine_package_environment,
    eval_endpoint_url,
    judge_urls,
    teacher_url,
)
from jobs.launchers.isolation import (
    EGRESS_DIR,
    ISOLATION_BUBBLEWRAP,
    SandboxLayout,
    bubblewrap_command,
    check_bubblewrap,
    hosts_text,
    loopback_hosts,
    python_paths,
)
from lab.lib.http import UnsafeURL, check_url, checked_addresses

#: Seconds after launch during which a missing supervisor pid file means "still starting".
_START_GRACE_S = 30.0
#: Seconds an engine's pid file must have existed before the orphan sweep may end its process:
#: the launch task starts the engine before it records the attempt as launched, and a sweep
#: that ran in between took the new engine for an orphan and killed it.
ORPHAN_GRACE_S = 120.0
#: Most captured bytes read per call, so a chatty engine cannot stall the reconciler.
_MAX_READ = 256 * 1024

#: Variables the engine inherits by exact name: the process basics, where models live (engine/catalog.py),
#: CA bundles for an https Lab, thread and GPU selection.
ENGINE_ENV_NAMES = frozenset(
    """
    PATH HOME USER LOGNAME LANG LANGUAGE TZ TMPDIR TEMP TMP LD_LIBRARY_PATH XDG_CACHE_HOME
    SSL_CERT_FILE SSL_CERT_DIR LAB_DATA_DIR LAB_MODEL_DIR LAB_PUBLIC_URL NUMEXPR_NUM_THREADS
    TOKENIZERS_PARALLELISM PYTHONDONTWRITEBYTECODE NVIDIA_VISIBLE_DEVICES NVIDIA_DRIVER_CAPABILITIES
    """.split()
)
#: Variables the engine inherits by prefix: locale, its own settings (``LAB_ENGINE_*``, ``LAB_JOB_*``),
#: Hugging Face offline switches and caches, BLAS/OpenMP threads, torch, vLLM, CUDA and NCCL.
ENGINE_ENV_PREFIXES = tuple(
    "LC_ LAB_ENGINE_ LAB_JOB_ HF_ TRANSFORMERS_ OMP_ MKL_ OPENBLAS_ TORCH_ TORCHINDUCTOR_ VLLM_ CUDA_ NCCL_".split()
)
#: A name matched by prefix that holds one of these is a credential and stays out (``HF_TOKEN``).
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY")


def engine_environment(
    *, token: str, repo_dir: Path, source: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Return the engine's whole environment: the allowed variables of ``source`` (default this
    process's environment), the job's own ``secrets`` (names Lab never sets itself), the job token
    as ``LAB_JOB_TOKEN``, unbuffered output, and a ``PYTHONPATH`` of ``repo_dir``, its ``sdk/`` and
    the worker's own ``PYTHONPATH``.

    The engine reaches storage through the ingest API's upload targets (a path or a pre-signed
    URL), so it needs no storage credentials; everything else of Lab's stays out.
    """
    source = os.environ if source is None else source
    env = {}
    for name, value in source.items():
        if name in ENGINE_ENV_NAMES:
            env[name] = value
        elif name.startswith(ENGINE_ENV_PREFIXES) and not name.endswith("_FILE"):
            if not any(word in name for word in _SECRET_WORDS):
                env[name] = value
    env.update(secrets or {})
    env["LAB_JOB_TOKEN"] = token
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_dir), str(repo_dir / "sdk"), source.get("PYTHONPATH")]))
    return env


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone; Linux ``/proc``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def start_supervised(
    *, python: str, workdir: Path, command: list[str], env: Mapping[str, str], cwd: Path, options: Sequence[str] = ()
) -> None:
    """Start ``command`` under ``jobs.launchers.supervise`` in ``workdir``, detached from this
    process: its pid files, ``exit.json`` and ``stdout.log``/``stderr.log`` are written there, and
    ``observe``, ``cancel`` and ``captured_lines`` of a ``LocalLauncher`` read a handle
    ``{"workdir": ...}`` of it. ``options`` are the supervisor's own (``--egress``, ``--prepare``).
    Raises RuntimeError when the supervisor did not start."""
    starter = subprocess.run(
        [python, "-m", "jobs.launchers.supervise", str(workdir), *options, "--", *command],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    if starter.returncode != 0 or _read_pid(workdir / "supervisor.pid") is None:
        raise RuntimeError(f"the supervisor did not start: {starter.stderr.decode(errors='replace')[-500:]}")


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class LocalLauncher(Launcher):
    """Runs engine attempts as supervised subprocesses under ``runs_dir`` (cwd ``repo_dir``).

    With ``isolation`` ``"bubblewrap"`` (the default, ``LAB_LOCAL_ISOLATION``) each attempt runs in
    a sandbox of its own (``jobs.launchers.isolation``), seeing ``data_dir`` only through its work
    dir, ``model_dir`` read-only, its job's folder under ``storage_root`` (the filesystem object
    store, None for an object store) and its packages' wheels; it reaches the ingest URL and
    ``storage_origin`` (an object store's signed URLs) through the supervisor's relays, and the
    sandboxes' data plane (``sandbox_data_plane_url``, where its environments run code), nothing else.
    """

    name = "local"

    def __init__(
        self,
        *,
        runs_dir: Path,
        repo_dir: Path,
        isolation: str,
        python: str = sys.executable,
        data_dir: Path | None = None,
        model_dir: Path | None = None,
        storage_root: Path | None = None,
        storage_origin: str | None = None,
        allow_private_egress: bool = False,
        sandbox_data_plane_url: str | None = None,
    ):
        self.runs_dir = runs_dir
        self.repo_dir = repo_dir
        self.python = python
        self.isolation = isolation
        self.data_dir = data_dir or runs_dir.parent
        self.model_dir = model_dir or self.data_dir / "models"
        self.storage_root = storage_root
        self.storage_origin = storage_origin
        self.allow_private_egress = allow_private_egress
        self.sandbox_data_plane_url = sandbox_data_plane_url

    def workdir(self, job_id: str, attempt: int) -> Path:
        """Return the work dir of one attempt."""
        return self.runs_dir / job_id / f"attempt-{attempt}"

    def launch(self, request: LaunchRequest) -> dict:
        workdir = self.workdir(request.job_id, request.attempt)
        handle = {"workdir": str(workdir)}
        supervisor = _read_pid(workdir / "supervisor.pid")
        if supervisor is not None or (workdir / "exit.json").exists():
            return handle  # already launched (a retried launch task): never start twice
        workdir.mkdir(parents=True, exist_ok=True)
        spec_path = workdir / "spec.json"
        spec_path.write_text(json.dumps(request.spec))
        resume_dir = None
        if request.resume_archive is not None:
            resume_dir = workdir / "resume"
            shutil.rmtree(resume_dir, ignore_errors=True)
            with tarfile.open(request.resume_archive) as archive:
                archive.extractall(resume_dir, filter="data")
        args = engine_args(
            request,
            spec_path=str(spec_path),
            workdir=str(workdir),
            resume_dir=str(resume_dir) if resume_dir else None,
        )
        env = engine_environment(token=request.token, repo_dir=self.repo_dir, secrets=request.secrets)
        env.update(engine_package_environment(request))
        env.update(self._build_environment_variables(request))
        command = [self.python, "-m", "engine", *args]
        options: list[str] = []
        if self.isolation == ISOLATION_BUBBLEWRAP:
            bwrap = check_bubblewrap()
            egress = {"lab": request.lab_url, **({"storage": self.storage_origin} if self.storage_origin else {})}
            # Lab's own sandbox agent, where a code environment runs the model's programs
            # (each sandbox's own token opens it): trusted like the ingest URL.
            if self.sandbox_data_plane_url and origin_of(self.sandbox_data_plane_url) not in {origin_of(url) for url in egress.values()}:
                egress["sandboxes"] = self.sandbox_data_plane_url
            relays = {name: _host_and_port(url) for name, url in egress.items()}
            endpoints = [("teacher", teacher_url(request.spec)), ("endpoint", eval_endpoint_url(request.spec))]
            judges = judge_urls(request.spec)
            endpoints += [(f"judge{number}", url) for number, url in enumerate(judges)]
            for name, url in endpoints:
                # A Lab deployment's endpoint is Lab's own origin, relayed already as "lab".
                if url and origin_of(url) not in {origin_of(known) for known in egress.values()}:
                    egress[name], relays[name] = url, pinned_address(url, allow_private=self.allow_private_egress)
            # The environment's own code calls its judges by their URLs: served on the sandbox's loopback
            # (engine.egress.serve_forwards), each through the relay of its origin.
            socket_of = {origin_of(url): f"{EGRESS_DIR}/{name}.sock" for name, url in egress.items()}
            forwards = {origin_of(url): socket_of[origin_of(url)] for url in judges}
            if forwards:
                env[FORWARDS_VARIABLE] = json.dumps(forwards)
            options = [option for name, target in relays.items() for option in ("--egress", f"{name}={target}")]
            env["LAB_MODEL_DIR"] = str(self.model_dir.resolve())  # the cache the sandbox sees, prepared outside it
            if self._model_needs_preparing(request):
                options += ["--prepare", json.dumps([self.python, "-m", "engine", "prepare-model", "--model", request.spec["model"]])]
            layout = self._sandbox_layout(request, workdir, egress, hosts=loopback_hosts(judges))
            command = bubblewrap_command(layout, command, bwrap=bwrap)
        start_supervised(python=self.python, workdir=workdir, command=command, env=env, cwd=self.repo_dir, options=options)
        return handle

    def _sandbox_layout(
        self, request: LaunchRequest, workdir: Path, egress: dict[str, str], *, hosts: dict[str, str] | None = None,
    ) -> SandboxLayout:
        """Return what the attempt's sandbox sees (``jobs.launchers.isolation``); ``hosts`` maps
        the host names of the judges it serves on its loopback to their loopback addresses."""
        (workdir / "egress").mkdir(mode=0o700, exist_ok=True)
        (workdir / "home").mkdir(mode=0o700, exist_ok=True)
        if hosts:
            (workdir / "hosts").write_text(hosts_text(hosts))
        writable = []
        if self.storage_root is not None:
            job_objects = self.storage_root / request.job_id
            job_objects.mkdir(mode=0o700, parents=True, exist_ok=True)
            writable.append(job_objects)
        urls = [package.get("url", "") for package in request.environment_packages]
        urls += [entry.get("url", "") for package in request.environment_packages for key in ("lock", "datasets") for entry in (package.get("build") or {}).get(key, [])]
        urls += [((package.get("build") or {}).get("hub_datasets") or {}).get("url", "") for package in request.environment_packages]
        packages = [Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)) for url in urls if str(url).startswith("file:")]
        build_cache = self._build_cache(request)
        if build_cache is not None:
            build_cache.mkdir(mode=0o700, parents=True, exist_ok=True)
            writable.append(build_cache)
        self.model_dir.mkdir(parents=True, exist_ok=True)
        return SandboxLayout(
            workdir=workdir,
            read_only=(
                *python_paths(),
                *self._engine_code(),
                self.model_dir.resolve(),
                *(path for path in packages if path.is_file()),
            ),
            writable=tuple(writable),
            hidden=(self.data_dir.resolve(),),
            hosts=hosts or {},
            environment={
                "HOME": str(workdir / "home"),
                "XDG_CACHE_HOME": str(workdir / "home" / ".cache"),
                "TMPDIR": "/tmp",
                "USER": "lab",
                "LOGNAME": "lab",
                "LAB_MODEL_DIR": str(self.model_dir.resolve()),
                **self._build_environment_variables(request),
                EGRESS_VARIABLE: json.dumps({origin_of(url): f"{EGRESS_DIR}/{name}.sock" for name, url in egress.items()}),
            },
        )

    def _build_cache(self, request: LaunchRequest) -> Path | None:
        """Where the engine keeps the environments it installs from builds' locks
        (``engine.build_envs``): ``LAB_DATA_DIR/cache/environments/<organization>``, shared by that
        organization's jobs (a job's code could alter what it installed, so no other organization's
        job runs it); None when the job runs no package on a build."""
        if not any(package.get("build") for package in request.environment_packages):
            return None
        return (self.data_dir / "cache" / "environments" / (request.organization or "_")).resolve()

    def _build_environment_variables(self, request: LaunchRequest) -> dict[str, str]:
        """``LAB_ENGINE_ENV_CACHE`` (``_build_cache``) and ``LAB_ENGINE_UV`` (the uv beside the
        worker's Python, which the sandbox sees with the Python installation) for a job that runs a
        package on its build; none otherwise."""
        cache = self._build_cache(request)
        if cache is None:
            return {}
        variables = {"LAB_ENGINE_ENV_CACHE": str(cache)}
        uv = Path(self.python).parent / "uv"
        if uv.exists():
            variables["LAB_ENGINE_UV"] = str(uv)
        return variables

    def _engine_code(self) -> list[Path]:
        """Return the folders of Lab's code the engine runs from: ``engine/``, ``sdk/`` and the
        verifiers environment (``.venv-verifiers``), not the rest of the repository, where an
        operator may keep files of their own."""
        repo = self.repo_dir.resolve()
        return [path for path in (repo / "engine", repo / "sdk", repo / ".venv-verifiers") if path.exists()]

    def _model_needs_preparing(self, request: LaunchRequest) -> bool:
        """Whether the job's model must first be put into the model cache, which the sandbox sees
        read-only (``python -m engine prepare-model``): a stored model's revision this machine has
        not fetched yet (``engine.model_store``), or SmolLM2 not yet converted from its GGUF; never
        for an evaluation sampled through an endpoint, whose engine loads no model."""
        if eval_endpoint_url(request.spec):
            return False
        if request.model is not None:
            return not (self.model_dir / ".store" / request.model["id"] / request.model["revision"]).is_dir()
        model = request.spec.get("model") if isinstance(request.spec, dict) else None
        return model == SMOLLM2_ID and not (self.model_dir / model / "config.json").is_file()

    def observe(self, handle: dict) -> Observation:
        workdir = Path(handle["workdir"])
        exit_file = workdir / "exit.json"
        if exit_file.exists():
            try:
                exit_code = int(json.loads(exit_file.read_text())["exit_code"])
            except (OSError, ValueError, KeyError, TypeError):
                return Observation(AttemptPhase.LOST, detail="unreadable exit.json")
            return Observation(
                AttemptPhase.EXITED,
                exit_code=exit_code,
                detail=_stderr_tail(workdir),
                started_at=_modified_at(workdir / "supervisor.pid"),
                ended_at=_modified_at(exit_file),
            )
        supervisor = _read_pid(workdir / "supervisor.pid")
        if supervisor is None:
            return Observation(AttemptPhase.PENDING)
        if process_alive(supervisor):
            return Observation(AttemptPhase.RUNNING, started_at=_modified_at(workdir / "supervisor.pid"))
        # The supervisor died without recording an exit (killed): make sure the engine is gone too.
        self.cancel(handle, force=True)
        return Observation(AttemptPhase.LOST, detail="the supervisor process was killed")

    def cancel(self, handle: dict, *, force: bool = False) -> None:
        engine = _read_pid(Path(handle["workdir"]) / "engine.pid")
        if engine is None:
            return
        try:
            os.killpg(engine, signal.SIGKILL if force else signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

    def cleanup(self, handle: dict) -> None:
        workdir = Path(handle["workdir"])
        self.cancel(handle, force=True)
        shutil.rmtree(workdir / "resume", ignore_errors=True)

    def engine_workdir(self, handle: dict) -> Path | None:
        return Path(handle["workdir"]) if "workdir" in handle else None

    def captured_lines(self, handle: dict) -> list[CapturedLine]:
        """Return complete stdout/stderr lines written since the last call.

        Progress is kept in ``handle["captured"]`` as ``{stream: [lines read, bytes read]}``.
        Lines are numbered per stream; ``seq`` is ``line_number * 2 + stream_bit`` so the two
        streams never collide.
        """
        workdir = Path(handle["workdir"])
        captured: list[CapturedLine] = []
        progress = handle.setdefault("captured", {})
        for bit, stream in enumerate(("stdout", "stderr")):
            path = workdir / f"{stream}.log"
            if not path.exists():
                continue
            lines_read, bytes_read = progress.get(stream, [0, 0])
            with path.open("rb") as log_file:
                log_file.seek(bytes_read)
                chunk = log_file.read(_MAX_READ)
            if b"\n" not in chunk:
                continue
            complete = chunk[: chunk.rindex(b"\n")]
            for raw in complete.split(b"\n"):
                lines_read += 1
                text = raw.decode(errors="replace")[:16384]
                captured.append(CapturedLine(seq=lines_read * 2 + bit, stream=stream, line=text))
            progress[stream] = [lines_read, bytes_read + len(complete) + 1]
        return captured

    def sweep_orphans(self, live_handles: list[dict]) -> list[str]:
        live = {str(Path(handle["workdir"])) for handle in live_handles if "workdir" in handle}
        ended = []
        for pid_file in self.runs_dir.glob("*/attempt-*/engine.pid"):
            workdir = pid_file.parent
            if str(workdir) in live or (workdir / "exit.json").exists():
                continue
            try:
                if time.time() - pid_file.stat().st_mtime < ORPHAN_GRACE_S:
                    continue  # perhaps launched by a task that has not recorded it yet
            except FileNotFoundError:
                continue
            engine = _read_pid(pid_file)
            if engine is not None and process_alive(engine):
                try:
                    os.killpg(engine, signal.SIGKILL)
                    ended.append(str(workdir))
                except (ProcessLookupError, PermissionError):
                    pass
        return ended

    def delete_job_files(self, job_id: str, handles: list[dict]) -> None:
        """Delete ``runs_dir/<job>`` and every attempt's work dir named in ``handles``.

        A handle's work dir may lie under another runs dir (``LAB_DATA_DIR`` changed between
        attempts); it is deleted only when it has this launcher's layout (``.../<job>/attempt-<n>``),
        so a handle pointing anywhere else deletes nothing. Its job dir goes too once empty.
        """
        if not job_id or job_id in (".", "..") or "/" in job_id or os.sep in job_id:
            return
        shutil.rmtree(self.runs_dir / job_id, ignore_errors=True)
        for handle in handles:
            workdir = handle.get("workdir") if isinstance(handle, dict) else None
            if not isinstance(workdir, str):
                continue
            path = Path(workdir)
            if path.parent.name != job_id or not path.name.startswith("attempt-"):
                continue
            shutil.rmtree(path, ignore_errors=True)
            try:
                path.parent.rmdir()
            except OSError:
                pass  # not empty (files of something else) or already gone


def pinned_address(url: str, *, allow_private: bool) -> str:
    """Return ``address:port`` for relaying to ``url``'s host: the host's first address once every
    one of them passes ``lab.lib.http``'s rules (no private or loopback address unless
    ``allow_private``: a job's own endpoint must not become a way into Lab's network), pinned at
    launch so a later answer of the resolver cannot move the relay. Raises ``UnsafeURL`` with the
    reason, or when the host does not resolve."""
    target = check_url(url, allow_private=allow_private, resolve=False)
    host = target.raw_host.decode("ascii")
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        addresses = checked_addresses(host, port, allow_private=allow_private)
    except OSError:
        raise UnsafeURL("unresolvable_host", f"{host} does not resolve.") from None
    return f"{addresses[0]}:{port}"


def _host_and_port(url: str) -> str:
    """Return ``host:port`` of ``url`` (the scheme's default port when it names none)."""
    origin = origin_of(url)
    return origin.split("://", 1)[1]


def _modified_at(path: Path) -> datetime | None:
    """Return when ``path`` was last written (UTC), or None when it is missing: the supervisor
    writes its pid file as the engine starts and ``exit.json`` as it ends."""
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
    except OSError:
        return None


def _stderr_tail(workdir: Path, lines: int = 20) -> str:
    path = workdir / "stderr.log"
    if not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - 8192))
        tail = handle.read().decode(errors="replace").splitlines()[-lines:]
    return "\n".join(tail)
