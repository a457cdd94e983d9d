"""Fixtures for the engine's tests: a fake Lab ingest server on 127.0.0.1 and spec files."""

from __future__ import annotations

import json
import pathlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support import http_server

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclass
class FakeLab:
    """A real HTTP server speaking the ingest API (docs/ingest-api.md), storing what it accepts.

    `refuse_next` answers that many requests with 503 first (Lab down); metric points are
    stored per step exactly as Lab does: a resend merges, so `metric_posts` counts arrivals.
    """

    url: str = ""
    token: str = "job-token"
    refuse_next: int = 0
    refused: int = 0
    action: str = "continue"
    metric_arrivals: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    samples: list = field(default_factory=list)
    logs: dict = field(default_factory=dict)
    statuses: list = field(default_factory=list)
    checkpoints: dict = field(default_factory=dict)
    finish: list = field(default_factory=list)
    storage: pathlib.Path | None = None
    #: What ``GET checkpoints/{id}/download`` answers per id: (the bytes, the SHA-256 announced in
    #: ``X-Lab-Archive-SHA256``).
    downloads: dict = field(default_factory=dict)
    #: Requests whose action starts with one of these answer 503 for as long as it is set.
    down_for: tuple = ()
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, path: str, body: dict, token: str) -> tuple[int, dict]:
        if token != self.token:
            return 401, {"error": {"type": "invalid_request", "code": "invalid_token", "message": "bad token"}}
        with self.lock:
            if self.refuse_next > 0:
                self.refuse_next -= 1
                self.refused += 1
                return 503, {"error": {"type": "api_error", "code": "unavailable", "message": "down"}}
            prefix = "/api/v1/ingest/jobs/job_1/"
            if not path.startswith(prefix):
                return 404, {"error": {"type": "invalid_request", "code": "not_found", "message": path}}
            action = path[len(prefix):]
            if self.down_for and action.startswith(self.down_for):
                self.refused += 1
                return 503, {"error": {"type": "api_error", "code": "unavailable", "message": "down"}}
            if action == "status":
                self.statuses.append(body)
                return 200, {"action": self.action}
            if action == "metrics":
                duplicates = 0
                for point in body["points"]:
                    self.metric_arrivals[point["step"]] = self.metric_arrivals.get(point["step"], 0) + 1
                    if point["step"] in self.metrics:
                        duplicates += 1
                    self.metrics.setdefault(point["step"], point["values"])
                return 200, {"accepted": len(body["points"]) - duplicates, "duplicates": duplicates, "superseded": 0}
            if action == "samples":
                self.samples.extend(body["samples"])
                return 200, {"accepted": len(body["samples"])}
            if action == "logs":
                for line in body["lines"]:
                    self.logs[(body["attempt"], line["seq"])] = line["line"]
                return 200, {"accepted": len(body["lines"])}
            if action == "checkpoints":
                checkpoint_id = f"ckpt_{len(self.checkpoints) + 1}"
                path = self.storage / f"{checkpoint_id}.tar"
                self.checkpoints[checkpoint_id] = {**body, "status": "pending", "path": path}
                return 201, {"id": checkpoint_id, "upload": {"method": "local", "path": str(path)}}
            if action.startswith("checkpoints/") and action.endswith("/complete"):
                checkpoint = self.checkpoints[action.split("/")[1]]
                import hashlib

                data = checkpoint["path"].read_bytes() if checkpoint["path"].exists() else b""
                ok = hashlib.sha256(data).hexdigest() == body["sha256"] and len(data) == body["size_bytes"]
                checkpoint["status"] = "ready" if ok else "failed"
                return 200, {"status": checkpoint["status"]}
            if action == "finish":
                self.finish.append(body)
                return 200, {}
            return 404, {"error": {"type": "invalid_request", "code": "not_found", "message": path}}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Run in-process engine code on one torch thread, as the engine's CLI does on 2 cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fake_lab(tmp_path):
    """Start a FakeLab on a free port of 127.0.0.1 for one test."""
    lab = FakeLab(storage=tmp_path / "lab-storage")
    lab.storage.mkdir()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            status, answer = lab.handle(self.path, body, token)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            name = self.path.removeprefix("/api/v1/ingest/jobs/job_1/checkpoints/").removesuffix("/download")
            if name not in lab.downloads or (self.headers.get("Authorization") or "") != f"Bearer {lab.token}":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data, sha256 = lab.downloads[name]
            self.send_response(200)
            self.send_header("Content-Type", "application/x-tar")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Lab-Archive-SHA256", sha256)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    http_server.start(server)
    lab.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield lab
    http_server.stop(server)


def tiny_spec(**overrides) -> dict:
    """Return a small spec for the tiny model (reverse-text gives partial rewards, so it trains);
    ``overrides`` replace top-level keys."""
    spec = {
        "model": "lab/tiny-random-llama",
        "max_steps": 3,
        "batch_size": 8,
        "rollouts_per_example": 4,
        "learning_rate": 1e-2,
        "lora_rank": 4,
        "lora_alpha": 8,
        "seed": 0,
        "sampling": {"max_tokens": 6, "temperature": 1.0},
        "env": [{"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 4}}],
        "checkpoints": {"interval": 2, "keep_last": 2},
        "eval": {"interval": 0, "num_examples": 4},
    }
    spec.update(overrides)
    return spec


def write_spec(path: pathlib.Path, **overrides) -> pathlib.Path:
    """Write :func:`tiny_spec` with ``overrides`` as a JSON spec file."""
    path.write_text(json.dumps(tiny_spec(**overrides)))
    return path


def engine_config(spec: dict, **engine_settings):
    """Return an EngineConfig for ``spec`` (validated by labsdk.spec) and engine settings."""
    from labsdk.spec import parse_spec

    from engine.config import EngineConfig

    return EngineConfig(spec=parse_spec(spec).spec, **engine_settings)


def wait_for_first_step(process, workdir: pathlib.Path, timeout: float = 300.0) -> None:
    """Wait until an offline engine `process` has written a metric point to `workdir`, or exited."""
    import time

    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and metrics.read_text().strip()) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.5)
