"""A small stand-in for Lab's REST API on a real local HTTP server, for SDK and CLI tests.

It speaks docs/api.md's shapes (list envelope, error body, Idempotency-Key replay) over a
real socket, so the SDK's HTTP layer, retries and parsing run for real. Tests steer it:
``fail_next`` queues error answers, ``drop_next`` processes requests but closes the
connection instead of answering (a lost answer), ``timelines`` script how a job moves on
each read.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from labsdk.spec import SpecError, parse_spec

API_KEY = "lab_test_key"
MODELS = [
    {"id": "lab/tiny-random-llama", "context_length": 512, "parameters": None,
     "description": "tiny", "source": "builtin"},
    {"id": "HuggingFaceTB/SmolLM2-135M-Instruct", "context_length": 8192, "parameters": 134515008,
     "description": "SmolLM2", "source": "builtin", "quantized_source": "gguf"},
]
ENVIRONMENTS = [
    {"id": "lab/addition", "name": "addition", "description": "Add integers.",
     "args": {"min_operand": 0, "max_operand": 20, "num_operands": 2}},
]
PRICES = [{"resource_type": "cpu", "usd_per_hour": "0.10"}, {"resource_type": "H100", "usd_per_hour": "2.50"}]


def error_body(status: int, code: str, message: str, errors: list[dict] | None = None) -> dict:
    errors = errors or []
    return {"error": {"type": "invalid_request_error" if status < 500 else "api_error", "code": code,
                      "message": message, "param": errors[0]["param"] if errors else None, "errors": errors}}


@dataclass
class Recorded:
    """One request as the fake saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeLab:
    """The fake's state; ``url`` is set once the server listens."""

    url: str = ""
    jobs: dict[str, dict] = field(default_factory=dict)
    events: dict[str, list[dict]] = field(default_factory=dict)
    metrics: dict[str, list[dict]] = field(default_factory=dict)
    timelines: dict[str, list[dict]] = field(default_factory=dict)
    logs: dict[str, list[dict]] = field(default_factory=dict)
    samples: dict[str, list[dict]] = field(default_factory=dict)
    checkpoints: dict[str, list[dict]] = field(default_factory=dict)
    archives: dict[str, bytes] = field(default_factory=dict)
    #: The SHA-256 a download answer announces per checkpoint id (``X-Lab-Archive-SHA256``), if any.
    digests: dict[str, str] = field(default_factory=dict)
    redirect_downloads: bool = False
    truncate_downloads: bool = False
    streams: dict[str, list[dict]] = field(default_factory=dict)
    cut_next_stream_after: int | None = None
    idempotency: dict[str, tuple[str, int, dict]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    secrets: list[dict] = field(default_factory=list)  # the secrets of each create or estimate body
    balance: dict | None = None  # GET /billing/balance
    webhook_endpoints: dict[str, dict] = field(default_factory=dict)
    webhook_deliveries: dict[str, list[dict]] = field(default_factory=dict)
    #: Refuse loopback webhook URLs as Lab does without LAB_WEBHOOK_ALLOW_PRIVATE=1.
    refuse_private_urls: bool = True
    fail_next: list[tuple[int, dict, Any]] = field(default_factory=list)
    drop_next: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def add_job(self, **fields: Any) -> dict:
        """Store a job directly (as if created earlier) and return it."""
        number = next(self._ids)
        job = {
            "id": f"job_{number:04d}", "object": "job", "name": None, "status": "queued",
            "status_reason": "waiting", "queue_position": 1, "spec": {}, "warnings": [], "attempt": 1,
            "step": 0, "max_steps": 20, "created_at": f"2026-11-29T22:{number % 60:02d}:00Z",
            "started_at": None, "finished_at": None, "error": None,
            "usage": {"gpu_seconds": 0, "cpu_seconds": 0, "cost_usd": "0.00"},
            "latest_checkpoint": None, "metadata": {},
        }
        job.update(fields)
        self.jobs[job["id"]] = job
        self.events[job["id"]] = [{"id": f"evt_{number:04d}_1", "created_at": job["created_at"], "level": "info",
                                   "type": "job.queued", "message": "Job queued.", "data": {}}]
        for store in (self.metrics, self.logs, self.samples, self.checkpoints):
            store.setdefault(job["id"], [])
        return job

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, dict, Any]:
        """Answer one authenticated request: (status, headers, JSON body)."""
        parts = [unquote(part) for part in path.strip("/").split("/")][2:]  # drop "api", "v1"
        one = {key: values[0] for key, values in query.items()}
        if method == "GET" and parts == ["whoami"]:
            return 200, {}, {"organization": {"id": "org_1", "slug": "acme", "name": "Acme"},
                             "project": {"id": "prj_1", "slug": "default", "name": "Default"},
                             "scopes": ["read", "write"]}
        if method == "GET" and parts == ["models"]:
            return 200, {}, {"object": "list", "data": MODELS, "has_more": False}
        if method == "GET" and parts == ["environments"]:
            return 200, {}, {"object": "list", "data": ENVIRONMENTS, "has_more": False}
        if method == "GET" and parts == ["prices"]:
            return 200, {}, {"object": "list", "data": PRICES, "has_more": False}
        if method == "POST" and parts in (["jobs"], ["jobs", "estimate"]):
            if isinstance(body, dict) and "secrets" in body:  # beside the spec, as Lab takes them
                body = dict(body)
                self.secrets.append(body.pop("secrets"))
            try:
                parsed = parse_spec(body)
            except SpecError as exc:
                return 400, {}, error_body(400, "invalid_spec", exc.errors[0].message,
                                           [problem.to_dict() for problem in exc.errors])
            if parts == ["jobs", "estimate"]:
                return 200, {}, {"gpu_seconds": 0, "cpu_seconds": 120.0, "cost_usd": "0.01", "queue_position": 0,
                                 "can_start_now": True, "reason": None, "warnings": parsed.warnings}
            spec = parsed.to_dict()
            job = self.add_job(name=spec["name"], spec=spec, warnings=parsed.warnings,
                               max_steps=spec["max_steps"], metadata=spec["metadata"])
            return 201, {}, job
        if method == "GET" and len(parts) == 3 and parts[0] == "checkpoints" and parts[2] == "download":
            if parts[1] not in self.archives:
                return 404, {}, error_body(404, "not_found", "No such checkpoint.")
            digest = {"X-Lab-Archive-SHA256": self.digests[parts[1]]} if parts[1] in self.digests else {}
            if self.redirect_downloads:
                return 302, {"Location": f"/signed/{parts[1]}?signature=abc", **digest}, None
            return 200, {"Content-Type": "application/x-tar", **digest}, self.archives[parts[1]]
        if method == "GET" and parts == ["jobs"]:
            return 200, {}, self._page(self._filtered_jobs(query), one, "id")
        if method == "GET" and parts == ["billing", "balance"] and self.balance is not None:
            return 200, {}, self.balance
        if parts and parts[0] == "webhook-endpoints":
            return self._webhooks(method, parts[1:], one, body)
        if len(parts) >= 2 and parts[0] == "jobs":
            job = self.jobs.get(parts[1])
            if job is None:
                return 404, {}, error_body(404, "not_found", "No such job.")
            rest = parts[2:]
            if method == "GET" and rest == []:
                if self.timelines.get(job["id"]):
                    self._advance(job, self.timelines[job["id"]].pop(0))
                return 200, {}, job
            if method == "POST" and rest == ["cancel"]:
                if job["status"] in ("succeeded", "failed", "cancelled"):
                    return 409, {}, error_body(409, "invalid_state", f"Job is already {job['status']}.")
                job["status"] = "cancelled" if job["status"] == "queued" else "cancelling"
                return 200, {}, job
            if method == "POST" and rest == ["restart"]:
                if job["status"] not in ("failed", "cancelled"):
                    return 409, {}, error_body(409, "invalid_state", f"Job is {job['status']}.")
                job.update(status="queued", status_reason="waiting", error=None)  # the attempt counts at start
                return 200, {}, job
            if method == "DELETE" and rest == []:
                if job["status"] not in ("succeeded", "failed", "cancelled"):
                    return 409, {}, error_body(409, "invalid_state", f"Job is {job['status']}.")
                del self.jobs[job["id"]]
                return 204, {}, None
            if method == "GET" and rest == ["logs"]:
                return 200, {}, self._page(self.logs[job["id"]], one, "seq")
            if method == "GET" and rest == ["samples"]:
                stored = self.samples[job["id"]]
                step = int(one["step"]) if "step" in one else max((s["step"] for s in stored), default=0)
                samples = [s for s in stored if s["step"] == step]  # default: the latest step, as Lab
                return 200, {}, self._page(samples, one, "step")
            if method == "GET" and rest == ["checkpoints"]:
                return 200, {}, self._page(self.checkpoints[job["id"]], one, "id")
            if method == "GET" and rest == ["events"]:
                return 200, {}, self._page(self.events[job["id"]], one, "id")
            if method == "GET" and rest == ["metrics"]:
                points = self.metrics[job["id"]]
                if "after_step" in one:
                    points = [p for p in points if p["step"] > int(one["after_step"])]
                if "names" in one:
                    names = one["names"].split(",")
                    points = [{**p, "values": {k: v for k, v in p["values"].items() if k in names}} for p in points]
                return 200, {}, self._page(points, {"limit": one.get("limit", "100")}, "step")
        return 404, {}, error_body(404, "not_found", f"No route {method} {path}.")

    def _webhooks(self, method: str, rest: list[str], one: dict[str, str], body: Any) -> tuple[int, dict, Any]:
        """The webhook endpoint API (jobs/webhooks/views.py), with a loopback URL refused unless
        ``refuse_private_urls`` is off."""
        if rest == [] and method == "GET":
            return 200, {}, self._page(list(reversed(self.webhook_endpoints.values())), one, "id")
        if rest == [] and method == "POST":
            url = body.get("url", "")
            if self.refuse_private_urls and "127.0.0.1" in url:
                message = "127.0.0.1 resolves to a private or loopback address (127.0.0.1)."
                return 400, {}, error_body(400, "invalid_request", message,
                                           [{"param": "url", "code": "private_address", "message": message}])
            number = next(self._ids)
            endpoint = {"id": f"whep_{number:04d}", "object": "webhook_endpoint", "url": url,
                        "events": body.get("events") or ["job.queued", "job.succeeded"], "enabled": True,
                        "created_at": f"2026-11-29T22:{number % 60:02d}:00Z"}
            self.webhook_endpoints[endpoint["id"]] = endpoint
            self.webhook_deliveries[endpoint["id"]] = []
            return 201, {}, {**endpoint, "secret": f"whsec_secret{number}"}
        endpoint = self.webhook_endpoints.get(rest[0])
        if endpoint is None:
            return 404, {}, error_body(404, "not_found", "No such webhook endpoint.")
        if rest[1:] == [] and method == "GET":
            return 200, {}, endpoint
        if rest[1:] == [] and method == "DELETE":
            del self.webhook_endpoints[rest[0]]
            return 204, {}, None
        if rest[1:] == ["rotate-secret"] and method == "POST":
            return 200, {}, {**endpoint, "secret": "whsec_rotated"}
        if rest[1:] == ["test"] and method == "POST":
            number = next(self._ids)
            delivery = {"id": f"msg_{number:04d}", "object": "webhook_delivery", "endpoint_id": endpoint["id"],
                        "event_id": f"evt_{number:04d}", "event_type": "webhook.test", "status": "pending",
                        "attempt_count": 0, "created_at": "2026-11-29T22:40:00Z", "attempts": []}
            self.webhook_deliveries[endpoint["id"]].insert(0, delivery)
            return 202, {}, delivery
        if rest[1:] == ["deliveries"] and method == "GET":
            found = [d for d in self.webhook_deliveries[endpoint["id"]] if one.get("status") in (None, d["status"])]
            return 200, {}, self._page(found, one, "id")
        return 404, {}, error_body(404, "not_found", f"No route {method} webhook-endpoints/{'/'.join(rest)}.")

    def _filtered_jobs(self, query: dict[str, list[str]]) -> list[dict]:
        jobs = list(reversed(self.jobs.values()))
        if "status" in query:
            jobs = [job for job in jobs if job["status"] == query["status"][0]]
        for key, values in query.items():
            if key.startswith("metadata[") and key.endswith("]"):
                jobs = [job for job in jobs if job["metadata"].get(key[9:-1]) == values[0]]
        return jobs

    @staticmethod
    def _page(items: list[dict], params: dict[str, str], key: str) -> dict:
        limit = int(params.get("limit", "20"))
        if params.get("after"):
            position = next(i for i, item in enumerate(items) if str(item[key]) == params["after"])
            items = items[position + 1:]
        return {"object": "list", "data": items[:limit], "has_more": len(items) > limit}

    def _advance(self, job: dict, change: dict) -> None:
        reward = change.pop("reward", None)
        job.update(change)
        if reward is not None:
            self.metrics[job["id"]].append({"step": job["step"], "time": "2026-11-29T22:30:00Z", "attempt": 1,
                                            "values": {"reward/mean": reward, "loss/mean": 0.5}})

    def count(self, method: str, path: str) -> int:
        """How many requests reached ``method path`` (retries included)."""
        return sum(1 for r in self.requests if r.method == method and r.path == path)


def _handler_for(state: FakeLab) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            split = urlsplit(self.path)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {key.lower(): value for key, value in self.headers.items()}
            query = parse_qs(split.query)
            with state.lock:
                state.requests.append(Recorded(self.command, split.path, query, headers, raw))
                answer = self._answer(split.path, query, headers, raw)
                drop = state.drop_next > 0
                state.drop_next -= int(drop)
            if drop:
                self.close_connection = True
                return
            status, extra_headers, body = answer
            if isinstance(body, bytes):
                payload = body
            else:
                payload = json.dumps(body).encode() if body is not None else b""
                extra_headers = {"Content-Type": "application/json", **extra_headers}
            declared = len(payload)
            if isinstance(body, bytes) and (state.truncate_downloads or extra_headers.pop("X-Fake-Cut", None)):
                declared += 10  # promise more than is sent, then hang up
                self.close_connection = True
            self.send_response(status)
            self.send_header("Content-Length", str(declared))
            for name, value in extra_headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def _answer(self, path: str, query: dict, headers: dict, raw: bytes) -> tuple[int, dict, Any]:
            if state.fail_next:
                return state.fail_next.pop(0)
            if path.startswith("/signed/"):
                # A storage host: it must never see Lab's credentials.
                if "authorization" in headers:
                    return 403, {}, error_body(403, "insufficient_scope", "Credentials sent to storage.")
                return 200, {"Content-Type": "application/x-tar"}, state.archives[path.split("/")[2]]
            if headers.get("authorization") != f"Bearer {API_KEY}":
                return 401, {}, error_body(401, "invalid_api_key", "Invalid API key.")
            if self.command == "GET" and path.endswith("/stream"):
                return self._stream(path.split("/")[-2], query, headers)
            key = headers.get("idempotency-key")
            digest = hashlib.sha256(raw).hexdigest()
            if self.command == "POST" and key in state.idempotency:
                seen_digest, status, body = state.idempotency[key]
                if seen_digest != digest:
                    return 409, {}, error_body(409, "idempotency_conflict", "Key reused with another body.")
                return status, {"Idempotent-Replayed": "true"}, body
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                return 400, {}, error_body(400, "invalid_request", "Malformed JSON.")
            status, extra, answer = state.route(self.command, path, query, body)
            if self.command == "POST" and key and status < 500:
                state.idempotency[key] = (digest, status, answer)
            return status, extra, answer

        def _stream(self, job_id: str, query: dict, headers: dict) -> tuple[int, dict, Any]:
            """Answer a job's event stream: a snapshot, then the events after Last-Event-ID."""
            job = state.jobs.get(job_id)
            if job is None:
                return 404, {}, error_body(404, "not_found", "No such job.")
            last = headers.get("last-event-id")
            events = [e for e in state.streams.get(job_id, []) if last is None or e["id"] > int(last)]
            if query.get("from") == ["now"]:
                events = []
            extra = {"Content-Type": "text/event-stream"}
            if state.cut_next_stream_after is not None:
                events = events[: state.cut_next_stream_after]
                state.cut_next_stream_after = None
                extra["X-Fake-Cut"] = "1"
            text = f"event: status\ndata: {json.dumps(job)}\n\n: keep-alive\n\n"
            for event in events:
                text += f"id: {event['id']}\nevent: {event['event']}\ndata: {json.dumps(event['data'])}\n\n"
            return 200, extra, text.encode()

        do_GET = do_POST = do_DELETE = _serve

    return Handler


class FakeLabServer:
    """Run a :class:`FakeLab` on 127.0.0.1 in a background thread (a context manager)."""

    def __init__(self) -> None:
        self.state = FakeLab()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self.state))
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.state.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeLab:
        self._thread.start()
        return self.state

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
