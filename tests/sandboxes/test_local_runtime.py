"""The local runtime's isolation, tested by attacking it from inside a sandbox held by a real
sandbox agent (sandboxes/agent/, sandboxes/runtime/local.py, lab/lib/bubblewrap.py): each attack
first shows that the host has what the sandbox is after, so that the test fails if the protection
is removed."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

import pytest
from django.conf import settings

from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import CommandRequest, RuntimeRefusal, SandboxSpec
from sandboxes.runtime.cgroups import MemoryCgroups
from sandboxes.runtime.local import TIMEOUT_EXIT_CODE, LocalHost
from tests.support.sandbox_agent import start_agent

REPOSITORY = Path(__file__).resolve().parents[2]


def _spec(name: str = "sbx_test", **limits) -> SandboxSpec:
    values = {"cpu_cores": 1.0, "memory_gb": 0.5, "disk_gb": 0.05} | limits
    return SandboxSpec(sandbox_id=name, image="python:3.11", expires_at=time.time() + 600, **values)


@pytest.fixture
def host(agent) -> LocalHost:
    """Where the agent keeps its sandboxes (for looking at them from the host)."""
    return LocalHost(agent.root)


@pytest.fixture
def sandbox(runtime: AgentRuntime) -> SandboxSpec:
    spec = _spec()
    runtime.start(spec)
    yield spec
    runtime.destroy(spec)


def run(runtime: AgentRuntime, spec: SandboxSpec, command: str, timeout_s: float = 20, **kwargs):
    return runtime.run(spec, CommandRequest(argv=("/bin/sh", "-c", command), timeout_s=timeout_s, **kwargs))


def python(runtime: AgentRuntime, spec: SandboxSpec, code: str, timeout_s: float = 20):
    return runtime.run(spec, CommandRequest(argv=("python3", "-c", code), timeout_s=timeout_s))


def host_processes_of(uid: int | None, *, within_s: float = 2.0, commands_only: bool = False) -> list[int]:
    """Return the host's processes that still run as the sandbox's host ``uid`` once ``within_s``
    seconds have passed (the kernel tears a PID namespace down just after its first process ends);
    with ``commands_only``, leave out the sandbox's own bwrap and supervisor, which live as long
    as it does."""
    if uid is None:
        pytest.skip("sandboxes have host uids of their own only when Lab runs as root")
    deadline = time.monotonic() + within_s
    while True:
        found = []
        for entry in os.scandir("/proc"):
            try:
                if entry.name.isdigit() and entry.stat().st_uid == uid:
                    command = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
                    if commands_only and (command[0].endswith(b"bwrap") or command[:4] == [b"python3", b"-I", b"-S", b"-c"]):
                        continue
                    found.append(int(entry.name))
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_second_agent_on_the_machine_runs_its_sandboxes_as_uids_of_its_own(runtime, sandbox):
    """Two Labs on one machine: the second agent's sandbox never shares a host uid with the first
    one's, so filling its own process limit leaves the first sandbox's untouched (the limit counts
    a uid's processes)."""
    uid = runtime.host_uid(sandbox)
    if uid is None:
        pytest.skip("sandboxes have host uids of their own only when Lab runs as root")
    second = start_agent(warm=1)  # max_processes 64, as the first agent's
    try:
        other = AgentRuntime(second.url, secret=second.secret.encode())
        neighbour = _spec("sbx_neighbour")
        other.start(neighbour)
        assert other.host_uid(neighbour) != uid
        filled = run(other, neighbour, "for i in $(seq 60); do sleep 60 & done; echo started")
        assert filled.stdout == "started\n", filled
        forks = run(runtime, sandbox, "for i in $(seq 40); do sleep 1 & done; wait; echo forked")
        assert (forks.stdout, forks.stderr) == ("forked\n", ""), forks
        other.destroy(neighbour)
    finally:
        second.stop()


def test_it_runs_a_command_in_the_workspace_as_uid_1000_without_capabilities(runtime, host, sandbox):
    result = run(runtime, sandbox, "echo hi > note; pwd; id -u; grep CapEff /proc/self/status; cat note; echo oops >&2; exit 3")
    assert result.stdout.split("\n")[:4] == ["/workspace", "1000", "CapEff:\t0000000000000000", "hi"]
    assert result.stderr == "oops\n"
    assert result.exit_code == 3
    assert (host.workdir(sandbox) / "note").read_text() == "hi\n"


def test_it_gives_commands_the_sandboxs_and_the_commands_variables_and_nothing_of_labs(runtime):
    os.environ["LAB_TEST_LEAK"] = "lab-secret"
    try:
        spec = _spec(environment={"A": "sandbox", "B": "sandbox"})
        runtime.start(spec)
        request = CommandRequest(argv=("/bin/sh", "-c", "echo $A $B $LAB_TEST_LEAK $SECRET_KEY; env | wc -l"), timeout_s=10, environment={"B": "command"})
        lines = runtime.run(spec, request).stdout.split("\n")
    finally:
        del os.environ["LAB_TEST_LEAK"]
        runtime.destroy(spec)
    assert lines[0] == "sandbox command"
    assert int(lines[1]) <= 8  # PATH, HOME, LANG, PYTHONDONTWRITEBYTECODE, A, B, PWD and the like


def test_it_cannot_read_labs_data_dir_the_repository_or_etc_shadow(runtime, sandbox):
    secret = Path(settings.LAB_DATA_DIR) / "sandbox-probe-secret"
    secret.write_text("lab data")
    targets = [str(secret), str(REPOSITORY / "lab" / "settings.py"), "/etc/shadow"]
    try:
        for target in targets:
            assert Path(target).read_bytes(), f"the host should have {target}"
            result = python(runtime, sandbox, f"print(open({target!r}).read())")
            assert result.exit_code == 1 and "FileNotFoundError" in result.stderr, (target, result)
        listing = run(runtime, sandbox, "ls / /etc").stdout.split()
    finally:
        secret.unlink()
    assert "work" not in listing and "root" not in listing and "shadow" not in listing
    assert not any(str(settings.LAB_DATA_DIR).startswith(f"/{name}/") for name in listing if name not in ("tmp",))


def writable_root(runtime: AgentRuntime, spec: SandboxSpec) -> None:
    """Skip unless the sandbox's root is writable (an overlay the agent mounts as root)."""
    if runtime.host_uid(spec) is None:
        pytest.skip("only an agent running as root mounts a sandbox's writable root")


def test_writes_outside_the_workspace_land_in_the_sandboxs_own_root_and_nowhere_else(runtime, host, sandbox):
    writable_root(runtime, sandbox)
    image = host.image_root(sandbox)
    passwd = (image / "etc" / "passwd").read_bytes()
    result = run(runtime, sandbox, "touch /usr/evil && echo x >> /etc/passwd && mkdir -p /app && echo 42 > /app/a && cd /app && "
                                   "cat a && stat -c %u:%a / /etc /etc/passwd && echo x > /tmp/ok && echo done")
    assert (result.stdout, result.stderr) == ("42\n1000:700\n1000:755\n1000:644\ndone\n", ""), result
    assert not Path("/usr/evil").exists() and not (image / "usr" / "evil").exists() and not (image / "app").exists()
    assert (image / "etc" / "passwd").read_bytes() == passwd
    assert (host.disk(sandbox) / "root" / "app" / "a").read_bytes() == b"42\n"
    refused = run(runtime, sandbox, "echo x > /proc/sys/kernel/hostname")
    assert "Permission denied" in refused.stderr, refused


def test_two_sandboxes_of_one_image_never_see_each_others_root(runtime, host, sandbox):
    writable_root(runtime, sandbox)
    other = _spec("sbx_other_root")
    runtime.start(other)
    try:
        assert run(runtime, sandbox, "echo mine > /etc/x && rm /usr/bin/perl && echo ok").stdout == "ok\n"
        seen = run(runtime, other, "cat /etc/x; ls /usr/bin/perl")
        assert seen.stdout == "/usr/bin/perl\n" and "No such file" in seen.stderr, seen
        assert not (host.image_root(sandbox) / "etc" / "x").exists() and (host.image_root(sandbox) / "usr/bin/perl").exists()
    finally:
        runtime.destroy(other)
    assert run(runtime, sandbox, "cat /etc/x").stdout == "mine\n"
    root = host.root_folder(sandbox)
    runtime.destroy(sandbox)
    assert not os.path.ismount(root) and not host.folder(sandbox).exists()
    assert not (host.image_root(sandbox) / "etc" / "x").exists()


def test_it_moves_files_in_and_out_of_its_root_for_the_sandboxs_uid(runtime, host, sandbox):
    writable_root(runtime, sandbox)
    assert runtime.write_file(sandbox, "/app/src/main.py", b"print(6 * 7)\n") == "/app/src/main.py"
    assert runtime.write_file(sandbox, "/etc/hosts", b"10.0.0.1 lab\n") == "/etc/hosts"
    result = run(runtime, sandbox, "cd /app && python3 src/main.py > out.txt && stat -c %u src/main.py && cat /etc/hosts")
    assert result.stdout == "1000\n10.0.0.1 lab\n", result
    assert runtime.read_file(sandbox, "/app/out.txt", max_bytes=100) == b"42\n"
    assert runtime.read_file(sandbox, "/usr/lib/os-release", max_bytes=10_000).startswith(b"PRETTY_NAME=")
    assert b"lab" not in (host.image_root(sandbox) / "etc" / "hosts").read_bytes()
    for path in ("/proc/self/environ", "/dev/null", "/tmp", "/workspace", "/", "/app/../../etc/passwd", "/bin/sh"):
        with pytest.raises(RuntimeRefusal) as refused:
            runtime.write_file(sandbox, path, b"x")
        assert refused.value.code == "invalid_path", path
    for folder in ("/etc", "/app", "/app/src", "/usr/local", "/tmp/."):  # a folder is no file to move, a 400 and not a crash
        for move in (lambda path: runtime.read_file(sandbox, path, max_bytes=100), lambda path: runtime.write_file(sandbox, path, b"x")):
            with pytest.raises(RuntimeRefusal) as refused:
                move(folder)
            assert refused.value.code == "invalid_path", folder
            assert refused.value.message in (
                "The path is not a regular file (a folder, a FIFO or a device): name a file.", "/tmp is a folder: name a file in it."), folder


@pytest.mark.parametrize("port", [5432, 6379])
def test_it_cannot_reach_services_on_the_hosts_loopback(runtime, sandbox, port):
    probe = socket.socket()
    probe.settimeout(2)
    reachable = probe.connect_ex(("127.0.0.1", port)) == 0
    probe.close()
    if not reachable:
        pytest.skip(f"nothing listens on 127.0.0.1:{port} here")
    code = f"import socket; s = socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', {port}))"
    result = python(runtime, sandbox, code)
    assert result.exit_code == 1 and "ConnectionRefusedError" in result.stderr, result


def test_it_has_no_route_off_the_machine(runtime, sandbox):
    result = python(runtime, sandbox, "import socket; s = socket.socket(); s.settimeout(2); s.connect(('1.1.1.1', 53))")
    assert result.exit_code == 1 and "Network is unreachable" in result.stderr, result


def test_it_contains_a_fork_bomb_and_the_host_still_forks(runtime, host, sandbox):
    result = run(runtime, sandbox, "bomb() { bomb | bomb & }; bomb; sleep 1; echo survived", timeout_s=10)
    assert result.exit_code in (0, 2, TIMEOUT_EXIT_CODE)
    assert "fork" in result.stderr.lower() or "resource temporarily unavailable" in result.stderr.lower(), result
    assert os.system("true") == 0
    uid = runtime.host_uid(sandbox)
    runtime.destroy(sandbox)
    assert host_processes_of(uid) == []


def test_a_memory_hog_is_killed_inside_its_sandbox_alone_and_says_so(runtime, sandbox):
    cgroups = MemoryCgroups.detect()
    if cgroups is None:
        pytest.skip("no memory cgroup can be made here: the address-space limit holds memory instead")
    cgroups.close()
    other = _spec("sbx_neighbour")
    runtime.start(other)
    try:
        assert python(runtime, other, "data = b'x' * (200 << 20); print(len(data))").stdout == f"{200 << 20}\n"
        hog = python(runtime, sandbox, "data = bytearray(1 << 30); data[::4096] = b'x' * (1 << 18); print('survived')")
        assert (hog.exit_code, hog.oom_killed, hog.stdout) == (137, True, ""), hog
        assert python(runtime, sandbox, "print(len(b'x' * (64 << 20)))").stdout == f"{64 << 20}\n"
        assert run(runtime, other, "echo alive").stdout == "alive\n"
        assert os.system("true") == 0
    finally:
        runtime.destroy(other)


def test_it_kills_a_command_past_its_timeout_with_every_process_it_started(runtime, host, sandbox):
    started = time.monotonic()
    result = run(runtime, sandbox, "(sleep 30; touch late) & sleep 30", timeout_s=1)
    assert result.exit_code == TIMEOUT_EXIT_CODE and result.timed_out
    assert time.monotonic() - started < 5
    assert host_processes_of(runtime.host_uid(sandbox), commands_only=True) == []


def test_background_processes_live_until_the_sandbox_is_deleted(runtime, host, sandbox):
    result = run(runtime, sandbox, "(sleep 1; echo later > /tmp/leftover) & sleep 300 > /dev/null 2>&1 & echo started")
    assert result.stdout == "started\n" and result.duration_ms < 1000
    time.sleep(1.5)
    assert run(runtime, sandbox, "cat /tmp/leftover").stdout == "later\n"
    uid = runtime.host_uid(sandbox)
    assert host_processes_of(uid, commands_only=True, within_s=0) != []
    runtime.destroy(sandbox)
    assert host_processes_of(uid) == []
    assert not host.folder(sandbox).exists()


def test_a_start_command_serves_the_sandboxs_commands_until_the_sandbox_is_deleted(runtime, host):
    # A server of the sandbox's own, as verifiers' PythonEnv starts one: FIFOs in /tmp, a ready flag, and an
    # answer for each request a later command writes.
    server = ("mkfifo /tmp/requests /tmp/answers; id -u > /tmp/ready; echo serving; "
              "while true; do read line < /tmp/requests; echo \"got $line\" > /tmp/answers; done")
    spec = dataclasses.replace(_spec("sbx_start_command"), start_command=("/bin/sh", "-c", server))
    runtime.start(spec)
    try:
        assert run(runtime, spec, "while [ ! -s /tmp/ready ]; do sleep 0.05; done; cat /tmp/ready", timeout_s=10).stdout == "1000\n"
        ask = "echo {0} > /tmp/requests; cat /tmp/answers"
        assert [run(runtime, spec, ask.format(word)).stdout for word in ("one", "two")] == ["got one\n", "got two\n"]
        runtime.start(spec)  # a second start (idempotent) starts no second server
        count = ("import glob; print(sum(open(path, 'rb').read().startswith(b'/bin/sh\\0-c\\0mkfifo') "
                 "for path in glob.glob('/proc/[0-9]*/cmdline')))")
        assert python(runtime, spec, count).stdout == "1\n"
        assert runtime.logs(spec)[0].startswith("serving\n")
        uid = runtime.host_uid(spec)
        assert host_processes_of(uid, commands_only=True, within_s=0) != []
    finally:
        runtime.destroy(spec)
    assert host_processes_of(uid) == []
    assert not host.folder(spec).exists()


def test_it_cuts_a_file_larger_than_the_disk(runtime, host, sandbox):
    result = run(runtime, sandbox, "head -c 100000000 /dev/zero > big; echo $?")
    assert result.exit_code != 0 or result.stdout.strip() != "0"
    assert (host.workdir(sandbox) / "big").stat().st_size <= 0.05 * 1024**3


def test_files_together_stop_at_the_disk_and_nothing_else_fills(runtime, host, sandbox):
    if os.geteuid() != 0:
        pytest.skip("only root mounts a tmpfs per sandbox: otherwise only each file is held")
    cap = 0.05 * 1024**3
    # /usr/local is the image's: what is written there goes to the sandbox's root, on the same disk.
    result = run(runtime, sandbox, "for i in 1 2 3 4 5 6 7 8 9 10; do head -c 8000000 /dev/zero > /workspace/f$i || break; "
                                   "head -c 8000000 /dev/zero > /tmp/g$i || break; "
                                   "head -c 8000000 /dev/zero > /usr/local/h$i || break; done; echo wrote $i")
    assert "No space left on device" in result.stderr, result
    written = sum(path.stat().st_size for path in host.disk(sandbox).rglob("*") if path.is_file())
    assert cap * 0.8 < written <= cap
    assert len(list((host.disk(sandbox) / "root" / "usr" / "local").glob("h*"))) >= 1
    with pytest.raises(RuntimeRefusal) as refused:
        runtime.write_file(sandbox, "more.bin", b"x" * 4_000_000)
    assert refused.value.code == "disk_quota_exceeded"
    assert run(runtime, sandbox, "rm /workspace/f1 && echo freed").stdout == "freed\n"


def test_it_does_not_see_another_sandboxs_files_or_processes(runtime, host, sandbox):
    other = _spec("sbx_other")
    runtime.start(other)
    try:
        runtime.write_file(other, "secret.txt", b"other's")
        assert run(runtime, other, "sleep 60 > /dev/null 2>&1 & echo ok").stdout == "ok\n"
        assert run(runtime, sandbox, "cat secret.txt; ls /workspace; ls /tmp").stdout == ""
        assert str(host.folder(other)) not in run(runtime, sandbox, "cat /proc/self/mountinfo").stdout
        assert "sleep" not in run(runtime, sandbox, "cat /proc/[0-9]*/cmdline").stdout
    finally:
        runtime.destroy(other)


@pytest.mark.parametrize("path", ["../escape", "a/../../escape", "/workspace/../etc/passwd", "/etc/../../x", "", "a\x00b", "/proc/1/environ"])
def test_it_refuses_paths_that_leave_the_sandbox_or_name_nothing(runtime, sandbox, path):
    with pytest.raises(RuntimeRefusal) as refused:
        runtime.write_file(sandbox, path, b"x")
    assert refused.value.code == "invalid_path"
    with pytest.raises(RuntimeRefusal):
        runtime.read_file(sandbox, path, max_bytes=100)


def test_it_refuses_symlinks_a_command_left_pointing_out(runtime, agent, sandbox):
    outside = agent.root.parent / "outside.txt"
    outside.write_text("host file")
    run(runtime, sandbox, f"ln -s {outside} link; ln -s / rootlink; mkdir -p d; ln -s {agent.root.parent} d/up; ln -s / /tmp/up")
    for path in ("link", "rootlink/etc/shadow", "d/up/outside.txt", "/tmp/up/etc/shadow"):
        with pytest.raises(RuntimeRefusal) as refused:
            runtime.read_file(sandbox, path, max_bytes=100)
        assert refused.value.code == "invalid_path", path
        with pytest.raises(RuntimeRefusal):
            runtime.write_file(sandbox, path, b"overwritten")
    assert outside.read_text() == "host file"


def test_it_writes_and_reads_files_for_the_sandboxs_uid(runtime, sandbox):
    assert runtime.write_file(sandbox, "/workspace/src/main.py", b"print(6 * 7)\n") == "/workspace/src/main.py"
    assert runtime.write_file(sandbox, "/tmp/in/data.txt", b"21") == "/tmp/in/data.txt"
    assert run(runtime, sandbox, "cat /tmp/in/data.txt").stdout == "21"
    assert run(runtime, sandbox, "python3 src/main.py > out.txt").exit_code == 0
    assert runtime.read_file(sandbox, "out.txt", max_bytes=100) == b"42\n"
    result = run(runtime, sandbox, "echo more >> src/main.py && echo ok")
    assert result.stdout == "ok\n"
    with pytest.raises(RuntimeRefusal) as refused:
        runtime.read_file(sandbox, "out.txt", max_bytes=1)
    assert refused.value.code == "file_too_large"


def test_it_deletes_the_work_directory_on_destroy(runtime, host, sandbox):
    run(runtime, sandbox, "mkdir -p a/b && echo x > a/b/c && ln -s / a/root")
    runtime.destroy(sandbox)
    assert not host.folder(sandbox).exists()
    assert Path("/usr/bin").is_dir()
