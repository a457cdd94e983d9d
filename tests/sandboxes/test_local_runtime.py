"""The local runtime's isolation, tested by attacking it from inside a sandbox
(sandboxes/runtime/local.py, lab/lib/bubblewrap.py): each attack first shows that the host has
what the sandbox is after, so that the test fails if the protection is removed."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from django.conf import settings

from sandboxes.runtime.base import CommandRequest, RuntimeRefusal, SandboxSpec
from sandboxes.runtime.local import TIMEOUT_EXIT_CODE, LocalRuntime

REPOSITORY = Path(__file__).resolve().parents[2]


def _spec(name: str = "sbx_test", slot: int = 1, **limits) -> SandboxSpec:
    values = {"cpu_cores": 1.0, "memory_gb": 0.5, "disk_gb": 0.05} | limits
    return SandboxSpec(sandbox_id=name, image="python:3.11", slot=slot, **values)


@pytest.fixture
def sandbox(runtime: LocalRuntime) -> SandboxSpec:
    spec = _spec()
    runtime.start(spec)
    return spec


def run(runtime: LocalRuntime, spec: SandboxSpec, command: str, timeout_s: float = 20, **kwargs):
    return runtime.run(spec, CommandRequest(argv=("/bin/sh", "-c", command), timeout_s=timeout_s, **kwargs))


def python(runtime: LocalRuntime, spec: SandboxSpec, code: str, timeout_s: float = 20):
    return runtime.run(spec, CommandRequest(argv=("python3", "-c", code), timeout_s=timeout_s))


def host_processes_of(runtime: LocalRuntime, spec: SandboxSpec, *, within_s: float = 2.0) -> list[int]:
    """Return the host's processes that still run as the sandbox's host uid once ``within_s``
    seconds have passed (the kernel tears a PID namespace down just after its first process ends)."""
    uid = runtime.host_uid(spec)
    if uid is None:
        pytest.skip("sandboxes have host uids of their own only when Lab runs as root")
    deadline = time.monotonic() + within_s
    while True:
        found = []
        for entry in os.scandir("/proc"):
            try:
                if entry.name.isdigit() and entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_it_runs_a_command_in_the_workspace_as_uid_1000_without_capabilities(runtime, sandbox):
    result = run(runtime, sandbox, "echo hi > note; pwd; id -u; grep CapEff /proc/self/status; cat note; echo oops >&2; exit 3")
    assert result.stdout.split("\n")[:4] == ["/workspace", "1000", "CapEff:\t0000000000000000", "hi"]
    assert result.stderr == "oops\n"
    assert result.exit_code == 3
    assert (runtime.workdir(sandbox) / "note").read_text() == "hi\n"


def test_it_gives_commands_the_sandboxs_and_the_commands_variables_and_nothing_of_labs(runtime):
    os.environ["LAB_TEST_LEAK"] = "lab-secret"
    try:
        spec = _spec(environment={"A": "sandbox", "B": "sandbox"})
        runtime.start(spec)
        request = CommandRequest(argv=("/bin/sh", "-c", "echo $A $B $LAB_TEST_LEAK $SECRET_KEY; env | wc -l"), timeout_s=10, environment={"B": "command"})
        lines = runtime.run(spec, request).stdout.split("\n")
    finally:
        del os.environ["LAB_TEST_LEAK"]
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


def test_it_cannot_write_outside_the_workspace(runtime, sandbox):
    result = run(runtime, sandbox, "touch /usr/evil; touch /etc/passwd; echo x > /tmp/ok && echo tmp-ok")
    assert "Read-only file system" in result.stderr
    assert result.stdout == "tmp-ok\n"
    assert not Path("/usr/evil").exists()


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


def test_it_contains_a_fork_bomb_and_the_host_still_forks(runtime, sandbox):
    result = run(runtime, sandbox, "bomb() { bomb | bomb & }; bomb; sleep 1; echo survived", timeout_s=10)
    assert result.exit_code in (0, 2, TIMEOUT_EXIT_CODE)
    assert "fork" in result.stderr.lower() or "resource temporarily unavailable" in result.stderr.lower(), result
    assert host_processes_of(runtime, sandbox) == []
    assert os.system("true") == 0


def test_it_stops_a_memory_hog_at_the_sandboxs_memory(runtime, sandbox):
    result = python(runtime, sandbox, "data = b'x' * (1 << 30); print(len(data))")
    assert result.exit_code == 1 and "MemoryError" in result.stderr, result
    assert python(runtime, sandbox, "print(len(b'x' * (64 << 20)))").stdout == f"{64 << 20}\n"


def test_it_kills_a_command_past_its_timeout_with_every_process_it_started(runtime, sandbox):
    started = time.monotonic()
    result = run(runtime, sandbox, "(sleep 30; touch late) & sleep 30", timeout_s=1)
    assert result.exit_code == TIMEOUT_EXIT_CODE and result.timed_out
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert host_processes_of(runtime, sandbox) == []


def test_it_ends_background_processes_with_the_command(runtime, sandbox):
    result = run(runtime, sandbox, "(sleep 1; echo escaped > leftover) & echo started")
    assert result.stdout == "started\n" and result.duration_ms < 1000
    assert host_processes_of(runtime, sandbox) == []
    time.sleep(1.5)
    assert not (runtime.workdir(sandbox) / "leftover").exists()


def test_it_cuts_a_file_larger_than_the_disk(runtime, sandbox):
    result = run(runtime, sandbox, "head -c 100000000 /dev/zero > big; echo $?")
    assert result.exit_code != 0 or result.stdout.strip() != "0"
    assert (runtime.workdir(sandbox) / "big").stat().st_size <= 0.05 * 1024**3


def test_it_does_not_see_another_sandboxs_files_or_processes(runtime, sandbox):
    other = _spec("sbx_other", slot=2)
    runtime.start(other)
    runtime.write_file(other, "secret.txt", b"other's")
    assert run(runtime, sandbox, "cat secret.txt; ls /workspace").stdout == ""
    assert str(runtime.workdir(other)) not in run(runtime, sandbox, "cat /proc/self/mountinfo").stdout


@pytest.mark.parametrize("path", ["../escape", "a/../../escape", "/etc/passwd", "/workspace/../etc/passwd", "", "a\x00b", "/workspacex/a"])
def test_it_refuses_paths_outside_the_workspace(runtime, sandbox, path):
    with pytest.raises(RuntimeRefusal) as refused:
        runtime.write_file(sandbox, path, b"x")
    assert refused.value.code == "invalid_path"
    with pytest.raises(RuntimeRefusal):
        runtime.read_file(sandbox, path, max_bytes=100)


def test_it_refuses_symlinks_a_command_left_pointing_out(runtime, sandbox):
    outside = runtime.root.parent / "outside.txt"
    outside.write_text("host file")
    run(runtime, sandbox, f"ln -s {outside} link; ln -s / rootlink; mkdir -p d; ln -s {runtime.root.parent} d/up")
    for path in ("link", "rootlink/etc/shadow", "d/up/outside.txt"):
        with pytest.raises(RuntimeRefusal) as refused:
            runtime.read_file(sandbox, path, max_bytes=100)
        assert refused.value.code == "invalid_path", path
        with pytest.raises(RuntimeRefusal):
            runtime.write_file(sandbox, path, b"overwritten")
    assert outside.read_text() == "host file"


def test_it_writes_and_reads_files_for_the_sandboxs_uid(runtime, sandbox):
    assert runtime.write_file(sandbox, "/workspace/src/main.py", b"print(6 * 7)\n") == "/workspace/src/main.py"
    assert run(runtime, sandbox, "python3 src/main.py > out.txt").exit_code == 0
    assert runtime.read_file(sandbox, "out.txt", max_bytes=100) == b"42\n"
    result = run(runtime, sandbox, "echo more >> src/main.py && echo ok")
    assert result.stdout == "ok\n"
    with pytest.raises(RuntimeRefusal) as refused:
        runtime.read_file(sandbox, "out.txt", max_bytes=1)
    assert refused.value.code == "file_too_large"


def test_it_deletes_the_work_directory_on_destroy(runtime, sandbox):
    run(runtime, sandbox, "mkdir -p a/b && echo x > a/b/c && ln -s / a/root")
    runtime.destroy(sandbox)
    assert not runtime.workdir(sandbox).exists()
    assert Path("/usr/bin").is_dir()
