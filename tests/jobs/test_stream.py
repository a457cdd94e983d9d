"""The live stream ``GET /api/v1/jobs/{id}/stream`` (docs/live-stream.md), end to end.

A real uvicorn serves the stream; the test process plays the engine through the ingest API over
HTTP and changes statuses through the services, so records cross processes through Redis (or,
without ``REDIS_URL``, through the database the server polls).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from labsdk import Lab

from jobs.models import JobStatus
from jobs.services import job_submit, job_transition
from lab.audit import Actor
from tests.support.stack import wait_for
from tests.support.stream import NOW, Reader, _web, auth, finish, running_job, stream_url

pytestmark = [pytest.mark.usefixtures("no_broker"), pytest.mark.django_db(transaction=True), pytest.mark.e2e]


def test_it_replays_a_finished_jobs_history_in_order_and_closes(owner, spec, web):
    job, engine = running_job(owner, spec, web)
    engine.metrics(1, 2, 3)
    engine.logs((1, "loading"), (2, "step 1"))
    engine.samples(1, 2)
    engine.metrics(4, 5)
    finish(job)

    reader = Reader(stream_url(web, job), auth(owner.key)).read(timeout=30)

    assert reader.status_code == 200
    assert reader.closed_by_server
    snapshot, *rest = reader.frames
    assert snapshot.id is None and snapshot.event == "status"
    assert snapshot.data["id"] == job.public_id and snapshot.data["status"] == "succeeded"
    ids = [int(frame.id) for frame in rest]
    assert ids == list(range(1, len(rest) + 1))
    assert [(f.event, f.data.get("type") or f.data.get("status") or f.data.get("step") or f.data.get("line")) for f in rest] == [
        ("event", "job.queued"), ("status", "queued"),
        ("event", "job.starting"), ("status", "starting"),
        ("event", "job.started"), ("status", "running"),
        ("metrics", 1), ("metrics", 2), ("metrics", 3),
        ("log", "loading"), ("log", "step 1"),
        ("sample", 1), ("sample", 1),
        ("metrics", 4), ("metrics", 5),
        ("event", "job.succeeded"), ("status", "succeeded"),
    ]
    metrics = [f.data for f in rest if f.event == "metrics"]
    assert metrics[0] == {"step": 1, "time": NOW, "attempt": 1, "values": {"reward/mean": 0.1, "loss/mean": 1.0}}
    log = next(f.data for f in rest if f.event == "log")
    assert set(log) == {"seq", "time", "attempt", "stream", "line"}
    event = next(f.data for f in rest if f.event == "event")
    assert event["id"].startswith("evt_") and event["job_id"] == job.public_id


def test_last_event_id_resumes_after_that_event_with_nothing_lost_or_doubled(owner, spec, web):
    job, engine = running_job(owner, spec, web)
    engine.metrics(*range(1, 31))
    engine.logs(*((n, f"line {n}") for n in range(1, 11)))
    finish(job)
    full = Reader(stream_url(web, job), auth(owner.key)).read().numbered()

    for cut in (0, 5, len(full) - 3, len(full) - 1):
        resumed = Reader(stream_url(web, job), {**auth(owner.key), "Last-Event-ID": full[cut].id}).read()
        assert resumed.closed_by_server
        assert resumed.frames[0].id is None  # the snapshot never moves Last-Event-ID
        assert [(f.id, f.event, f.data) for f in resumed.numbered()] == [(f.id, f.event, f.data) for f in full[cut + 1 :]]
    by_query = Reader(stream_url(web, job), auth(owner.key), params={"last_event_id": full[10].id}).read()
    assert [f.id for f in by_query.numbered()] == [f.id for f in full[11:]]


def test_live_records_arrive_in_order_while_the_engine_reports(owner, spec, web):
    job, engine = running_job(owner, spec, web)
    engine.metrics(1)
    reader = Reader(stream_url(web, job), auth(owner.key), params={"from": "now"}).start(timeout=60)
    wait_for(lambda: reader.frames, timeout=10, what="the snapshot")
    for step in range(2, 22):
        engine.metrics(step)
        if step % 5 == 0:
            engine.logs((step, f"at step {step}"))
    finish(job)
    reader.join()

    assert reader.closed_by_server
    assert reader.frames[0].data["status"] == "running"
    steps = [f.data["step"] for f in reader.frames if f.event == "metrics"]
    assert steps == list(range(2, 22))  # ?from=now skipped step 1
    ids = [int(f.id) for f in reader.numbered()]
    assert ids == sorted(set(ids))
    assert [f.data["line"] for f in reader.frames if f.event == "log"] == [f"at step {s}" for s in (5, 10, 15, 20)]
    assert reader.frames[-1].event == "status" and reader.frames[-1].data["status"] == "succeeded"


def test_without_redis_the_server_polls_the_database_and_loses_nothing(owner, spec, tmp_path):
    stack = _web(tmp_path, REDIS_URL="", LAB_STREAM_POLL_MS="100")
    try:
        job, engine = running_job(owner, spec, stack)
        reader = Reader(stream_url(stack, job), auth(owner.key)).start(timeout=60)
        for step in range(1, 11):
            engine.metrics(step)
        finish(job)
        reader.join()
    finally:
        stack.stop()
    assert reader.closed_by_server
    assert [f.data["step"] for f in reader.frames if f.event == "metrics"] == list(range(1, 11))
    ids = [int(f.id) for f in reader.numbered()]
    assert ids == list(range(1, len(ids) + 1))


def test_a_resent_or_merged_step_is_streamed_once_with_its_merged_values(owner, spec, web):
    job, engine = running_job(owner, spec, web)
    reader = Reader(stream_url(web, job), auth(owner.key), params={"from": "now"}).start(timeout=60)
    wait_for(lambda: reader.frames, timeout=10, what="the snapshot")
    engine.metrics(1)
    engine.metrics(1)  # a retried batch: a no-op
    engine.post("metrics", {"points": [{"step": 1, "time": NOW, "values": {"eval/addition/mean": 0.25}}]})
    finish(job)
    reader.join()
    metrics = [f.data for f in reader.frames if f.event == "metrics"]
    assert [m["values"] for m in metrics] == [
        {"reward/mean": 0.1, "loss/mean": 1.0},
        {"reward/mean": 0.1, "loss/mean": 1.0, "eval/addition/mean": 0.25},
    ]
    replay = Reader(stream_url(web, job), auth(owner.key)).read()
    assert [f.data["values"] for f in replay.frames if f.event == "metrics"] == [metrics[-1]["values"]]


def test_a_comment_line_keeps_an_idle_stream_open(owner, spec, tmp_path):
    stack = _web(tmp_path, LAB_STREAM_HEARTBEAT_S="1")
    try:
        job, _ = running_job(owner, spec, stack)
        reader = Reader(stream_url(stack, job), auth(owner.key)).read(until=lambda r: len(r.comments) >= 2, timeout=10)
    finally:
        stack.stop()
    assert reader.comments[:2] == [": keep-alive", ": keep-alive"]


def test_it_refuses_bad_credentials_foreign_jobs_and_bad_resume_points(owner, outsider, spec, web):
    job, _ = running_job(owner, spec, web)
    url = stream_url(web, job)

    def answer(headers=None, params=None, path=url, method="GET"):
        response = httpx.request(method, path, headers=headers or {}, params=params, timeout=10)
        return response.status_code, response.json()["error"]

    assert answer() [0] == 401
    assert answer({"Authorization": "Bearer lab_not-a-key-at-all-000000000"}) == (401, answer()[1])
    assert answer({"Authorization": "Basic abc"})[0] == 401
    missing = answer(auth(owner.key), path=f"{web.base_url}/api/v1/jobs/job_doesnotexist/stream")
    assert missing[0] == 404 and missing[1]["code"] == "not_found"
    assert answer(auth(outsider.key)) == missing  # another organization's job: the same 404
    assert answer(auth(owner.key), path=f"{web.base_url}/api/v1/jobs/{'x' * 5000}/stream")[0] == 404
    for bad in ("abc", "-1", "1.5", "9" * 40, "7x"):
        code, error = answer({**auth(owner.key), "Last-Event-ID": bad})
        assert (code, error["param"]) == (400, "last_event_id"), bad
    for bad in ("١٢", "x" * 10_000, "\u0000"):
        code, error = answer(auth(owner.key), params={"last_event_id": bad})
        assert code in (400,) and error["param"] in ("last_event_id", None), bad
    assert answer(auth(owner.key), params={"from": "yesterday"})[1]["param"] == "from"
    assert answer(auth(owner.key), method="POST")[0] == 405


def test_a_dashboard_session_of_a_member_may_follow_and_an_outsiders_gets_404(owner, outsider, spec, web, client):
    job, _ = running_job(owner, spec, web)
    finish(job)

    def with_session(user):
        client.force_login(user)
        cookie = client.cookies[django_settings.SESSION_COOKIE_NAME].value
        return Reader(stream_url(web, job), {"Cookie": f"{django_settings.SESSION_COOKIE_NAME}={cookie}"}).read()

    member = with_session(owner.user)
    assert member.status_code == 200 and member.closed_by_server
    assert member.frames[-1].data["status"] == "succeeded"
    stranger = with_session(outsider.user)
    assert stranger.status_code == 404


def _database_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def test_fifty_clients_that_come_and_go_hold_no_database_connection_and_leave_nothing_behind(owner, spec, web):
    job, engine = running_job(owner, spec, web)
    engine.metrics(1, 2)
    Reader(stream_url(web, job), auth(owner.key)).read(until=lambda r: len(r.frames) >= 3)  # warm the server up
    time.sleep(0.5)
    before = _database_connections()
    channel = f"lab:stream:{job.public_id}"
    pubsub = redis.Redis.from_url(django_settings.REDIS_URL)

    readers = [
        Reader(stream_url(web, job), auth(owner.key)).start(until=lambda r: r._stop.is_set(), timeout=60)
        for _ in range(50)
    ]
    wait_for(lambda: all(len(r.frames) >= 3 for r in readers), timeout=60, what="50 clients replayed")
    engine.metrics(3)  # wakes every client: the live record reaches all of them
    wait_for(lambda: all(any(f.data.get("step") == 3 for f in r.frames) for r in readers), timeout=30, what="step 3")
    time.sleep(0.5)
    waiting = _database_connections()
    subscriptions = pubsub.pubsub_numsub(channel)[0][1]
    for reader in readers:
        reader.stop()
    engine.logs((1, "wake up so the readers see their stop flag"))
    for reader in readers:
        reader.join()
    wait_for(lambda: pubsub.pubsub_numsub(channel)[0][1] == 0, timeout=10, what="the channel left")
    time.sleep(0.5)
    after = _database_connections()

    print(f"database connections: before={before} waiting={waiting} after={after}")
    assert waiting <= before, "clients waiting for records must not hold database connections"
    assert subscriptions == 1, "one Redis subscription per server process, whatever the clients"
    assert after <= before


def test_the_sdk_follows_a_job_across_a_server_restart_without_losing_or_repeating(owner, spec, web):
    job, engine = running_job(owner, spec, web)
    lab = Lab(api_key=owner.key, base_url=f"{web.base_url}/api/v1", max_retries=20)
    seen = []

    def follow():
        for event in lab.jobs.stream(job.public_id):
            seen.append(event)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    engine.metrics(1, 2, 3)
    wait_for(lambda: sum(e.event == "metrics" for e in seen) == 3, timeout=20, what="3 steps")
    web.kill("web")
    engine_down = [4, 5]
    # The engine spools while Lab is down; here the records go straight into the database.
    from jobs.ingest.schemas import MetricsBatch
    from jobs.ingest.services import ingest_metrics

    ingest_metrics(
        attempt=engine.attempt,
        batch=MetricsBatch.model_validate(
            {"attempt": 1, "points": [{"step": s, "time": NOW, "values": {"reward/mean": 0.5}} for s in engine_down]}
        ),
    )
    web.start_web()
    engine.metrics(6)
    finish(job)
    thread.join(60)
    assert not thread.is_alive()
    steps = [event.data.step for event in seen if event.event == "metrics"]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert seen[-1].event == "status" and seen[-1].data.status == "succeeded"


def _lab_command(*argv: str, key: str, base_url: str) -> subprocess.Popen:
    """Start the installed ``lab`` command as a user would."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LAB_")}
    env.update(LAB_BASE_URL=base_url, LAB_API_KEY=key, NO_COLOR="1", COLUMNS="200")
    script = Path(sys.executable).with_name("lab")
    return subprocess.Popen([str(script), *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_lab_jobs_logs_follow_prints_each_line_once_until_the_job_ends(owner, spec, web):
    job, engine = running_job(owner, spec, web)
    engine.logs((1, "first"), (2, "second"))
    command = _lab_command("jobs", "logs", job.public_id, "-f", key=owner.key, base_url=web.base_url)
    engine.logs((2, "second"), (3, "third"))  # line 2 resent: stored and shown once
    finish(job)
    out, err = command.communicate(timeout=60)
    assert command.returncode == 0, err
    assert out.splitlines() == ["first", "second", "third"], err


def test_lab_jobs_watch_shows_the_latest_metrics_and_exits_with_the_jobs_outcome(owner, spec, web):
    job, engine = running_job(owner, spec, web, max_steps=3)
    engine.metrics(1, 2)
    command = _lab_command("jobs", "watch", job.public_id, "--json", key=owner.key, base_url=web.base_url)
    engine.metrics(3)
    finish(job)
    out, err = command.communicate(timeout=60)
    assert command.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["data"]["step"] for line in lines if line["event"] == "metrics"] == [1, 2, 3]
    # A stream opened after the end starts with the final status, then replays the steps before it.
    statuses = [line["data"]["status"] for line in lines if line["event"] == "status"]
    assert statuses[-1] == "succeeded"

    # Without a terminal (a pipe here) watch prints one plain line per status and metric step.
    plain = _lab_command("jobs", "watch", job.public_id, key=owner.key, base_url=web.base_url)
    out, err = plain.communicate(timeout=60)
    assert plain.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == f"{job.public_id} succeeded step 3/3"
    assert lines[-1].startswith(f"{job.public_id} succeeded step 3/3 reward/mean=0.3 ")

    job2 = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    job_transition(job=job2, to=JobStatus.CANCELLED)
    cancelled = _lab_command("jobs", "watch", job2.public_id, key=owner.key, base_url=web.base_url)
    cancelled.communicate(timeout=60)
    assert cancelled.returncode == 1
    missing = _lab_command("jobs", "watch", "job_missing", key=owner.key, base_url=web.base_url)
    _, err = missing.communicate(timeout=60)
    assert missing.returncode == 1
    assert err == "error: No such job. (not_found)\n"
