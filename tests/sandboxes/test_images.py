"""Sandbox images (sandboxes/images.py, docs/sandboxes.md "Images"): a sandbox's root is its
image, Debian's Python 3.11 with numpy and pytest built by ``make sandbox-images``, bound
under an overlay of the sandbox's own (read-only where Lab does not run as root); nothing of the
host outside it is there, and a sandbox of an image this machine has
not built is refused saying how to build it; no file of the image is setuid or setgid, and a
sandbox runs with no_new_privs. Each check first shows what the host has."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from sandboxes import images
from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import CommandRequest, RuntimeRefusal, SandboxSpec
from tests.support.sandbox_agent import start_agent

REPOSITORY = Path(__file__).resolve().parents[2]


def _spec(name: str) -> SandboxSpec:
    return SandboxSpec(sandbox_id=name, image="python:3.11", cpu_cores=1.0, memory_gb=0.5, disk_gb=0.05,
                       expires_at=time.time() + 600)


@pytest.fixture(scope="module")
def image_root() -> Path:
    """The image the session's agent uses (built by make sandbox-images; the tests fail without it)."""
    return images.rootfs(images.images_dir(), "python:3.11")


@pytest.fixture
def sandbox(runtime: AgentRuntime) -> SandboxSpec:
    spec = _spec("sbx_image")
    runtime.start(spec)
    yield spec
    runtime.destroy(spec)


def python(runtime: AgentRuntime, spec: SandboxSpec, code: str):
    return runtime.run(spec, CommandRequest(argv=("python3", "-c", code), timeout_s=30))


def test_a_sandbox_runs_the_images_python_3_11_with_numpy_and_pytest(runtime, sandbox, image_root):
    code = ("import json, os, sys, numpy, pytest; python = os.stat(os.path.realpath(sys.executable)); print(json.dumps(["
            "list(sys.version_info[:2]), numpy.__version__, pytest.__version__, sys.executable, python.st_ino, numpy.ones(3).sum()]))")
    result = python(runtime, sandbox, code)
    assert result.exit_code == 0, result
    version, numpy_version, pytest_version, executable, inode, total = json.loads(result.stdout)
    assert version == [3, 11] and numpy_version.startswith("1.") and pytest_version and total == 3.0
    assert executable == "/usr/bin/python3"
    # The sandbox runs the image's own files (a bind mount, or an overlay's lower layer, keeps their inodes).
    assert inode == (image_root / "usr" / "bin" / "python3").resolve().stat().st_ino


def test_a_sandbox_sees_nothing_of_the_host_outside_its_image(runtime, sandbox, image_root):
    # The repository's folder too, unless it is one every Debian root has (a clone in /tmp).
    parent = [] if str(REPOSITORY.parent) in ("/tmp", "/var/tmp", "/home", "/opt", "/srv") else [str(REPOSITORY.parent)]
    host_only = [
        str(REPOSITORY), *parent, sys.prefix, str(settings.LAB_DATA_DIR), str(image_root.parent),
        "/usr/bin/bwrap", "/usr/bin/mmdebstrap",  # the host's /usr has them, the image has not
    ]
    for path in host_only:
        assert os.path.exists(path), f"the host should have {path}"
        assert not (image_root / path.lstrip("/")).exists(), f"the image should not have {path}"
    result = python(runtime, sandbox, f"import os, json; print(json.dumps([os.path.exists(p) for p in {host_only!r}]))")
    assert json.loads(result.stdout) == [False] * len(host_only), (host_only, result)
    listing = python(runtime, sandbox, "import os; print(sorted(os.listdir('/')))").stdout
    assert eval(listing) == sorted(os.listdir(image_root)), listing  # noqa: S307 - a list of names it printed


def test_a_sandbox_writes_over_its_image_and_the_image_stays_as_built(runtime, sandbox, image_root):
    passwd = (image_root / "etc" / "passwd").read_bytes()
    command = ("for f in /usr/bin/env /etc/passwd /new /usr/lib/python3/dist-packages/numpy/x.py; do "
               "echo evil > $f || echo refused $f; done; mkdir /usr/x || echo refused mkdir; echo ok > /workspace/ok && cat /workspace/ok")
    assert python(runtime, sandbox, "import getpass; print(getpass.getuser())").stdout == "sandbox\n"
    result = runtime.run(sandbox, CommandRequest(argv=("/bin/sh", "-c", command), timeout_s=30))
    if runtime.host_uid(sandbox) is None:  # no overlay without root: the image is the read-only root
        assert result.stderr.count("Read-only file system") == 5, result
        assert result.stdout.count("refused") == 5 and result.stdout.endswith("ok\n"), result
    else:  # what it writes goes to its own root's upper layer
        assert (result.stdout, result.stderr) == ("ok\n", ""), result
        shown = runtime.run(sandbox, CommandRequest(argv=("/bin/sh", "-c", "cat /etc/passwd /new; ls -d /usr/x"), timeout_s=30))
        assert shown.stdout == "evil\nevil\n/usr/x\n", shown
    assert (image_root / "etc" / "passwd").read_bytes() == passwd and not (image_root / "new").exists()
    assert not (image_root / "usr" / "x").exists() and (image_root / "usr" / "bin" / "env").stat().st_size > 1000


def test_a_sandbox_of_an_image_not_built_is_refused_saying_how_to_build_it(owner, settings, tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_SANDBOX_IMAGES_DIR", str(tmp_path / "no-images"))
    bare = start_agent(warm=1)
    try:
        agent = AgentRuntime(bare.url, secret=bare.secret.encode())
        with pytest.raises(RuntimeRefusal) as refused:
            agent.start(_spec("sbx_no_image"))
        assert refused.value.code == "image_not_built" and "make sandbox-images" in refused.value.message
        settings.LAB_SANDBOX_AGENT_URL = settings.LAB_SANDBOX_DATA_PLANE_URL = bare.url
        settings.LAB_SANDBOX_AGENT_SECRET = bare.secret
        response = owner.client().post("/api/v1/sandboxes", {"docker_image": "python:3.11-slim"}, format="json")
        assert response.status_code == 201, response.content
        body = response.json()
        assert body["status"] == "failed" and "make sandbox-images" in body["error"], body
    finally:
        bare.stop()


def test_the_build_step_does_nothing_when_the_images_are_current(image_root, tmp_path):
    started = time.monotonic()
    assert images.main(["--dir", str(image_root.parent)]) == 0
    assert time.monotonic() - started < 1
    assert images.main(["--dir", str(tmp_path), "--check"]) == 1  # nothing built there
    stamp = json.loads((image_root.parent / "python-3.11.json").read_text())
    assert stamp["definition"] == images.IMAGES["python:3.11"].definition()


def test_no_file_of_the_image_is_setuid_or_setgid(image_root):
    """Debian installs su, newgrp and unix_chkpwd setuid or setgid; the build strips every such bit."""
    kept = []
    for folder, folders, files in os.walk(image_root):
        for path in [folder, *(os.path.join(folder, name) for name in files)]:
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                kept.append(f"{oct(stat.S_IMODE(mode))} {path}")
    assert kept == []
    assert (image_root / "usr/bin/su").is_file() and (image_root / "usr/bin/newgrp").is_file()  # there, without the bit


def test_a_sandbox_runs_with_no_new_privs_and_su_gains_it_nothing(runtime, sandbox):
    command = ("grep -E '^(NoNewPrivs|CapEff|CapBnd):' /proc/self/status; find / -xdev -perm /6000 ! -type l; "
               "su -c 'id -u' root </dev/null; echo su=$?; newgrp root </dev/null; echo newgrp=$?; id -u")
    result = runtime.run(sandbox, CommandRequest(argv=("/bin/sh", "-c", command), timeout_s=60))
    lines = result.stdout.splitlines()
    assert lines[:3] == ["CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"], result
    assert lines[3:] == ["su=1", "newgrp=1", "1000"], result


def test_the_build_strips_set_id_bits_on_its_own_tree_and_never_through_a_symlink(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "host-su"
    (root / "usr/bin").mkdir(parents=True)
    (root / "var/mail").mkdir(parents=True)
    outside.write_bytes(b"")
    outside.chmod(0o4755)
    (root / "usr/bin/su").write_bytes(b"")
    (root / "usr/bin/su").chmod(0o4755)
    (root / "usr/bin/chkpwd").write_bytes(b"")
    (root / "usr/bin/chkpwd").chmod(0o2755)
    (root / "var/mail").chmod(0o2775)
    (root / "usr/bin/link").symlink_to(outside)

    assert images.strip_set_id_bits(root) == ["/usr/bin/chkpwd", "/usr/bin/su", "/var/mail"]

    modes = {name: stat.S_IMODE((root / name).stat().st_mode) for name in ("usr/bin/su", "usr/bin/chkpwd", "var/mail")}
    assert modes == {"usr/bin/su": 0o755, "usr/bin/chkpwd": 0o755, "var/mail": 0o775}
    assert stat.S_IMODE(outside.stat().st_mode) == 0o4755  # the link's target is not the image's
    assert images.strip_set_id_bits(root) == []
