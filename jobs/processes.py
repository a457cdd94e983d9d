"""Lab's processes on one machine: the web server (uvicorn), a Celery worker and Celery beat.

``make up`` runs ``python -m jobs.processes up``; the demo (``python -m demo``) and the
end-to-end tests start and stop the same processes through :class:`LabProcesses`. Each process
runs in a session of its own with its output in ``LOG_DIR/<name>.log`` (``LAB_DATA_DIR/logs`` by
default), so a Ctrl-C reaches only the process manager, which then stops them in order: beat and
the worker (it finishes the tasks it holds; nothing launches or requeues a job after), then the
engine attempts of this data dir, which the local launcher detaches from the worker so that a
restarted worker does not end them (each checkpoints first), and last web, which those engines
report to until they exit. Should the manager die without stopping them (SIGKILL, a crash), each
gets SIGTERM (``PR_SET_PDEATHSIG``) and stops as it would on Ctrl-C: nothing is left running.

Usage::

    python -m jobs.processes up [--host HOST] [--port PORT]   # all three, until Ctrl-C or SIGTERM
    python -m jobs.processes web|worker|beat [--host HOST] [--port PORT]   # one, in the foreground

The environment passes on to the processes (``LAB_DATA_DIR``, ``DATABASE_URL``, ...). This module
imports nothing from Django: it runs ``manage.py``, uvicorn and Celery as commands.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from jobs.launchers.local import process_alive

ROOT = Path(__file__).resolve().parents[1]
#: prctl(2) option (linux/prctl.h): the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # resolved here: a child between fork and exec only calls it
#: Seconds a process (or an engine attempt) gets to exit after SIGTERM before SIGKILL.
STOP_GRACE_S = 20.0
#: Seconds the web server gets to answer ``/healthz`` after it is started.
START_TIMEOUT_S = 120.0
#: The signals that stop ``up``: Ctrl-C, a process manager's stop, the terminal closing.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def data_dir_from(environ: Mapping[str, str]) -> Path:
    """Return ``LAB_DATA_DIR`` as an absolute path, Lab's default ``./var`` of the repository
    when it is unset (as ``lab.settings`` reads it)."""
    return Path(environ.get("LAB_DATA_DIR") or ROOT / "var").resolve()


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``host:port`` (so uvicorn can bind it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def web_command(*, host: str, port: int) -> list[str]:
    """Return the command line of the ASGI server on ``host:port``."""
    return [
        sys.executable, "-m", "uvicorn", "lab.asgi:application", "--host", host, "--port", str(port),
        # Live streams stay open until their job ends: stop waiting for them after 5 s.
        "--timeout-graceful-shutdown", "5",
    ]


def worker_command(*, data_dir: Path, embedded_beat: bool = False) -> list[str]:
    """Return the command line of a Celery worker (2 processes) on every queue Lab uses (the
    bare command of docs/architecture.md "Processes"), with beat inside it when ``embedded_beat`` is true."""
    command = [sys.executable, "-m", "celery", "-A", "lab", "worker", "--concurrency", "2", "--loglevel", "INFO"]
    if embedded_beat:
        command += ["-B", "--schedule", str(data_dir / "celerybeat-schedule")]
    return command


def beat_command(*, data_dir: Path) -> list[str]:
    """Return the command line of Celery beat, its schedule file under ``data_dir``."""
    return [
        sys.executable, "-m", "celery", "-A", "lab", "beat", "--loglevel", "INFO",
        "--schedule", str(data_dir / "celerybeat-schedule"),
    ]


def sandbox_agent_command() -> list[str]:
    """Return the command line of the sandbox agent (the sandboxes' data plane, docs/sandboxes.md)
    at ``LAB_SANDBOX_AGENT_URL`` with Lab's settings."""
    return [sys.executable, "manage.py", "sandbox_agent"]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class LabProcesses:
    """Start and stop web, worker and beat for the Lab at ``host:port`` with data under ``data_dir``.

    ``env`` is the whole environment the processes get (Lab's settings variables included).
    ``log_dir`` defaults to ``data_dir/logs``; each process appends to ``<name>.log`` there.
    :attr:`processes` maps each running process's name to its ``Popen``. Usable as a context
    manager: leaving it stops everything started, engine attempts included.
    """

    def __init__(
        self,
        *,
        data_dir: Path,
        port: int,
        env: Mapping[str, str],
        host: str = "127.0.0.1",
        log_dir: Path | None = None,
    ):
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port
        # A server listening on every address is reached on loopback.
        reach = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, host)
        self.base_url = f"http://{reach}:{port}"
        self.env = dict(env)
        self.log_dir = log_dir or self.data_dir / "logs"
        self.processes: dict[str, subprocess.Popen] = {}

    def run(self, *args: str, what: str) -> str:
        """Run ``python <args>`` (e.g. ``manage.py migrate``) to completion; return its stdout.

        Raises RuntimeError with the command's output tail when it fails.
        """
        result = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=600,
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"{what} failed (exit status {result.returncode}):\n{tail}")
        return result.stdout

    def migrate(self) -> None:
        """Apply the database migrations (``manage.py migrate``); RuntimeError when that fails."""
        self.run("manage.py", "migrate", "--noinput", what="manage.py migrate")

    def spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        """Start ``command`` as the process ``name``, in a session of its own, output to its log;
        it gets SIGTERM if this process dies without stopping it (SIGKILL, a crash), so nothing
        is left running without its manager (engine attempts, the worker's, are not its)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        manager = os.getpid()

        def end_with_manager() -> None:  # in the child, between fork and exec
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != manager:  # the manager died before the line above
                os.kill(os.getpid(), signal.SIGTERM)

        with open(self.log_dir / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=end_with_manager,
            )
        self.processes[name] = process
        return process

    def start_web(self) -> None:
        """Start uvicorn (see :meth:`wait_until_healthy`)."""
        self.spawn("web", web_command(host=self.host, port=self.port))

    def start_worker(self, *, embedded_beat: bool = False) -> None:
        """Start a Celery worker on every queue, with beat inside it when ``embedded_beat``."""
        self.spawn("worker", worker_command(data_dir=self.data_dir, embedded_beat=embedded_beat))

    def start_beat(self) -> None:
        """Start Celery beat."""
        self.spawn("beat", beat_command(data_dir=self.data_dir))

    def start(self, *, timeout: float = START_TIMEOUT_S) -> LabProcesses:
        """Start web, worker and beat and wait for ``/healthz``; return self.

        Raises RuntimeError (naming the log to read) when a process exits or the server does
        not answer within ``timeout`` seconds; what did start keeps running until :meth:`stop`.
        """
        self.start_web()
        self.start_worker()
        self.start_beat()
        self.wait_until_healthy(timeout=timeout)
        return self

    def healthy(self) -> bool:
        """Whether the web server answers ``GET /healthz`` with 200."""
        try:
            return httpx.get(f"{self.base_url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_until_healthy(self, *, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until the web server answers ``/healthz``; RuntimeError naming the log to read
        when a process exits first or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while not self.healthy():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the web server did not answer within {timeout:.0f} s; see {self.log_dir}/web.log")
            time.sleep(0.3)

    def check_alive(self) -> None:
        """Raise RuntimeError naming the first process that has exited, and its log."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(
                    f"the {name} process exited with status {process.returncode}; see {self.log_dir}/{name}.log"
                )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process group of ``name`` (a worker's pool goes with it), wait for
        its leader and forget it."""
        process = self.processes.pop(name)
        _signal_group(process.pid, sig)
        process.wait(timeout=30)

    def engine_groups(self) -> list[int]:
        """Return the process groups of the engine attempts under ``data_dir/runs`` and of the
        inference servers under ``data_dir/serving/servers`` (and their supervisors) that are
        still alive, engines first."""
        engines, supervisors = [], []
        pid_files = [*(self.data_dir / "runs").glob("*/attempt-*/*.pid"), *(self.data_dir / "serving" / "servers").glob("*/run-*/*.pid")]
        for pid_file in sorted(pid_files):
            found = {"engine.pid": engines, "supervisor.pid": supervisors}.get(pid_file.name)
            pid = _read_pid(pid_file)
            # The pid must still be that attempt's process, not a recycled number.
            if found is not None and pid is not None and process_alive(pid) and str(pid_file.parent) in _cmdline(pid):
                found.append(pid)
        return engines + supervisors

    def stop(self, *, engine_grace_s: float = STOP_GRACE_S) -> None:
        """Stop beat and the worker, then every engine attempt of this data dir, then web; safe
        to call more than once.

        Beat and the worker go first, so that nothing launches or requeues an attempt while the
        engines stop; web goes last, so that a stopping engine can still checkpoint and report.
        A process gets SIGTERM (its leader alone: Celery's main process stops its pool itself,
        a warm shutdown, and hangs on children killed under it) and :data:`STOP_GRACE_S`
        seconds, then SIGKILL; whatever a leader leaves in its group goes with SIGKILL. An
        engine gets SIGTERM (it checkpoints and exits 3, so the next start resumes its job) and
        ``engine_grace_s`` seconds before SIGKILL; 0 kills at once.
        """
        self._stop_processes([name for name in self.processes if name != "web"])
        self._stop_engines(grace_s=engine_grace_s)
        self._stop_processes([name for name in self.processes if name == "web"])

    def _stop_processes(self, names: list[str]) -> None:
        for name in names:
            if self.processes[name].poll() is None:
                self.processes[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for name in names:
            process = self.processes[name]
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
            _signal_group(process.pid, signal.SIGKILL)
            del self.processes[name]

    def _stop_engines(self, *, grace_s: float) -> None:
        groups = self.engine_groups()
        if grace_s > 0:
            for pid in groups:
                _signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while groups and time.monotonic() < deadline:
                time.sleep(0.2)
                groups = [pid for pid in groups if process_alive(pid)]
        for pid in groups:
            _signal_group(pid, signal.SIGKILL)

    def logs(self, *, lines: int = 40) -> str:
        """Return the last ``lines`` lines of every process log (for error messages)."""
        parts = []
        for log in sorted(self.log_dir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def __enter__(self) -> LabProcesses:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _interrupt(signum: int, frame: object) -> None:
    # Another Ctrl-C must not cut the stop short and leave processes behind.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_IGN)
    raise KeyboardInterrupt


def say(message: str) -> None:
    """Print one line for the person at the terminal (flushed: stdout may be a pipe)."""
    print(message, flush=True)


def up(*, host: str, port: int, environ: Mapping[str, str]) -> int:
    """Migrate, start web, worker, beat and the sandbox agent, and keep them up until SIGINT,
    SIGTERM or SIGHUP; then stop everything. Return the exit status: 0 after a requested stop, 1 when Lab could not
    start or a process exited by itself."""
    data_dir = data_dir_from(environ)
    env = {**environ, "LAB_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    processes = LabProcesses(data_dir=data_dir, host=host, port=port, env=env)
    if not processes.env.get("LAB_PUBLIC_URL"):
        # Engines and webhook payloads reach Lab on the port it really listens on.
        processes.env["LAB_PUBLIC_URL"] = processes.base_url
    if not port_is_free(port, host):
        say(f"Port {port} is in use (another Lab?); choose another with PORT=...")
        return 1
    if not processes.env.get("LAB_SANDBOX_AGENT_URL"):
        # The agent listens where web and worker will look for it: a port free now, so that a
        # second Lab on this machine (another PORT) gets an agent of its own.
        processes.env["LAB_SANDBOX_AGENT_URL"] = f"http://127.0.0.1:{free_port()}"
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, _interrupt)
    status = 0
    try:
        say(f"Starting web, worker, beat and the sandbox agent (data in {data_dir}, logs in {processes.log_dir}) ...")
        processes.data_dir.mkdir(parents=True, exist_ok=True)
        processes.migrate()
        processes.start()
        processes.spawn("sandbox-agent", sandbox_agent_command())
        url = processes.base_url
        say(f"Lab is up at {url} (dashboard login: {url}/login/, new accounts at {url}/signup/). Ctrl-C stops it.")
        while True:
            processes.check_alive()
            time.sleep(0.5)
    except KeyboardInterrupt:
        say("Stopping web, worker, beat and the sandbox agent ...")
    except RuntimeError as exc:
        say(f"Stopping web, worker, beat and the sandbox agent: {exc}")
        status = 1
    finally:
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, signal.SIG_IGN)
        processes.stop()
    say("Stopped.")
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jobs.processes``."""
    parser = argparse.ArgumentParser(prog="python -m jobs.processes", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "web", "worker", "beat"])
    parser.add_argument("--host", default="127.0.0.1", help="the web server's address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="the web server's port (default 8000)")
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(host=args.host, port=args.port, environ=dict(os.environ))
    data_dir = data_dir_from(os.environ)
    command = {
        "web": lambda: web_command(host=args.host, port=args.port),
        "worker": lambda: worker_command(data_dir=data_dir),
        "beat": lambda: beat_command(data_dir=data_dir),
    }[args.command]()
    # In the foreground, as this very process: signals reach it directly.
    os.chdir(ROOT)
    os.execv(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
