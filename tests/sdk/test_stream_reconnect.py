"""``lab.jobs.stream`` rides out a web server restart: the connection drops mid-stream, the port
refuses connections for a few seconds, then a new server answers, and the stream resumes after
the last event seen (``Last-Event-ID``) with nothing lost or repeated. It gave up after about
1.5 s (the client's ``max_retries`` of 2), while the README says it resumes by itself."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

import pytest
from labsdk import Lab
from labsdk.errors import APIConnectionError, NotFoundError

from tests.sdk.fake_lab import API_KEY
from tests.support import http_server

JOB = {"id": "job_1", "object": "job", "name": None, "status": "running", "status_reason": None,
       "queue_position": None, "spec": {}, "warnings": [], "attempt": 1, "step": 0, "max_steps": 3,
       "created_at": "2026-11-29T22:16:31Z", "started_at": None, "finished_at": None, "error": None,
       "usage": {"gpu_seconds": 0, "cpu_seconds": 0, "cost_usd": "0.00"}, "latest_checkpoint": None, "metadata": {}}
EVENTS = [
    (1, "metrics", {"step": 1, "time": "2026-11-29T22:30:00Z", "attempt": 1, "values": {"reward/mean": 0.25}}),
    (2, "metrics", {"step": 2, "time": "2026-11-29T22:30:01Z", "attempt": 1, "values": {"reward/mean": 0.5}}),
    (3, "metrics", {"step": 3, "time": "2026-11-29T22:30:02Z", "attempt": 1, "values": {"reward/mean": 0.75}}),
    (4, "status", {**JOB, "status": "succeeded", "step": 3}),
]
#: How long the port refuses connections between the two servers, in seconds.
DOWNTIME_S = 6.0


def sse(event_id: int | None, event: str, data: dict) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class StreamServer:
    """A job's stream on ``port``: the first server sends the snapshot and events 1-2, then
    drops the connection mid-stream (a chunked body that never ends) and closes its socket; the
    second sends the snapshot and every event after ``Last-Event-ID``, then ends."""

    def __init__(self, port: int, *, drop: bool):
        self.drop = drop
        self.seen: list[str | None] = []
        self.dropped = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                last = self.headers.get("Last-Event-ID")
                owner.seen.append(last)
                assert self.headers["Authorization"] == f"Bearer {API_KEY}"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events = [sse(None, "status", JOB)]
                events += [sse(*event) for event in EVENTS if last is None or event[0] > int(last)]
                if owner.drop:
                    events = events[:3]  # the snapshot, 1 and 2
                for chunk in events:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                if owner.drop:
                    self.connection.shutdown(socket.SHUT_RDWR)  # no last chunk: the connection drops
                    self.close_connection = True
                    owner.dropped.set()
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)

    def __enter__(self) -> Self:
        http_server.start(self.server)
        return self

    def __exit__(self, *exc_info: object) -> None:
        http_server.stop(self.server)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_stream_resumes_after_the_server_goes_away_and_comes_back():
    port = free_port()
    second: list[StreamServer] = []

    def restart(first: StreamServer) -> None:
        first.dropped.wait(timeout=20)
        first.__exit__()  # the port refuses connections from here
        time.sleep(DOWNTIME_S)
        server = StreamServer(port, drop=False)
        second.append(server)
        server.__enter__()

    first = StreamServer(port, drop=True)
    first.__enter__()
    restarter = threading.Thread(target=restart, args=(first,))
    restarter.start()
    started = time.monotonic()
    try:
        with Lab(api_key=API_KEY, base_url=f"http://127.0.0.1:{port}", timeout=5) as lab:
            events = [(event.event, event.id) for event in lab.jobs.stream("job_1")]
    finally:
        restarter.join()
        for server in second:
            server.__exit__()

    assert events == [
        ("status", None), ("metrics", "1"), ("metrics", "2"),  # the first server, then it went away
        ("status", None), ("metrics", "3"), ("status", "4"),  # the second, after Last-Event-ID 2
    ]
    assert first.seen == [None]
    assert second[0].seen == ["2"]
    assert time.monotonic() - started >= DOWNTIME_S


def test_a_stream_gives_up_once_its_reconnection_time_is_spent():
    port = free_port()  # nothing listens: every connection is refused
    started = time.monotonic()

    with (
        Lab(api_key=API_KEY, base_url=f"http://127.0.0.1:{port}", stream_reconnect_s=2.0) as lab,
        pytest.raises(APIConnectionError, match="could not reach Lab"),
    ):
        list(lab.jobs.stream("job_1"))

    assert 2.0 <= time.monotonic() - started < 6.0


def test_a_stream_rides_out_a_proxy_answering_503_while_lab_restarts(fake_lab, lab_client, sleeps):
    job = fake_lab.add_job(status="succeeded")
    unavailable = (503, {}, {"error": {"type": "api_error", "code": "unavailable", "message": "restarting",
                                       "param": None, "errors": []}})
    fake_lab.fail_next = [unavailable] * 7  # more than the client's 2 retries of one request, twice over

    events = list(lab_client.jobs.stream(job["id"]))

    assert [(event.event, event.data.status) for event in events] == [("status", "succeeded")]
    assert len([r for r in fake_lab.requests if r.path.endswith("/stream")]) == 8


def test_a_refusal_is_not_retried(fake_lab, lab_client, sleeps):
    with pytest.raises(NotFoundError):
        list(lab_client.jobs.stream("job_missing"))

    assert len([r for r in fake_lab.requests if r.path.endswith("/stream")]) == 1
    assert sleeps == []
