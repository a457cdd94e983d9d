"""Environment code on the local launcher sees only its own attempt (jobs/launchers/isolation.py).

A hostile Lab-protocol package, pushed and trained like any other on the real stack (uvicorn,
Celery worker, local launcher in its default bubblewrap sandbox, engine subprocess), tries on
import every read a first hostile pass got through with: Lab's processes and their environment
(``SECRET_KEY``, ``DATABASE_URL``, ``STRIPE_*``), the files under ``LAB_DATA_DIR`` (the secret key
file, the SQLite database, another job's run dir and checkpoint archive, another organization's
wheel), PostgreSQL and Redis over TCP and PostgreSQL's Unix socket, and the web server directly;
then a user namespace and ptrace, which Lab's seccomp filter refuses (lab/lib/seccomp.py). It prints what it got into its job's log; the job itself must still train and succeed, its
ingest reaching Lab through the supervisor's relay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from labsdk import Lab

from jobs.launchers.isolation import check_bubblewrap
from lab.lib import seccomp
from tests.support.packages import TINY
from tests.support.stack import running_stack, wait_for
from tests.support.wheelbuilder import lab_wheel

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]

#: Lab's own secrets, in the web server's and the worker's environment for this test.
LAB_SECRETS = {
    "SECRET_KEY": "sandbox-test-secret-key-" + "k" * 40,
    "STRIPE_API_KEY": "sk_test_sandbox_stripe_key_that_must_not_leak",
    "STRIPE_WEBHOOK_SECRET": "whsec_sandbox_webhook_secret_that_must_not_leak",
}

#: Runs on import inside the engine: every probe, one JSON report on stdout.
PROBE = '''
import json as _json, os as _os, socket as _socket
_TARGETS = _json.loads(%r)
def _probe():
    seen = {"processes": [], "environ_secrets": [], "files": [], "listings": [], "tcp": [], "unix": [], "uid": _os.getuid()}
    for pid in _os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            seen["processes"].append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")[:300])
        except OSError:
            continue
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
        except OSError:
            continue
        seen["environ_secrets"] += [s for s in _TARGETS["secrets"] if s in environ]
    for path in _TARGETS["files"]:
        try:
            with open(path, "rb") as handle:
                seen["files"].append("read %%d bytes" %% len(handle.read(64)))
        except OSError as error:
            seen["files"].append(type(error).__name__)
    for path in _TARGETS["listings"]:
        try:
            seen["listings"].append(sorted(_os.listdir(path)))
        except OSError as error:
            seen["listings"].append(type(error).__name__)
    for host, port in _TARGETS["tcp"]:
        try:
            _socket.create_connection((host, port), timeout=2).close()
            seen["tcp"].append("connected")
        except OSError as error:
            seen["tcp"].append(type(error).__name__)
    for path in _TARGETS["unix"]:
        client = _socket.socket(_socket.AF_UNIX)
        try:
            client.connect(path)
            seen["unix"].append("connected")
        except OSError as error:
            seen["unix"].append(type(error).__name__)
        finally:
            client.close()
    import ctypes as _ctypes, errno as _errno
    seen["seccomp"] = open("/proc/self/status").read().split("Seccomp:")[1].split()[0]
    _libc = _ctypes.CDLL(None, use_errno=True)
    for name, call in (("unshare", lambda: _libc.unshare(0x10000000)), ("ptrace", lambda: _libc.ptrace(0, 0, None, None))):
        seen[name] = "ok" if call() != -1 else _errno.errorcode[_ctypes.get_errno()]
    print("HOSTILE-REPORT " + _json.dumps(seen), flush=True)
_probe()
'''


REPO = Path(__file__).resolve().parents[2]


def _plant(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _report(lab: Lab, job_id: str) -> dict:
    lines = [line.line for line in lab.jobs.logs(job_id, limit=1000)]
    reports = [line.split("HOSTILE-REPORT ", 1)[1] for line in lines if "HOSTILE-REPORT " in line]
    assert reports, "the hostile package printed no report:\n" + "\n".join(lines[-40:])
    return json.loads(reports[0])


def test_a_hostile_package_on_the_local_launcher_sees_nothing_of_lab_or_other_tenants(tmp_path, settings, owner, outsider):
    data_dir = tmp_path / "lab"
    with running_stack(data_dir, settings, LAB_ENGINE_THREADS="1", **LAB_SECRETS) as stack:
        assert "LAB_LOCAL_ISOLATION" not in stack.env  # the default
        # Another organization's wheel, pushed as usual; other tenants' files where Lab keeps them.
        with Lab(api_key=outsider.key, base_url=stack.base_url, timeout=30) as globex:
            theirs = tmp_path / lab_wheel("secret-env", "1.0.0", organization="globex")[0]
            theirs.write_bytes(lab_wheel("secret-env", "1.0.0", organization="globex")[1])
            globex.environments.push(theirs)
        [their_wheel] = (data_dir / "checkpoints" / "environments").rglob("*.whl")
        planted = [
            _plant(data_dir / "secret_key", b"a-secret-key-file"),
            _plant(data_dir / "lab.sqlite3", b"SQLite format 3\0"),
            _plant(data_dir / "runs" / "job_other" / "attempt-1" / "spool" / "samples.jsonl", b'{"prompt": "private"}\n'),
            _plant(data_dir / "checkpoints" / "job_other" / "ckpt_other.tar", b"other tenant's weights"),
            their_wheel,
            REPO / "lab" / "settings.py",  # Lab's own code beyond the engine's, where an operator's files may lie too
        ]
        postgres_socket = "/var/run/postgresql/.s.PGSQL.5432"
        targets = {
            "secrets": [*LAB_SECRETS.values(), connection.settings_dict["NAME"], "DATABASE_URL="],
            "files": [str(path) for path in planted],
            "listings": [str(data_dir), str(data_dir / "runs"), str(data_dir / "checkpoints" / "environments"), "/root", "/var/run"],
            "tcp": [["127.0.0.1", 5432], ["127.0.0.1", 6379], ["127.0.0.1", stack.port]],
            "unix": [postgres_socket],
        }

        with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
            name, wheel = lab_wheel("probe-env", "0.1.0", prelude=PROBE % json.dumps(targets))
            (tmp_path / name).write_bytes(wheel)
            lab.environments.push(tmp_path / name)
            job = lab.jobs.create({**TINY, "env": [{"id": "acme/probe-env"}]})
            done = wait_for(
                lambda: (current := lab.jobs.retrieve(job.id)).status in {"succeeded", "failed", "cancelled"} and current,
                timeout=240,
                what=f"{job.id} finished",
            )
            assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
            report = _report(lab, job.id)

    assert report["uid"] == 1000
    assert not any("uvicorn" in command or "celery" in command for command in report["processes"]), report["processes"]
    assert report["environ_secrets"] == []
    assert report["files"] == ["FileNotFoundError"] * len(planted), report["files"]
    data_listing, runs_listing, environments_listing, root_listing, run_listing = report["listings"]
    assert data_listing == ["checkpoints", "runs"]  # the parents of its own work dir and storage folder
    assert runs_listing == [job.id]
    assert environments_listing == [owner.organization.public_id]  # its own package's folder, not Globex's
    assert root_listing == [".pyenv"] or root_listing == [], root_listing  # the Python installation at most
    assert run_listing == "FileNotFoundError"
    assert report["tcp"] == ["ConnectionRefusedError"] * 3
    assert report["unix"] == ["FileNotFoundError"]
    # Lab's seccomp filter (lab/lib/seccomp.py): no user namespace, no tracing.
    assert (report["seccomp"], report["unshare"], report["ptrace"]) == ("2", "EPERM", "EPERM"), report


def test_every_lab_process_makes_itself_non_dumpable_and_private_once_django_is_set_up(tmp_path):
    """The second line behind the sandbox (lab/lib/process.py): web, worker, beat and commands all
    set Django up, and from then on a process of the same unprivileged user cannot read their
    environment (PR_GET_DUMPABLE 0) and what they create is their user's alone (umask 077)."""
    code = (
        "import ctypes, os, django; django.setup(); "
        "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), oct(os.umask(0)))"  # PR_GET_DUMPABLE
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "lab.settings", "LAB_DATA_DIR": str(tmp_path / "data")}
    answer = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert answer.stdout.split() == ["0", "0o77"]
    assert (tmp_path / "data").stat().st_mode & 0o077 == 0


def test_the_files_a_job_leaves_under_the_data_dir_are_private(tmp_path, settings, owner):
    """Run dirs, spools, logs and checkpoint archives are 0600 in 0700 folders, so another local
    user reads none of them."""
    data_dir = tmp_path / "lab"
    with (
        running_stack(data_dir, settings, LAB_ENGINE_THREADS="1") as stack,
        Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab,
    ):
        job = lab.jobs.create({**TINY, "env": [{"id": "lab/addition"}], "checkpoints": {"interval": 1}})
        done = wait_for(
            lambda: (current := lab.jobs.retrieve(job.id)).status in {"succeeded", "failed"} and current,
            timeout=240,
            what=f"{job.id} finished",
        )
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
    written = [path for path in (data_dir / "runs").rglob("*")] + [path for path in (data_dir / "checkpoints").rglob("*")]
    assert any(path.suffix == ".tar" for path in written)
    loose = {str(path): oct(path.stat().st_mode & 0o777) for path in written if not path.is_symlink() and not path.is_socket()
             and path.stat().st_mode & 0o077}
    assert loose == {}


def test_a_teacher_endpoint_is_relayed_to_an_address_pinned_at_launch_and_never_to_a_private_one(tmp_path):
    """A job's ``[teacher]`` is the one outside endpoint its sandbox reaches; through the relay
    it must not become a way to PostgreSQL or anything else on Lab's own network."""
    from jobs.launchers.base import LaunchRequest
    from jobs.launchers.local import LocalLauncher, pinned_address
    from lab.lib.http import UnsafeURL

    assert pinned_address("http://127.0.0.1:8300/v1", allow_private=True) == "127.0.0.1:8300"
    assert pinned_address("https://localhost/v1", allow_private=True) in ("127.0.0.1:443", "::1:443")
    for url in ("http://127.0.0.1:5432/v1", "http://10.0.0.7/v1", "http://[::1]:6379/v1", "http://localhost:5432"):
        with pytest.raises(UnsafeURL):
            pinned_address(url, allow_private=False)
    launcher = LocalLauncher(runs_dir=tmp_path / "runs", repo_dir=Path(__file__).resolve().parents[2], isolation="bubblewrap")
    spec = {"model": "lab/tiny-random-llama", "teacher": {"client": {"base_url": "http://127.0.0.1:5432/v1"}}}
    request = LaunchRequest(job_id="job_teacher", attempt=1, spec=spec, lab_url="http://127.0.0.1:9", token="t")
    with pytest.raises(UnsafeURL, match="private or loopback|refused"):
        launcher.launch(request)
    assert not (tmp_path / "runs" / "job_teacher" / "attempt-1" / "supervisor.pid").exists()


def test_a_model_converted_on_first_use_is_prepared_outside_the_sandbox_which_sees_the_cache_read_only(tmp_path, monkeypatch):
    """SmolLM2 is converted from its GGUF into the model cache on first use; the sandbox sees the
    cache read-only, so the supervisor runs ``python -m engine prepare-model`` first, outside it,
    on the very cache the sandbox binds (LAB_MODEL_DIR)."""
    from jobs.launchers import local
    from jobs.launchers.base import LaunchRequest

    started = []

    def supervisor(command, **kwargs):
        started.append((command, kwargs["env"]))
        (Path(command[3]) / "supervisor.pid").write_text("1")
        return subprocess.CompletedProcess(command, 0, b"", b"")

    check_bubblewrap()  # the real probe (cached per process) before subprocess.run is replaced
    monkeypatch.setattr(local.subprocess, "run", supervisor)
    models = tmp_path / "models"
    launcher = local.LocalLauncher(
        runs_dir=tmp_path / "runs", repo_dir=Path(__file__).resolve().parents[2], isolation="bubblewrap",
        data_dir=tmp_path, model_dir=models,
    )
    for job_id, model in (("job_small", "HuggingFaceTB/SmolLM2-135M-Instruct"), ("job_tiny", "lab/tiny-random-llama")):
        request = LaunchRequest(job_id=job_id, attempt=1, spec={"model": model}, lab_url="http://127.0.0.1:8123", token="t")
        launcher.launch(request)
    (smol, smol_env), (tiny, _) = started
    options = smol[smol.index(str(tmp_path / "runs" / "job_small" / "attempt-1")) + 1 : smol.index("--")]
    assert options == [
        "--egress", "lab=127.0.0.1:8123",
        "--prepare", json.dumps([sys.executable, "-m", "engine", "prepare-model", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct"]),
    ]
    assert smol_env["LAB_MODEL_DIR"] == str(models.resolve())
    sandbox = smol[smol.index("--") + 1 :]
    assert sandbox[:4] == seccomp.file_prefix()  # opens the seccomp filter for bwrap on FILE_FD
    assert sandbox[4].endswith("bwrap") and sandbox[5:7] == ["--seccomp", str(seccomp.FILE_FD)]
    assert ["--ro-bind", str(models.resolve()), str(models.resolve())] == sandbox[sandbox.index(str(models.resolve())) - 1 :][:3]
    assert ["--tmpfs", str(tmp_path.resolve())] == sandbox[sandbox.index(str(tmp_path.resolve())) - 1 :][:2]
    assert "--prepare" not in tiny  # a model built in memory needs no cache
    # Once converted, nothing more is prepared.
    (models / "HuggingFaceTB" / "SmolLM2-135M-Instruct").mkdir(parents=True)
    (models / "HuggingFaceTB" / "SmolLM2-135M-Instruct" / "config.json").write_text("{}")
    launcher.launch(LaunchRequest(job_id="job_again", attempt=1, spec={"model": "HuggingFaceTB/SmolLM2-135M-Instruct"},
                                  lab_url="http://127.0.0.1:8123", token="t"))
    assert "--prepare" not in started[-1][0]


def test_an_endpoint_evaluation_relays_its_endpoint_and_prepares_no_model(tmp_path, monkeypatch):
    """An evaluation sampled through an endpoint (``[eval.endpoint]``) loads no model, so nothing
    is prepared; its endpoint's origin is relayed, pinned to its address, unless it is Lab's own
    (a deployment's endpoint), which the ``lab`` relay carries already."""
    from jobs.launchers import local
    from jobs.launchers.base import LaunchRequest

    started = []

    def supervisor(command, **kwargs):
        started.append(command)
        (Path(command[3]) / "supervisor.pid").write_text("1")
        return subprocess.CompletedProcess(command, 0, b"", b"")

    check_bubblewrap()  # the real probe (cached per process) before subprocess.run is replaced
    monkeypatch.setattr(local.subprocess, "run", supervisor)
    launcher = local.LocalLauncher(
        runs_dir=tmp_path / "runs", repo_dir=Path(__file__).resolve().parents[2], isolation="bubblewrap",
        data_dir=tmp_path, model_dir=tmp_path / "models", allow_private_egress=True,
    )
    for job_id, base_url in (("job_outside", "http://127.0.0.1:7001/v1"), ("job_lab", "http://127.0.0.1:8123/api/v1/openai/v1")):
        spec = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                "eval": {"endpoint": {"base_url": base_url, "model": "m", "api_key_var": "K"}}}
        launcher.launch(LaunchRequest(job_id=job_id, attempt=1, spec=spec, lab_url="http://127.0.0.1:8123", token="t"))
    for command, relays in zip(started, (["lab=127.0.0.1:8123", "endpoint=127.0.0.1:7001"], ["lab=127.0.0.1:8123"])):
        options = command[command.index(str(Path(command[3]))) + 1 : command.index("--")]
        assert options == [part for relay in relays for part in ("--egress", relay)]
