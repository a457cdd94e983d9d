"""A job's judges on the local launcher: the sandbox reaches the judge endpoints the job declares
(``[[env]] judge``), through the supervisor's relays, and nothing else.

The sandbox here is the launcher's own (its bubblewrap command line and its supervisor, as
``LocalLauncher.launch`` builds them), with a probe in place of the engine: it serves the job's
judges on its loopback as the engine does (``engine.egress.serve_forwards``), then calls each
declared judge by its URL, and tries the addresses no judge names."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine import egress
from jobs.launchers import local
from jobs.launchers.base import LaunchRequest, judge_urls
from jobs.launchers.isolation import check_bubblewrap, loopback_hosts

REPO = Path(__file__).resolve().parents[2]


class _Answer(BaseHTTPRequestHandler):
    """Answers every GET with the server's name and the Host header it was sent."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"server": self.server.name, "host": self.headers.get("Host")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(name: str, address: str = "127.0.0.1") -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((address, 0), _Answer)
    server.name = name
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


#: Runs in the sandbox in the engine's place: one JSON line of what each URL answered.
PROBE = """
import json, socket, sys, urllib.request
from engine import egress
egress.serve_forwards(egress.forwards())
seen = {"sockets": sorted(__import__("os").listdir("/run/lab/egress"))}
for url in json.loads(sys.argv[1]):
    try:
        seen[url] = json.loads(urllib.request.urlopen(url, timeout=5).read())
    except Exception as error:
        seen[url] = "unreachable: " + type(getattr(error, "reason", error)).__name__
print(json.dumps(seen))
"""


def _launched(monkeypatch, launcher: local.LocalLauncher, request: LaunchRequest) -> tuple[list[str], dict]:
    """Return the supervisor's command line and environment ``launcher.launch`` starts, unstarted."""
    started = []

    def supervisor(command, **kwargs):
        started.append((command, kwargs["env"]))
        (Path(command[3]) / "supervisor.pid").write_text("1")
        return subprocess.CompletedProcess(command, 0, b"", b"")

    check_bubblewrap()  # the real probe (cached per process) before subprocess.run is replaced
    with monkeypatch.context() as patch:
        patch.setattr(local.subprocess, "run", supervisor)
        launcher.launch(request)
    ((command, env),) = started
    return command, env


def _host_address() -> str | None:
    """An address of this machine other than loopback (a sandbox must not reach it), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_a_sandbox_reaches_the_judges_its_job_declares_by_their_urls_and_no_other_address(tmp_path, monkeypatch):
    judge, named_judge, undeclared = _serve("judge"), _serve("named-judge", "0.0.0.0"), _serve("undeclared", "0.0.0.0")
    hostname = socket.gethostname()
    try:
        named = socket.gethostbyname(hostname)
    except OSError:
        named = None
    judge_url = f"http://127.0.0.1:{judge.server_port}/v1"
    named_url = f"http://{hostname}:{named_judge.server_port}/v1" if named else None
    spec = {
        "model": "lab/tiny-random-llama",
        "env": [
            {"id": "acme/judge-qa", "judge": {"base_url": judge_url}, "args": {"judge_base_url": judge_url}},
            # Not declared: a judge_base_url the block gives without a judge is never relayed.
            {"id": "acme/other", "args": {"judge_base_url": f"http://127.0.0.1:{undeclared.server_port}/v1"}},
        ],
        "eval": {
            "env": [{"id": "acme/judge-qa", "judge": {"base_url": named_url}, "args": {"judge_base_url": named_url}}]
            if named_url
            else []
        },
    }
    launcher = local.LocalLauncher(
        runs_dir=tmp_path / "runs",
        repo_dir=REPO,
        isolation="bubblewrap",
        data_dir=tmp_path,
        model_dir=tmp_path / "models",
        allow_private_egress=True,
    )
    request = LaunchRequest(job_id="job_judged", attempt=1, spec=spec, lab_url="http://127.0.0.1:9", token="t")
    command, env = _launched(monkeypatch, launcher, request)
    workdir = tmp_path / "runs" / "job_judged" / "attempt-1"
    options = command[command.index(str(workdir)) + 1 : command.index("--")]
    relays = ["lab=127.0.0.1:9", f"judge0=127.0.0.1:{judge.server_port}"]
    if named_url:
        relays.append(f"judge1={named}:{named_judge.server_port}")
    assert options == [part for relay in relays for part in ("--egress", relay)]
    forwards = {f"http://127.0.0.1:{judge.server_port}": "/run/lab/egress/judge0.sock"}
    if named_url:
        forwards[f"http://{hostname.lower()}:{named_judge.server_port}"] = "/run/lab/egress/judge1.sock"
        assert (workdir / "hosts").read_text().splitlines()[-1] == f"127.77.0.1\t{hostname.lower()}"
    assert json.loads(env[egress.FORWARDS_VARIABLE]) == forwards

    # The launcher's sandbox and supervisor, for real, with the probe in the engine's place.
    sandbox = command[command.index("--") + 1 :]
    engine_at = sandbox.index("-m", sandbox.index("--") + 1) - 1
    host = _host_address()
    targets = [judge_url, f"http://127.0.0.1:{undeclared.server_port}/v1"]
    if named_url:
        targets.append(named_url)
    if host:
        targets.append(f"http://{host}:{undeclared.server_port}/v1")
    probe = [*sandbox[:engine_at], sys.executable, "-c", PROBE, json.dumps(targets)]
    (workdir / "supervisor.pid").unlink()
    local.start_supervised(python=sys.executable, workdir=workdir, command=probe, env=env, cwd=REPO, options=options)
    deadline = time.monotonic() + 60
    while not (workdir / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert json.loads((workdir / "exit.json").read_text())["exit_code"] == 0, (workdir / "stderr.log").read_text()[
        -3000:
    ]
    seen = json.loads((workdir / "stdout.log").read_text().strip().splitlines()[-1])
    try:
        assert seen.pop("sockets") == sorted(["lab.sock", "judge0.sock", *(["judge1.sock"] if named_url else [])])
        assert seen.pop(judge_url) == {"server": "judge", "host": f"127.0.0.1:{judge.server_port}"}
        if named_url:
            # By its own name, resolved in the sandbox to a loopback address of its own, relayed to the pinned address.
            assert seen.pop(named_url) == {"server": "named-judge", "host": f"{hostname}:{named_judge.server_port}"}
        # The undeclared server, on the loopback (the sandbox's own: nothing listens) and on the host's own address.
        assert set(seen.values()) <= {"unreachable: ConnectionRefusedError", "unreachable: OSError"}, seen
        assert len(seen) == (2 if host else 1)
    finally:
        for server in (judge, named_judge, undeclared):
            server.shutdown()


def test_a_judge_the_sandbox_cannot_serve_on_its_loopback_is_refused_naming_why():
    with pytest.raises(egress.ForwardRefused, match="port is below 1024"):
        egress.serve_forwards({"https://api.openai.com:443": "/nonexistent.sock"})
    with pytest.raises(egress.ForwardRefused, match="name it by a host name, or by a loopback address"):
        egress.serve_forwards({"http://192.0.2.7:8080": "/nonexistent.sock"})


def test_only_the_judge_endpoints_a_spec_declares_are_relayed():
    spec = {
        "env": [
            {
                "id": "a/x",
                "judge": {"base_url": "https://judge.example/v1"},
                "args": {"judge_base_url": "https://judge.example/v1"},
            },
            {
                "id": "a/y",
                "judge": {"base_url": "https://judge.example/v2"},
                "args": {"judge_base_url": "https://judge.example/v2"},
            },
            {"id": "a/z", "args": {"judge_base_url": "https://undeclared.example/v1"}},
        ],
        "eval": {
            "env": [
                {
                    "id": "a/x",
                    "judge": {"deployment": "dep_1"},
                    "args": {"judge_base_url": "http://lab.example:8000/api/v1/openai/v1"},
                }
            ]
        },
    }
    assert judge_urls(spec) == ["https://judge.example/v1", "http://lab.example:8000/api/v1/openai/v1"]
    assert loopback_hosts(judge_urls(spec)) == {"judge.example": "127.77.0.1", "lab.example": "127.77.0.2"}
    assert loopback_hosts(["http://localhost:8000/v1", "http://127.0.0.1:8001/v1"]) == {}


def test_an_engine_whose_declared_judge_it_cannot_serve_exits_2_naming_why(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": "lab/tiny-random-llama", "max_steps": 1, "env": [{"id": "lab/addition"}]}))
    environment = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{REPO}:{REPO / 'sdk'}",
        "LAB_MODEL_DIR": str(tmp_path / "models"),
        egress.FORWARDS_VARIABLE: json.dumps({"https://api.openai.com:443": "/run/lab/egress/judge0.sock"}),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine",
            "run",
            "--offline",
            "--job-id",
            "job_1",
            "--attempt",
            "1",
            "--workdir",
            str(tmp_path / "work"),
            "--spec",
            str(spec),
        ],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    finish = json.loads((tmp_path / "work" / "finish.json").read_text())
    assert (finish["outcome"], finish["error"]["code"]) == ("failed", "invalid_spec")
    assert finish["error"]["message"].startswith(
        "the judge endpoint https://api.openai.com:443 cannot be reached from the local launcher's sandbox: its port is below 1024"
    )
