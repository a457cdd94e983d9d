"""``make up`` as its user runs it: started from a shell, stopped by Ctrl-C (SIGINT to the
terminal's process group) or by a process manager's SIGTERM to make alone. It says once that Lab
is up and where, stops web, worker and beat within seconds with a short goodbye, and leaves no
process behind: none of the process groups it had, and none naming its data dir."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from django.db import connection

from tests.support.stack import ROOT, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

#: Variables of a make that runs this suite (``make test``): a user's shell has none of them.
MAKE_VARIABLES = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")
#: Seconds ``make up`` may take to stop once signalled.
STOP_WITHIN_S = 15


def processes_naming(data_dir: Path) -> dict[int, str]:
    """Return ``{pid: command}`` of every live process whose environment, command line or working
    directory names ``data_dir`` (zombies, already gone, excluded)."""
    marker = str(data_dir).encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if (proc / "stat").read_text().split(") ", 1)[1].startswith("Z"):
                continue
            command = (proc / "cmdline").read_bytes()
            cwd = os.readlink(proc / "cwd")
            environ = (proc / "environ").read_bytes()
        except (OSError, IndexError):
            continue
        in_environment = f"LAB_DATA_DIR={data_dir}\0".encode() in environ + b"\0"
        if marker in command or cwd.startswith(str(data_dir)) or in_environment:
            found[int(proc.name)] = command.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def started_at(pid: int) -> int | None:
    """Return when process ``pid`` started (clock ticks after boot, proc(5) ``stat`` field 22),
    None when there is none: with the pid, it names one process even after pids wrap around."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[19])
    except (OSError, IndexError):
        return None


def group_alive(pgid: int, leader_started: int | None) -> bool:
    """Whether process group ``pgid`` still has a process. The kernel hands out no pid that names
    a live group, so a process ``pgid`` that is not the leader seen before (``leader_started``)
    means the old group ended and its pid went to a newcomer."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = started_at(pgid)
    return now is None or now == leader_started


class MakeUp:
    """``make up`` in the background, in a session of its own as a terminal's foreground job is,
    its output collected line by line."""

    def __init__(self, env: dict[str, str]):
        self.process = subprocess.Popen(
            ["make", "up"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, start: str, *, timeout: float) -> str:
        def found() -> str | None:
            return next((line for line in self.lines if line.startswith(start)), None)

        wait_for(lambda: found() or self.process.poll() is not None, timeout=timeout, what=repr(start))
        line = found()
        assert line is not None, "\n".join(self.lines[-40:])
        return line

    def wait(self, *, timeout: float) -> int:
        status = self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return status

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def make_up_environment(tmp_path) -> Iterator[dict[str, str]]:
    """The test's environment as a user's shell would hand it to make: its database (the test
    database on PostgreSQL) and Redis, a free PORT and a fresh LAB_DATA_DIR."""
    env = {name: value for name, value in os.environ.items() if name not in MAKE_VARIABLES}
    env.pop("DATABASE_URL", None)
    if connection.vendor == "postgresql":
        from tests.support.stack import _database_url

        env["DATABASE_URL"] = _database_url()
    broker = env.get("CELERY_BROKER_URL") or env.get("REDIS_URL")
    if broker:
        redis.Redis.from_url(broker).flushdb()  # no task of an earlier test for this worker to run
    env.update(PORT=str(free_port()), LAB_DATA_DIR=str(tmp_path / "data"))
    yield env
    # After the test's own checks: a failed one must not leave web, worker and beat running (each
    # in a session of its own, beyond make's group), where the next tests' tasks would reach them.
    for pid in processes_naming(tmp_path / "data"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_make_up_stops_quietly_and_leaves_no_process(make_up_environment, stop_signal):
    env = make_up_environment
    data_dir, port = Path(env["LAB_DATA_DIR"]), env["PORT"]
    url = f"http://127.0.0.1:{port}"
    make = MakeUp(env)
    try:
        up = make.wait_for_line("Lab is up at ", timeout=300)
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        running = processes_naming(data_dir)
        commands = " | ".join(running.values())
        # Celery renames its processes ("[celeryd: ...] (-A lab worker ...)") where setproctitle is installed.
        for expected in ("make up", "-m jobs.processes up", "uvicorn lab.asgi:application", "-A lab worker",
                         "-A lab beat", "manage.py sandbox_agent"):
            assert expected in commands, commands
        groups = {int(Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[2]) for pid in running}
        leaders = {pgid: started_at(pgid) for pgid in groups}

        if stop_signal == signal.SIGINT:
            os.killpg(make.process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        else:
            make.process.send_signal(signal.SIGTERM)  # what a process manager does: make alone
        signalled = time.monotonic()
        status = make.wait(timeout=120)
        stopped_in = time.monotonic() - signalled
    finally:
        make.kill()

    output = "\n".join(make.lines)
    assert stopped_in < STOP_WITHIN_S, output
    assert status == -stop_signal, output  # make re-raises the signal it got, once its recipe has ended
    assert up == f"Lab is up at {url} (dashboard login: {url}/login/, new accounts at {url}/signup/). Ctrl-C stops it."
    # A make that has to reinstall first echoes its pip commands before these.
    assert make.lines[make.lines.index(up) - 1:] == [
        f"Starting web, worker, beat and the sandbox agent (data in {data_dir}, logs in {data_dir / 'logs'}) ...",
        up,
        "Stopping web, worker, beat and the sandbox agent ...",
        "Stopped.",
    ], output
    for noise in ("make: ***", "Warm shutdown", "Traceback", "Segmentation"):
        assert noise not in output, output
    assert sorted(log.name for log in (data_dir / "logs").glob("*.log")) == ["beat.log", "sandbox-agent.log", "web.log", "worker.log"]
    deadline = time.monotonic() + 10  # the last ones may still be exiting, or waiting to be reaped
    while processes_naming(data_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_naming(data_dir) == {}
    assert [pgid for pgid in sorted(groups) if group_alive(pgid, leaders[pgid])] == []
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=5)


def test_make_up_killed_with_sigkill_leaves_no_process_behind(make_up_environment):
    """kill -9 (or the OOM killer) on make and its process manager: web, worker, beat and the
    sandbox agent, each in a session of its own, get SIGTERM as their manager dies and stop."""
    data_dir = Path(make_up_environment["LAB_DATA_DIR"])
    make = MakeUp(make_up_environment)
    try:
        make.wait_for_line("Lab is up at ", timeout=300)
        commands = " | ".join(processes_naming(data_dir).values())
        for expected in ("uvicorn lab.asgi:application", "-A lab worker", "-A lab beat", "manage.py sandbox_agent"):
            assert expected in commands, commands
    finally:
        make.kill()
    deadline = time.monotonic() + STOP_WITHIN_S
    while processes_naming(data_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_naming(data_dir) == {}


def test_a_second_lab_on_another_port_gets_a_sandbox_agent_of_its_own(make_up_environment):
    """The agent's address is a port free at start (LAB_SANDBOX_AGENT_URL, unless set), not a
    fixed one another Lab on this machine already holds."""
    taken = socket.socket()  # what the first Lab's agent holds on the old fixed port
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        taken.bind(("127.0.0.1", 8765))
        taken.listen()
    except OSError:
        pass  # something already listens there: the case itself
    make = MakeUp(make_up_environment)
    try:
        make.wait_for_line("Lab is up at ", timeout=300)
        data_dir = Path(make_up_environment["LAB_DATA_DIR"])

        def agent_answers() -> bool:
            assert make.process.poll() is None, "\n".join(make.lines)  # an agent that cannot bind ends up
            agents = [command.split() for command in processes_naming(data_dir).values() if "-m sandboxes.agent" in command]
            if not agents:
                return False
            port = int(agents[0][agents[0].index("--port") + 1])
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
            except httpx.TransportError:
                return False
            return port != 8765

        wait_for(agent_answers, timeout=90, what="the sandbox agent")
        make.process.send_signal(signal.SIGTERM)
        make.wait(timeout=120)
    finally:
        make.kill()
        taken.close()
    output = "\n".join(make.lines)
    assert "sandbox-agent" not in output and make.lines[-1] == "Stopped.", output
