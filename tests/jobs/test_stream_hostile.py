"""The live stream ``GET /api/v1/jobs/{id}/stream`` under hostile or careless use.

Foreign and malformed ids, junk resume points, odd methods, clients that drop mid-stream or never
read, Redis going away under live clients, a job deleted or restarted while followed, and
concurrent ingest. A real uvicorn serves the stream (see tests/jobs/test_stream.py).
"""

from __future__ import annotations

import itertools
import socket
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings

from jobs.models import Job
from tests.support.stream import Reader, _web, auth, finish, running_job, stream_url

pytestmark = [pytest.mark.usefixtures("no_broker"), pytest.mark.django_db(transaction=True), pytest.mark.e2e]


def raw_request(stack, target: bytes, headers: list[bytes] = (), method: bytes = b"GET") -> tuple[int, bytes]:
    """Send one hand-written HTTP/1.1 request (bytes an HTTP client would refuse to send);
    return the status code and the first bytes of the answer."""
    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        lines = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close", *headers]
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        try:
            while len(answer) < 4096:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            pass
    return int(answer.split(b" ", 2)[1]), answer


def _error(response: httpx.Response) -> tuple[int, dict]:
    return response.status_code, response.json()["error"]


def test_a_last_event_id_too_long_for_a_number_is_a_400_not_a_server_error(owner, spec, web):
    job, _ = running_job(owner, spec, web)
    url = stream_url(web, job)
    for raw in ("9" * 5000, "0" * 5000 + "1", "1" * 100_00):
        code, error = _error(httpx.get(url, headers={**auth(owner.key), "Last-Event-ID": raw}, timeout=10))
        assert (code, error["param"]) == (400, "last_event_id"), raw[:10]
        code, error = _error(httpx.get(url, headers=auth(owner.key), params={"last_event_id": raw}, timeout=10))
        assert (code, error["param"]) == (400, "last_event_id"), raw[:10]
    # A zero-padded id of an ordinary length is still that id.
    finish(job)
    resumed = Reader(url, {**auth(owner.key), "Last-Event-ID": "000"}).read()
    assert resumed.status_code == 200 and resumed.closed_by_server and resumed.numbered()[0].id == "1"


def test_foreign_and_odd_job_ids_are_the_same_404_as_a_missing_job(owner, outsider, spec, web, client):
    job, _ = running_job(owner, spec, web)
    missing = httpx.get(f"{web.base_url}/api/v1/jobs/job_doesnotexist/stream", headers=auth(owner.key), timeout=10)
    assert missing.status_code == 404
    foreign = httpx.get(stream_url(web, job), headers=auth(outsider.key), timeout=10)
    assert (foreign.status_code, foreign.json()) == (404, missing.json())
    client.force_login(outsider.user)
    cookie = {
        "Cookie": f"{django_settings.SESSION_COOKIE_NAME}={client.cookies[django_settings.SESSION_COOKIE_NAME].value}"
    }
    by_session = httpx.get(stream_url(web, job), headers=cookie, timeout=10)
    assert (by_session.status_code, by_session.json()) == (404, missing.json())
    # The job's numeric primary key, another spelling of its id, or unicode junk: never found.
    for odd in (str(job.pk), job.public_id.upper(), f" {job.public_id}", "job_%C3%A9%E2%98%83", "%ff%fe", "job_%0a"):
        response = httpx.get(f"{web.base_url}/api/v1/jobs/{odd}/stream", headers=auth(owner.key), timeout=10)
        assert response.status_code in (400, 404), odd
        assert response.status_code != 404 or response.json() == missing.json(), odd
    with_nul = raw_request(web, b"/api/v1/jobs/job_%00x/stream", [b"Authorization: Bearer " + owner.key.encode()])
    assert with_nul[0] == 400


def test_methods_other_than_get_are_405_in_the_api_error_shape(owner, spec, web):
    job, _ = running_job(owner, spec, web)
    for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
        response = httpx.request(method, stream_url(web, job), headers=auth(owner.key), timeout=10)
        assert response.status_code == 405, method
        assert response.headers["Allow"] == "GET" and response.json()["error"]["code"] == "method_not_allowed"
    head = httpx.head(stream_url(web, job), headers=auth(owner.key), timeout=10)
    assert head.status_code == 405


def test_junk_resume_points_and_from_values_are_400s(owner, spec, web):
    job, _ = running_job(owner, spec, web)
    bearer = b"Authorization: Bearer " + owner.key.encode()
    path = f"/api/v1/jobs/{job.public_id}/stream".encode()
    for header in (
        "Last-Event-ID: ١٢".encode(),
        b"Last-Event-ID: \xff\xfe",
        b"Last-Event-ID: +5",
        b"Last-Event-ID: 1e3",
    ):
        code, body = raw_request(web, path, [bearer, header])
        assert code == 400 and b'"last_event_id"' in body, header
    for query in (b"?from=", b"?from=%00", b"?from=NOW", b"?last_event_id=%00", b"?last_event_id=%EF%BC%91"):
        code, _ = raw_request(web, path + query, [bearer])
        assert code == 400, query


def test_a_long_history_is_sent_a_page_at_a_time_not_read_whole_first(owner, spec, settings, monkeypatch):
    """Replaying a job of thousands of records must not hold the whole history in memory
    before the first byte goes out: each page read from the database is sent before the next."""
    import asyncio
    from datetime import UTC, datetime

    from jobs.services import job_submit, store_log_lines
    from jobs.stream import views
    from lab.audit import Actor

    settings.REDIS_URL = ""
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    now = datetime.now(UTC)
    store_log_lines(
        job=job, attempt_number=1, source="engine", lines=[(n, now, "stdout", f"l{n}") for n in range(1200)]
    )
    reads = []
    real = views._catch_up_async

    async def counting(job_pk, after):
        reads.append(after)
        return await real(job_pk, after)

    monkeypatch.setattr(views, "_catch_up_async", counting)

    async def first_frames(count):
        stream = views._events(job.pk, job.public_id, None)
        try:
            return [await anext(stream) for _ in range(count)]
        finally:
            await stream.aclose()

    frames = asyncio.run(first_frames(2))
    assert frames[0].startswith("event: status") and frames[1].startswith("id: ")
    assert len(reads) == 1, f"{len(reads)} pages were read before the first record went out"


def _ids(reader: Reader) -> list[int]:
    return [int(frame.id) for frame in reader.numbered()]


def _strictly_increasing(ids: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(ids))


def test_a_job_that_fails_and_is_restarted_resumes_and_replays_exactly(owner, spec, web):
    from jobs.models import JobStatus
    from jobs.services import job_claim_for_start, job_restart, job_transition
    from lab.audit import Actor
    from tests.support.stream import Engine

    job, engine = running_job(owner, spec, web)
    url = stream_url(web, job)
    live = Reader(url, auth(owner.key)).start(timeout=60)
    engine.metrics(*range(1, 601))  # more than one page of the replay
    engine.logs((1, "first attempt"))
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.FAILED, error_code="oom", error_message="boom")
    live.join()  # the stream ends after the failed status
    assert live.closed_by_server and live.frames[-1].data["status"] == "failed"
    # A client that comes back now is told the job failed and is closed again at once.
    again = Reader(url, {**auth(owner.key), "Last-Event-ID": live.numbered()[-1].id}).read(timeout=10)
    assert again.closed_by_server and again.numbered() == [] and again.frames[0].data["status"] == "failed"

    job_restart(job=Job.objects.unscoped().get(pk=job.pk), actor=Actor(user=owner.user))
    job_claim_for_start(job_id=job.pk)
    engine = Engine(web, Job.objects.unscoped().get(pk=job.pk))
    engine.post("status", {"phase": "running", "step": 0})
    engine.metrics(599, 600, 601, 602)  # 599 and 600 supersede the first attempt's points
    engine.logs((1, "second attempt"))
    finish(job)

    resumed = Reader(url, {**auth(owner.key), "Last-Event-ID": live.numbered()[-1].id}).read()
    assert resumed.closed_by_server and resumed.frames[-1].data["status"] == "succeeded"
    seen = _ids(live) + _ids(resumed)
    assert _strictly_increasing(seen)
    statuses = [f.data["status"] for f in resumed.frames[1:] if f.event == "status"]
    assert statuses == ["queued", "starting", "running", "succeeded"]
    assert [f.data["step"] for f in resumed.frames if f.event == "metrics"] == [599, 600, 601, 602]
    assert [f.data["attempt"] for f in resumed.frames if f.event == "metrics"] == [2, 2, 2, 2]

    # The whole replay runs past the first attempt's terminal status to the end, and a resume
    # from any point of it is exactly the rest of it.
    full = Reader(url, auth(owner.key)).read()
    assert full.closed_by_server and _strictly_increasing(_ids(full))
    replay_statuses = [f.data["status"] for f in full.frames[1:] if f.event == "status"]
    assert replay_statuses[-5:] == ["failed", "queued", "starting", "running", "succeeded"]
    steps = [f.data["step"] for f in full.frames if f.event == "metrics"]
    assert steps == list(range(1, 599)) + [599, 600, 601, 602]
    numbered = full.numbered()
    for cut in (0, 499, 500, 598, len(numbered) - 8, len(numbered) - 2):
        rest = Reader(url, {**auth(owner.key), "Last-Event-ID": numbered[cut].id}).read()
        assert [(f.id, f.event, f.data) for f in rest.numbered()] == [
            (f.id, f.event, f.data) for f in numbered[cut + 1 :]
        ], cut


def test_concurrent_ingest_reaches_every_live_client_in_number_order(owner, spec, web):
    import threading

    from tests.support.stream import NOW

    job, engine = running_job(owner, spec, web)
    url = stream_url(web, job)
    readers = [Reader(url, auth(owner.key)).start(timeout=90) for _ in range(3)]
    wait_for_all = time.monotonic() + 10
    while not all(r.frames for r in readers) and time.monotonic() < wait_for_all:
        time.sleep(0.05)
    errors = []

    def post(worker: int):
        try:
            for n in range(15):
                step = worker * 100 + n + 1
                engine.post("metrics", {"points": [{"step": step, "time": NOW, "values": {"x": float(step)}}]})
                engine.logs((step, f"w{worker} {n}"))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=post, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    finish(job)
    for reader in readers:
        reader.join()
    full = Reader(url, auth(owner.key)).read()
    expected = [(f.id, f.event, f.data) for f in full.numbered()]
    assert len([e for e in expected if e[1] == "metrics"]) == 60 and len([e for e in expected if e[1] == "log"]) == 60
    assert _strictly_increasing(_ids(full))
    for reader in readers:
        assert reader.closed_by_server
        assert [(f.id, f.event, f.data) for f in reader.numbered()] == expected


def _subscribers(redis_url: str, job: Job) -> int:
    import redis

    from jobs.stream.fanout import channel_name

    client = redis.Redis.from_url(redis_url)
    try:
        return dict(client.pubsub_numsub(channel_name(job.public_id)))[channel_name(job.public_id).encode()]
    finally:
        client.close()


def test_clients_that_drop_mid_stream_leave_no_subscription_behind(owner, spec, web):
    import struct

    job, engine = running_job(owner, spec, web)
    engine.metrics(*range(1, 200))
    request = (
        f"GET /api/v1/jobs/{job.public_id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {owner.key}\r\n\r\n"
    ).encode()
    sockets = []
    for n in range(30):
        sock = socket.create_connection(("127.0.0.1", web.port), timeout=10)
        sock.sendall(request if n % 5 else request[: len(request) // 2])  # some never finish the request
        sockets.append(sock)
    redis_url = web.env["REDIS_URL"]
    for n, sock in enumerate(sockets):
        if n % 5:
            assert sock.recv(12) == b"HTTP/1.1 200"  # each full request is a stream, followed live
    assert _subscribers(redis_url, job) == 1  # one subscription, shared by the process's clients
    for n, sock in enumerate(sockets):
        if n % 5 and n % 2:
            sock.recv(100)  # half-read
        if n % 3 == 0:  # reset, not a polite close
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    deadline = time.monotonic() + 20
    while _subscribers(redis_url, job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _subscribers(redis_url, job) == 0
    # The server still serves the job, live.
    reader = Reader(stream_url(web, job), auth(owner.key), params={"from": "now"}).start(timeout=30)
    deadline = time.monotonic() + 10
    while not reader.frames and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _subscribers(redis_url, job) == 1
    engine.metrics(200)
    finish(job)
    reader.join()
    assert [f.data["step"] for f in reader.frames if f.event == "metrics"] == [200]
    deadline = time.monotonic() + 10
    while _subscribers(redis_url, job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _subscribers(redis_url, job) == 0


@pytest.fixture
def own_redis(tmp_path):
    """A Redis server of this test's own, on a free port, that the test may kill and restart."""
    import shutil
    import subprocess

    from tests.support.stack import free_port

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is needed to test losing Redis")
    port = free_port()

    class Server:
        url = f"redis://127.0.0.1:{port}/0"
        process = None

        def start(self):
            self.process = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(tmp_path),
                    # The hub must keep up by itself: Redis never cuts it off for a slow read.
                    "--client-output-buffer-limit",
                    "pubsub 0 0 0",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return
                except OSError:
                    time.sleep(0.05)
            raise AssertionError("own redis-server did not start")

        def kill(self):
            if self.process is not None:
                self.process.kill()
                self.process.wait(timeout=10)
                self.process = None

    server = Server()
    server.start()
    yield server
    server.kill()


def in_process(engine, *steps: int) -> None:
    from datetime import UTC, datetime

    from jobs.ingest.schemas import MetricsBatch
    from jobs.ingest.services import ingest_metrics

    now = datetime.now(UTC)
    points = [{"step": s, "time": now, "values": {"reward/mean": s / 10, "loss/mean": 1.0}} for s in steps]
    ingest_metrics(attempt=engine.attempt, batch=MetricsBatch(attempt=engine.attempt.number, points=points))


def test_live_clients_lose_nothing_when_redis_dies_and_comes_back(owner, spec, tmp_path, own_redis, settings):
    settings.REDIS_URL = own_redis.url  # this process publishes status changes there too
    stack = _web(tmp_path, REDIS_URL=own_redis.url, LAB_STREAM_POLL_MS="100")
    try:
        job, engine = running_job(owner, spec, stack)
        url = stream_url(stack, job)
        before = Reader(url, auth(owner.key)).start(timeout=90)
        deadline = time.monotonic() + 10
        while not before.frames and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.metrics(1, 2, 3)
        own_redis.kill()
        # The ingest API counts its rate limit in the Redis cache, so while Redis is down the
        # records are stored here, in this process, as the ingest view would store them.
        in_process(engine, 4, 5, 6)
        during = Reader(url, auth(owner.key)).start(timeout=90)  # connects while Redis is down
        in_process(engine, 7)
        own_redis.start()
        engine.metrics(8, 9)
        after = Reader(url, auth(owner.key)).start(timeout=90)
        deadline = time.monotonic() + 10
        while not after.frames and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.metrics(10)
        finish(job)
        for reader in (before, during, after):
            reader.join()
        full = Reader(url, auth(owner.key)).read()
    finally:
        stack.stop()
    expected = [(f.id, f.event, f.data) for f in full.numbered()]
    assert [f.data["step"] for f in full.frames if f.event == "metrics"] == list(range(1, 11))
    for reader in (before, during, after):
        assert reader.closed_by_server
        assert [(f.id, f.event, f.data) for f in reader.numbered()] == expected


def test_a_revoked_key_a_removed_member_or_a_logout_ends_an_open_stream(owner, member, spec, tmp_path):
    """Access is checked when a stream opens and again at every heartbeat: a stream may last as
    long as its job (hours), and must not outlive the key or the membership that opened it."""
    from django.contrib.sessions.models import Session
    from django.test import Client

    from lab.audit import Actor
    from lab.models import Membership
    from lab.services import api_key_create, api_key_revoke, membership_remove

    stack = _web(tmp_path, LAB_STREAM_HEARTBEAT_S="1")

    def session_cookie(user) -> dict[str, str]:
        client = Client()
        client.force_login(user)
        name = django_settings.SESSION_COOKIE_NAME
        return {"Cookie": f"{name}={client.cookies[name].value}"}

    try:
        job, _ = running_job(owner, spec, stack)
        url = stream_url(stack, job)
        _, other_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="kept")
        kept = Reader(url, auth(other_key)).start(timeout=20)
        by_key = Reader(url, auth(owner.key)).start(timeout=20)
        by_member = Reader(url, session_cookie(member)).start(timeout=20)
        owner_cookie = session_cookie(owner.user)
        by_owner_session = Reader(url, owner_cookie).start(timeout=20)
        readers = (kept, by_key, by_member, by_owner_session)
        deadline = time.monotonic() + 10
        while not all(r.comments for r in readers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(r.status_code == 200 and r.comments for r in readers)
        api_key_revoke(actor=Actor(user=owner.user), api_key=owner.api_key)
        membership_remove(
            actor=Actor(user=owner.user),
            membership=Membership.objects.get(user=member, organization=owner.organization),
        )
        # The owner logs out elsewhere: the session is gone.
        Session.objects.filter(session_key=owner_cookie["Cookie"].split("=", 1)[1]).delete()
        for reader in (by_key, by_member, by_owner_session):
            reader.join(timeout=10)
            assert reader.closed_by_server, "the stream outlived the access that opened it"
        assert not kept.closed_by_server and kept.error is None
        kept.stop()
        finish(job)
        kept.join(timeout=10)
    finally:
        stack.stop()


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_client_that_never_reads_holds_a_bounded_amount_of_server_memory(owner, spec, tmp_path, own_redis):
    """The records waiting for a client that does not read are bounded in bytes, not only in
    messages: 1,000 messages of a megabyte each would be a gigabyte per client."""
    import json

    import redis

    from jobs.stream.fanout import channel_name

    stack = _web(tmp_path, REDIS_URL=own_redis.url)
    sock = None
    try:
        job, _ = running_job(owner, spec, stack)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", stack.port))
        sock.sendall(
            f"GET /api/v1/jobs/{job.public_id}/stream?from=now HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {owner.key}\r\n\r\n".encode()
        )
        publisher = redis.Redis.from_url(own_redis.url)
        channel = channel_name(job.public_id)
        assert sock.recv(12) == b"HTTP/1.1 200"
        deadline = time.monotonic() + 10
        while publisher.pubsub_numsub(channel)[0][1] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert publisher.pubsub_numsub(channel)[0][1] == 1
        pid = stack.processes["web"].pid
        before = _rss_bytes(pid)
        line = "x" * (256 * 1024)
        for n in range(400):  # 100 MiB of records the client never reads
            payload = json.dumps([[10**9 + n, "log", json.dumps({"seq": n, "line": line})]])
            publisher.publish(channel, payload)
            if n % 50 == 0:
                time.sleep(0.05)
        time.sleep(2)
        grown = _rss_bytes(pid) - before
        publisher.close()
        assert grown < 48 * 1024 * 1024, f"the server grew by {grown // 2**20} MiB for one client that does not read"
        assert httpx.get(f"{stack.base_url}/healthz", timeout=10).status_code == 200
    finally:
        if sock is not None:
            sock.close()
        stack.stop()


def test_a_client_that_falls_behind_catches_up_from_the_database_exactly(owner, spec, tmp_path, own_redis, settings):
    import redis

    from jobs.stream import fanout

    settings.REDIS_URL = own_redis.url
    stack = _web(tmp_path, REDIS_URL=own_redis.url)
    try:
        job, engine = running_job(owner, spec, stack)
        url = stream_url(stack, job)
        paused = []

        def pause_once(reader):
            if not paused and reader.frames:
                paused.append(True)
                time.sleep(3)  # stop reading while the engine goes on
            return False

        slow = Reader(url, auth(owner.key)).start(until=pause_once, timeout=60)
        steady = Reader(url, auth(owner.key)).start(timeout=60)
        deadline = time.monotonic() + 10
        while not (paused and steady.frames) and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.metrics(1, 2, 3)
        # A message bigger than a client may have waiting: every client lags and must read
        # what it missed from the database (the message itself holds no record).
        publisher = redis.Redis.from_url(own_redis.url)
        publisher.publish(fanout.channel_name(job.public_id), "[]" + " " * (fanout.QUEUE_BYTES_LIMIT + 1))
        publisher.close()
        for step in range(4, 30):
            engine.metrics(step)
        finish(job)
        slow.join()
        steady.join()
        full = Reader(url, auth(owner.key)).read()
    finally:
        stack.stop()
    expected = [(f.id, f.event, f.data) for f in full.numbered()]
    assert [f.data["step"] for f in full.frames if f.event == "metrics"] == list(range(1, 30))
    for reader in (slow, steady):
        assert reader.closed_by_server
        assert [(f.id, f.event, f.data) for f in reader.numbered()] == expected


def test_a_lagging_subscription_drops_what_waits_and_wakes_its_client():
    import asyncio

    from jobs.stream.fanout import QUEUE_BYTES_LIMIT, QUEUE_LIMIT, Subscription
    from jobs.stream.records import record

    async def scenario():
        by_count = Subscription("c")
        for n in range(QUEUE_LIMIT + 5):
            by_count.deliver([record(n + 1, "log", {"n": n})], 10)
        assert by_count.lagged and by_count.queued_bytes == 0 and by_count.queue.qsize() == 1
        assert await by_count.get() == []  # the wake-up: catch up now
        by_count.lagged = False
        by_count.deliver([record(1, "log", {})], 10)
        assert by_count.queued_bytes == 10 and len(await by_count.get()) == 1 and by_count.queued_bytes == 0

        by_bytes = Subscription("c")
        by_bytes.deliver([record(1, "log", {})], QUEUE_BYTES_LIMIT // 2)
        by_bytes.deliver([record(2, "log", {})], QUEUE_BYTES_LIMIT // 2)
        assert not by_bytes.lagged
        by_bytes.deliver([record(3, "log", {})], 1)
        assert by_bytes.lagged and by_bytes.queue.qsize() == 1 and by_bytes.queued_bytes == 0

        broken = Subscription("c")
        broken.deliver([record(1, "log", {})], 1)
        broken.interrupt()
        broken.clear()  # the hub's "lost Redis" wake-up survives a clear
        assert await broken.get() is None and broken.broken

    asyncio.run(scenario())


def test_a_last_event_id_beyond_anything_the_job_sent_is_a_400_not_a_stream_that_never_ends(owner, spec, web):
    """An id the stream never sent (another job's, or made up) would skip every record, the
    final status included, so the stream would never end: refuse it."""
    job, engine = running_job(owner, spec, web)
    engine.metrics(1, 2)
    sent = Job.objects.unscoped().get(pk=job.pk).stream_seq
    url = stream_url(web, job)
    for beyond in (sent + 1, 10**12):
        code, error = _error(httpx.get(url, headers={**auth(owner.key), "Last-Event-ID": str(beyond)}, timeout=10))
        assert (code, error["param"]) == (400, "last_event_id")
    finish(job)
    last = Reader(url, {**auth(owner.key), "Last-Event-ID": str(sent)}).read(timeout=10)
    assert last.closed_by_server and [f.event for f in last.numbered()] == ["event", "status"]
    assert last.frames[-1].data["status"] == "succeeded"


def test_a_job_deleted_during_a_replay_ends_the_stream_cleanly(owner, spec, settings, monkeypatch):
    """Only finished jobs can be deleted, so a follower meets a deletion while it replays: the
    stream ends after the page it was sending, without an error."""
    import asyncio
    from datetime import UTC, datetime

    from jobs.services import job_delete, job_submit, job_transition, store_log_lines
    from jobs.stream import views
    from lab.audit import Actor

    settings.REDIS_URL = ""
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    now = datetime.now(UTC)
    store_log_lines(job=job, attempt_number=1, source="engine", lines=[(n, now, "stdout", "x") for n in range(1200)])
    job_transition(job=job, to="cancelled", message="stop")
    real = views._catch_up_async
    pages = []

    async def deleting(job_pk, after):
        answer = await real(job_pk, after)
        pages.append(after)
        if len(pages) == 1:
            await views._in_thread(lambda: job_delete(job=Job.objects.unscoped().get(pk=job_pk), actor=Actor(user=owner.user)))()
        return answer

    monkeypatch.setattr(views, "_catch_up_async", deleting)

    async def everything():
        return [frame async for frame in views._events(job.pk, job.public_id, None)]

    frames = asyncio.run(everything())
    assert not Job.objects.unscoped().filter(pk=job.pk).exists()
    assert frames[0].startswith("event: status") and 1 < len(frames) < 1200
    assert len(pages) == 2  # the page after the deletion found nothing more, and the stream ended


def test_new_streams_answer_and_follow_while_redis_hangs(owner, spec, tmp_path, own_redis, settings):
    """A Redis that accepts connections but never answers (stopped, or a dead network path)
    must not hold up new streams: they answer at once and follow by polling the database."""
    import os
    import signal

    settings.REDIS_URL = own_redis.url
    stack = _web(tmp_path, REDIS_URL=own_redis.url, LAB_STREAM_POLL_MS="100")
    try:
        job, engine = running_job(owner, spec, stack)  # the ingest API needs Redis (its rate limit)
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        url = stream_url(stack, job)
        started = time.monotonic()
        readers = [Reader(url, auth(owner.key)).start(timeout=40) for _ in range(3)]
        deadline = time.monotonic() + 30
        while not all(r.frames for r in readers) and time.monotonic() < deadline:
            time.sleep(0.05)
        opened = time.monotonic() - started
        assert all(r.frames for r in readers), "no snapshot while Redis hangs"
        assert opened < 10, f"new streams waited {opened:.1f} s for a Redis that does not answer"
        in_process(engine, 1, 2)
        finish(job)  # publishing here fails (after its timeout) and is logged; the clients poll
        for reader in readers:
            reader.join(timeout=40)
            assert reader.closed_by_server
            assert [f.data["step"] for f in reader.frames if f.event == "metrics"] == [1, 2]
    finally:
        os.kill(own_redis.process.pid, signal.SIGCONT)
        stack.stop()


def test_a_replay_page_holds_a_bounded_amount_of_data_and_pages_join_up_exactly(owner, spec):
    """A sample is up to 128 KiB of text: 500 of them in one page would be 64 MiB per client."""
    from datetime import UTC, datetime

    from django.db import transaction

    from jobs.models import RolloutSample
    from jobs.services import job_submit, store_log_lines
    from jobs.stream import records
    from lab.audit import Actor

    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    now = datetime.now(UTC)
    big = "x" * 65_536
    for batch in range(20):
        with transaction.atomic():
            rows = [
                RolloutSample(
                    job=job, step=batch, attempt=1, group=g, prompt=big, completion=big, reward=0.0, advantage=0.0
                )
                for g in range(5)
            ]
            records.number(job.pk, rows)
            RolloutSample.objects.bulk_create(rows)
        store_log_lines(
            job=job, attempt_number=1, source="engine", lines=[(batch * 10 + n, now, "stdout", "l") for n in range(5)]
        )
    from jobs.models import JobEvent, LogLine

    expected = sorted(
        [*RolloutSample.objects.filter(job=job).values_list("stream_seq", flat=True)]
        + [*LogLine.objects.filter(job=job).values_list("stream_seq", flat=True)]
        + [
            seq + extra
            for seq in JobEvent.objects.filter(job=job).values_list("stream_seq", flat=True)
            for extra in (0, 1)
        ]
    )
    assert len(expected) == 2 + 100 + 100  # job.queued with its status, the samples, the lines
    pages, after = [], 0
    while True:
        page, complete = records.read_after(job.pk, after)
        size = sum(len(item.data) for item in page)
        assert size <= 5 * 2**20, f"one page held {size // 2**20} MiB"
        pages += page
        if complete or not page:
            break
        after = page[-1].seq
    assert [item.seq for item in pages] == expected
    whole = pages
    # A tiny budget still makes progress one record at a time, and still joins up exactly.
    pages, after = [], 0
    while True:
        page, complete = records.read_after(job.pk, after, max_bytes=1)
        pages += page
        if complete or not page:
            break
        after = page[-1].seq
    assert pages == whole


def test_records_committed_while_a_catch_up_reads_are_neither_skipped_nor_sent_out_of_order(owner, spec, settings, monkeypatch):
    """A catch-up reads the record tables one after another, each query at its own moment. Commits
    that land between those queries (a step's metrics, then a log line and the job's end) must
    not make the follower jump past the metrics: the page would never draw that step."""
    import asyncio
    import threading
    from datetime import UTC, datetime

    from django.db import connection, connections

    from jobs.ingest.schemas import MetricsBatch
    from jobs.ingest.services import ingest_metrics
    from jobs.models import MetricStep
    from jobs.services import job_claim_for_start, job_submit, store_log_lines
    from jobs.stream import views
    from lab.audit import Actor
    from tests.support.stream import NOW

    settings.REDIS_URL = ""  # followers poll, so every wait for news is a catch-up
    settings.LAB_STREAM_POLL_MS = 50
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    job_claim_for_start(job_id=job.pk)
    attempt = Job.objects.unscoped().get(pk=job.pk).attempts.get()
    metrics = MetricsBatch.model_validate_json(
        f'{{"attempt": 1, "points": [{{"step": 1, "time": "{NOW}", "values": {{"reward/mean": 0.5}}}}]}}'
    )

    def engine_reports_and_the_job_ends() -> None:
        try:
            ingest_metrics(attempt=attempt, batch=metrics)
            store_log_lines(job=job, attempt_number=1, source="engine", lines=[(0, datetime.now(UTC), "stdout", "done")])
            finish(job)
        finally:
            connections.close_all()

    landed = threading.Event()

    def after_the_metrics_query(execute, sql, params, many, context):
        answer = execute(sql, params, many, context)
        if MetricStep._meta.db_table in sql and not landed.is_set():
            landed.set()  # the catch-up has read the metrics; the rest lands before its next table
            writer = threading.Thread(target=engine_reports_and_the_job_ends)
            writer.start()
            writer.join()
        return answer

    def catch_up(job_pk, after):
        with connection.execute_wrapper(after_the_metrics_query):
            return views._catch_up(job_pk, after)

    monkeypatch.setattr(views, "_catch_up_async", views._in_thread(catch_up))

    async def everything():
        return [frame async for frame in views._events(job.pk, job.public_id, None)]

    frames = asyncio.run(everything())
    assert landed.is_set()
    numbered = [frame.split("\n", 2)[:2] for frame in frames if frame.startswith("id: ")]
    sent = [(int(head.removeprefix("id: ")), kind.removeprefix("event: ")) for head, kind in numbered]
    job.refresh_from_db()
    assert [seq for seq, _ in sent] == list(range(1, job.stream_seq + 1)), sent
    assert [kind for _, kind in sent][-4:] == ["metrics", "log", "event", "status"]
