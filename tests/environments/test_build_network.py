"""A build step that runs a package's code and must reach an endpoint (environments/builder/
network.py): its own network namespace behind lab.lib.egress's firewall, reaching the endpoint it
was given (here a local stand-in, at slirp4netns's gateway) and nothing of the host's: not
PostgreSQL, Redis or any other port of the host's loopback, not its own address, not the metadata
address. Real bubblewrap, slirp4netns and nftables; the builder runs as root here."""

from __future__ import annotations

import http.server
import json
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from environments.builder import network
from environments.builder.sandbox import sandbox_command
from environments.builder.steps import BuildFailed
from lab.lib import egress

PROBE = r'''
import json, socket, sys, urllib.request
def tcp(host, port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        return "open"
    except OSError as error:
        return type(error).__name__
targets = json.loads(sys.argv[2])
answer = {f"{host}:{port}": tcp(host, port) for host, port in targets}
answer["fetched"] = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
print(json.dumps(answer))
'''


@pytest.fixture
def endpoint():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"the index")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/simple/"
    server.shutdown()


def run_probe(tmp_path: Path, url: str, reach: network.Reach, targets: list) -> subprocess.CompletedProcess:
    (tmp_path / "probe.py").write_text(PROBE)
    sandbox = sandbox_command([Path(sys.base_prefix), Path(sys.prefix)], tmp_path)
    command = [sys.executable, "-I", str(tmp_path / "probe.py"), url, json.dumps(targets)]
    return network.run_in_namespace(sandbox, command, reach_=reach, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)


def test_a_step_reaches_its_endpoint_and_nothing_of_the_hosts(tmp_path, endpoint):
    assert network.available() is None, network.available()
    reach = network.reach([endpoint])
    port = int(endpoint.split(":")[2].split("/")[0])
    assert reach.host_loopback and reach.allow == ((egress.GATEWAY, port),)
    assert reach.urls[endpoint] == f"http://{egress.GATEWAY}:{port}/simple/"
    host = egress.host_addresses()
    targets = [["127.0.0.1", 5432], ["127.0.0.1", 6379], [egress.GATEWAY, 5432], [egress.GATEWAY, 6379],
               ["169.254.169.254", 80], *[[address, 5432] for address in host if address != "127.0.0.1"]]
    result = run_probe(tmp_path, reach.urls[endpoint], reach, targets)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer.pop("fetched") == "the index"
    assert answer and all(outcome != "open" for outcome in answer.values()), answer


def test_without_its_endpoint_allowed_the_step_reaches_nothing_at_all(tmp_path, endpoint):
    rewritten = network.reach([endpoint]).urls[endpoint]
    result = run_probe(tmp_path, rewritten, network.Reach(), [])
    assert result.returncode != 0
    assert "URLError" in result.stderr or "refused" in result.stderr.lower()


def test_a_step_that_outlives_its_time_is_killed_with_everything_it_started(tmp_path):
    sandbox = sandbox_command([Path(sys.base_prefix), Path(sys.prefix)], tmp_path)
    sleep = f"sleep 300.{secrets.randbelow(10**6):06d}"  # no other process on the machine runs this one
    with pytest.raises(BuildFailed, match="took longer than 2 s"):
        network.run_in_namespace(sandbox, ["/bin/sh", "-c", f"{sleep} & {sleep}"], reach_=network.Reach(), timeout=2,
                                 env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    leftover = subprocess.run(["pgrep", "-f", sleep], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""
