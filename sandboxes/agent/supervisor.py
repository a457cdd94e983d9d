"""The first process of a sandbox: starts its commands and relays their output.

This module runs *inside* the sandbox (``python3 -I -S -c <this file's source>``, the sandbox's
own Python, standard library only, no asyncio: it starts in a few tens of milliseconds and holds
about 10 MB) as the sandboxed user, with nothing more than the commands it starts: whatever a
command does to it harms only its own sandbox. It reads requests from its stdin and writes events
to its stdout, both pipes to the agent, as frames (``HEADER``: stream number, kind, payload
length; then the payload):

- agent → supervisor: ``RUN`` (JSON ``{"argv", "cwd", "env", "timeout_s", "cpu_s"}``) starts a
  command as stream N; ``SIGNAL`` (JSON ``{"signal"}``) signals stream N's process group;
  ``LIMITS`` (JSON ``{"address_space", "file_size"}``, bytes, each optional) lowers the supervisor's own limits,
  which every command started after inherits (a warm sandbox becoming a sandbox of its own);
- supervisor → agent: ``READY`` (stream 0, once), ``STARTED`` (JSON ``{"pid"}``), ``STDOUT`` and
  ``STDERR`` (raw bytes), ``EXITED`` (JSON ``{"exit_code", "timed_out", "error"}``, last).

Each command is a session (process group) of its own under ``RLIMIT_CPU`` = ``cpu_s``; a command
that cannot be started exits 127 (not found) or 126 with the reason on its stderr, as a shell
says it. At its timeout its whole group is killed (exit code 124); when it ends by itself,
processes it left in the background keep running until the sandbox ends, and its output is read
until its pipes close or ``DRAIN_AFTER_EXIT_S`` has passed. The agent trusts nothing it reads
here beyond its own sandbox: frames are bounded and parsed strictly there.
"""

import json
import os
import resource
import selectors
import signal
import struct
import time

HEADER = struct.Struct(">IBI")
RUN, SIGNAL, LIMITS = 1, 2, 3
READY, STARTED, STDOUT, STDERR, EXITED = 10, 11, 12, 13, 14
#: Largest request frame accepted (bytes): a command's argv and environment.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: How long output is still read after a command ended while its pipes stay open (seconds).
DRAIN_AFTER_EXIT_S = 0.2
TIMEOUT_EXIT_CODE = 124
CHUNK_BYTES = 65536


def send(stream, kind, payload=b""):
    data = HEADER.pack(stream, kind, len(payload)) + payload
    while data:
        data = data[os.write(1, data):]


class Command:
    """One running command: its process, the pidfd that says when it ends, its output pipes."""

    def __init__(self, stream, pid, pidfd, pipes, deadline):
        self.stream = stream
        self.pid = pid
        self.pidfd = pidfd
        self.pipes = pipes  # read end → frame kind
        self.deadline = deadline
        self.exit_code = None
        self.timed_out = False
        self.drain_until = None


class Supervisor:
    def __init__(self):
        self.selector = selectors.DefaultSelector()
        self.commands = {}
        self.buffer = b""

    def start(self, stream, request):
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            _child(request, out_write, err_write)
        os.close(out_write)
        os.close(err_write)
        pidfd = os.pidfd_open(pid)
        command = Command(stream, pid, pidfd, {out_read: STDOUT, err_read: STDERR},
                          time.monotonic() + float(request["timeout_s"]))
        self.commands[stream] = command
        self.selector.register(pidfd, selectors.EVENT_READ, ("exit", command))
        for fd in command.pipes:
            self.selector.register(fd, selectors.EVENT_READ, ("output", command))
        send(stream, STARTED, json.dumps({"pid": pid}).encode())

    def output(self, command, fd):
        try:
            chunk = os.read(fd, CHUNK_BYTES)
        except OSError:
            chunk = b""
        if chunk:
            send(command.stream, command.pipes[fd], chunk)
            return
        self.selector.unregister(fd)
        os.close(fd)
        del command.pipes[fd]
        self.finish_if_done(command)

    def exited(self, command):
        _, status = os.waitpid(command.pid, 0)
        self.selector.unregister(command.pidfd)
        os.close(command.pidfd)
        code = os.waitstatus_to_exitcode(status)
        command.exit_code = TIMEOUT_EXIT_CODE if command.timed_out else (128 - code if code < 0 else code)
        command.drain_until = time.monotonic() + DRAIN_AFTER_EXIT_S
        self.finish_if_done(command)

    def finish_if_done(self, command, *, force=False):
        if command.exit_code is None or (command.pipes and not force):
            return
        for fd in list(command.pipes):  # a process left in the background holds them: let go
            self.selector.unregister(fd)
            os.close(fd)
        command.pipes.clear()
        del self.commands[command.stream]
        send(command.stream, EXITED, json.dumps({"exit_code": command.exit_code, "timed_out": command.timed_out,
                                                 "error": None}).encode())

    def tick(self):
        """Kill commands past their deadline; finish those whose output outlives them too long."""
        now = time.monotonic()
        for command in list(self.commands.values()):
            if command.exit_code is None and now >= command.deadline and not command.timed_out:
                command.timed_out = True
                _kill(command.pid, signal.SIGKILL)
            elif command.drain_until is not None and now >= command.drain_until:
                self.finish_if_done(command, force=True)

    def next_wait(self):
        moments = [c.drain_until if c.exit_code is not None else c.deadline for c in self.commands.values()]
        return max(0.0, min(moments) - time.monotonic()) if moments else None

    def requests(self):
        """Handle the whole frames read so far; return False when the agent is gone."""
        try:
            chunk = os.read(0, CHUNK_BYTES)
        except OSError:
            chunk = b""
        if not chunk:
            return False
        self.buffer += chunk
        while len(self.buffer) >= HEADER.size:
            stream, kind, length = HEADER.unpack_from(self.buffer)
            if length > MAX_REQUEST_BYTES:
                return False
            if len(self.buffer) < HEADER.size + length:
                break
            payload = self.buffer[HEADER.size:HEADER.size + length]
            self.buffer = self.buffer[HEADER.size + length:]
            try:
                request = json.loads(payload)
            except ValueError:
                return False
            if kind == RUN and stream not in self.commands:
                self.start(stream, request)
            elif kind == SIGNAL and stream in self.commands:
                _kill(self.commands[stream].pid, int(request.get("signal", signal.SIGKILL)))
            elif kind == LIMITS:
                for limit, name in ((resource.RLIMIT_AS, "address_space"), (resource.RLIMIT_FSIZE, "file_size")):
                    if request.get(name) is not None:
                        value = min(int(request[name]), resource.getrlimit(limit)[1])
                        resource.setrlimit(limit, (value, value))
        return True

    def serve(self):
        self.selector.register(0, selectors.EVENT_READ, ("requests", None))
        send(0, READY)
        while True:
            for key, _ in self.selector.select(self.next_wait()):
                what, command = key.data
                if what == "requests":
                    if not self.requests():
                        return  # the agent is gone or speaks nonsense: the sandbox ends with this process
                elif what == "output":
                    self.output(command, key.fd)
                elif what == "exit":
                    self.exited(command)
            self.tick()


def _child(request, out_write, err_write):
    """In the forked child: become the command (never returns)."""
    try:
        os.setsid()
        cpu_s = int(request.get("cpu_s") or 0)
        if cpu_s > 0:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_write, 1)
        os.dup2(err_write, 2)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        for signum in (signal.SIGPIPE, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        try:  # when the sandbox's memory runs out, its commands go before the supervisor
            with open("/proc/self/oom_score_adj", "w") as adjust:
                adjust.write("500")
        except OSError:
            pass
        os.chdir(request["cwd"])
        argv = request["argv"]
        os.execvpe(argv[0], argv, request["env"])
    except OSError as error:
        name = error.filename or request["argv"][0]
        os.write(2, f"{name}: {error.strerror}\n".encode(errors="replace"))
        os._exit(127 if isinstance(error, FileNotFoundError) else 126)
    except BaseException:  # noqa: BLE001 - a forked child must never return into the supervisor
        os._exit(126)


def _kill(group, signum):
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    Supervisor().serve()
