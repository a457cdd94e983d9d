"""A tiny supervisor for one local engine attempt: ``python -m jobs.launchers.supervise``.

It detaches from its parent (so a restarted Celery worker neither kills nor reaps it), runs the
engine as a child in its own process group with stdout and stderr in files of the work dir,
forwards SIGTERM, and when the engine ends writes ``exit.json`` (``{"exit_code": N}``, negative
for a signal). The launcher reads ``supervisor.pid``, ``engine.pid`` and ``exit.json`` to observe.

Usage: ``python -m jobs.launchers.supervise WORKDIR [--egress NAME=HOST:PORT]... [--prepare
JSON_COMMAND] -- COMMAND...`` (the environment passes on). ``--prepare`` runs a command first, to
its end, outside any sandbox (the engine preparing the model cache); a failure ends the attempt
with its exit code. Each ``--egress`` listens on the Unix socket ``WORKDIR/egress/NAME.sock`` and
relays every connection to HOST:PORT: the one way out of a sandboxed engine's own network
namespace (``engine.egress``).

A sandbox (``bwrap``) as COMMAND: its outer process would die of a SIGTERM at once, and take the
sandbox with it (``--die-with-parent``) before the engine could checkpoint, so the command starts
with SIGTERM and SIGINT ignored; the engine sets its own handlers, and the SIGTERM forwarded to
the process group reaches it directly.

Imports nothing from Django. The environment it passes on holds the job token, so it makes itself
non-dumpable first, as the engine does (``engine.cli._guard_credentials``): environment code,
running as the same user below it, cannot read its ``/proc/<pid>/environ``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

#: Bytes relayed per read between an egress socket and its origin.
_RELAY_CHUNK = 64 * 1024
#: Connections an egress socket lets wait.
_RELAY_BACKLOG = 64


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until end of file, then half-close ``sink``."""
    try:
        while data := source.recv(_RELAY_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _relay(client: socket.socket, address: tuple[str, int]) -> None:
    """Relay one accepted connection to ``address`` both ways; close both when done."""
    try:
        upstream = socket.create_connection(address, timeout=30)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve_egress(directory: Path, name: str, address: tuple[str, int]) -> socket.socket:
    """Listen on ``directory/<name>.sock`` (mode 0600) and relay each connection to ``address`` in
    threads of its own; return the listening socket. The socket is bound by a name relative to
    ``directory``: a work dir's absolute path may be longer than a socket address holds."""
    directory.mkdir(mode=0o700, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.getcwd()
    os.chdir(directory)
    try:
        if os.path.exists(f"{name}.sock"):
            os.unlink(f"{name}.sock")
        listener.bind(f"{name}.sock")
        os.chmod(f"{name}.sock", 0o600)
    finally:
        os.chdir(previous)
    listener.listen(_RELAY_BACKLOG)

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_relay, args=(client, address), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener


def supervise(workdir: Path, command: list[str], *, prepare: list[str] | None = None) -> int:
    """Run ``prepare`` (when given) and then ``command`` to completion under supervision and record
    the exit code (``prepare``'s when it failed, and ``command`` then never starts); return it."""
    stdout = open(workdir / "stdout.log", "ab")
    stderr = open(workdir / "stderr.log", "ab")
    if prepare:
        exit_code = subprocess.call(prepare, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
        if exit_code != 0:
            _write_atomically(workdir / "exit.json", json.dumps({"exit_code": exit_code}))
            return exit_code
    # Ignored signals stay ignored across exec: a sandbox's outer process must outlive a SIGTERM.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    engine = subprocess.Popen(
        command, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True
    )
    _write_atomically(workdir / "engine.pid", str(engine.pid))

    def forward(signum, frame):
        try:
            os.killpg(engine.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    exit_code = engine.wait()
    _write_atomically(workdir / "exit.json", json.dumps({"exit_code": exit_code}))
    return exit_code


def _arguments(argv: list[str]) -> tuple[Path, dict[str, tuple[str, int]], list[str] | None, list[str]]:
    """Return (work dir, egress name -> (host, port), prepare command, command) of the command
    line; raise ValueError for a malformed one."""
    if "--" not in argv or argv.index("--") < 1 or argv.index("--") == len(argv) - 1:
        raise ValueError("a work dir and a command after -- are required")
    split = argv.index("--")
    workdir, options, command = Path(argv[0]), argv[1:split], argv[split + 1 :]
    egress: dict[str, tuple[str, int]] = {}
    prepare = None
    while options:
        option, value, options = options[0], (options[1] if len(options) > 1 else ""), options[2:]
        if option == "--egress":
            name, _, target = value.partition("=")
            host, _, port = target.rpartition(":")
            if not name.isalnum() or not host or not port.isdigit():
                raise ValueError(f"--egress wants NAME=HOST:PORT, not {value!r}")
            egress[name] = (host.strip("[]"), int(port))
        elif option == "--prepare":
            prepare = json.loads(value)
            if not isinstance(prepare, list) or not all(isinstance(part, str) for part in prepare) or not prepare:
                raise ValueError("--prepare wants a JSON list of strings")
        else:
            raise ValueError(f"unknown option {option!r}")
    return workdir, egress, prepare, command


def main(argv: list[str]) -> None:
    """Detach (double fork), then supervise. The first process exits 0 once the pid file exists."""
    try:
        workdir, egress, prepare, command = _arguments(argv)
    except ValueError as error:
        sys.stderr.write(
            f"{error}\nusage: python -m jobs.launchers.supervise WORKDIR [--egress NAME=HOST:PORT]... "
            "[--prepare JSON_COMMAND] -- COMMAND...\n"
        )
        raise SystemExit(2) from None
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0)  # PR_SET_DUMPABLE (linux/prctl.h)
    except (OSError, AttributeError):  # not Linux
        pass
    if os.fork() > 0:
        # The launcher waits for this first process; the pid file is written by the grandchild.
        for _ in range(200):
            if (workdir / "supervisor.pid").exists():
                os._exit(0)
            time.sleep(0.01)
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _write_atomically(workdir / "supervisor.pid", str(os.getpid()))
    try:
        for name, address in egress.items():
            serve_egress(workdir / "egress", name, address)
        supervise(workdir, command, prepare=prepare)
    finally:
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
