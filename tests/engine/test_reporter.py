"""The reporter against a fake Lab ingest server: spool, retry, exactly-once, stop, checkpoints."""

import json
import time

from engine.checkpoint_archives import write_tar
from engine.http_transport import HttpTransport
from engine.reporter import OfflineTransport, Reporter


def make_reporter(fake_lab, tmp_path, **options):
    transport = HttpTransport(fake_lab.url, "job_1", fake_lab.token, timeout=5)
    options.setdefault("heartbeat_interval", 0.2)
    return Reporter(transport, job_id="job_1", attempt=1, spool_dir=tmp_path / "spool",
                    backoff_base=0.05, backoff_cap=0.2, **options)


def test_it_delivers_every_metric_point_exactly_once_when_lab_refuses_then_accepts(fake_lab, tmp_path):
    fake_lab.refuse_next = 5
    reporter = make_reporter(fake_lab, tmp_path)
    reporter.start()
    for step in range(1, 41):
        reporter.metrics(step, {"reward/mean": step / 100, "loss/mean": float("nan")})
    reporter.log("hello")
    assert reporter.close("succeeded", timeout=20)
    assert fake_lab.refused == 5
    assert fake_lab.metric_arrivals == {step: 1 for step in range(1, 41)}
    assert fake_lab.metrics[7] == {"reward/mean": 0.07}  # NaN left out: JSON has none
    assert list(fake_lab.logs.values()) == ["hello"]
    assert fake_lab.finish == [{"attempt": 1, "outcome": "succeeded"}]


def test_it_keeps_unsent_points_in_the_spool_while_lab_is_down(fake_lab, tmp_path):
    fake_lab.refuse_next = 10**6
    reporter = make_reporter(fake_lab, tmp_path)
    reporter.start()
    started = time.monotonic()
    for step in range(1, 4):
        reporter.metrics(step, {"reward/mean": 0.5})
    assert time.monotonic() - started < 0.5  # training never waits on Lab
    assert not reporter.close("succeeded", timeout=0.5)
    spooled = [json.loads(line) for line in (tmp_path / "spool" / "metrics.jsonl").read_text().splitlines()]
    assert [point["step"] for point in spooled] == [1, 2, 3]
    assert not (tmp_path / "spool" / "metrics.sent").exists()
    assert fake_lab.metrics == {}


def test_it_sets_stop_requested_when_a_heartbeat_answers_stop(fake_lab, tmp_path):
    fake_lab.action = "stop"
    reporter = make_reporter(fake_lab, tmp_path)
    reporter.set_status("running", 4, "training")
    reporter.start()
    assert reporter.stop_requested.wait(5)
    reporter.close("stopped", timeout=5)
    assert fake_lab.statuses[0] == {"attempt": 1, "phase": "running", "step": 4, "message": "training"}


def test_it_registers_uploads_and_completes_a_checkpoint(fake_lab, tmp_path):
    directory = tmp_path / "step-000002"
    (directory / "trainer_state").mkdir(parents=True)
    (directory / "trainer_state" / "state.json").write_text("{}")
    archive = tmp_path / "step-000002.tar"
    size, digest = write_tar(directory, archive)
    reporter = make_reporter(fake_lab, tmp_path)
    reporter.start()
    fake_lab.refuse_next = 2
    reporter.checkpoint(2, "peft-lora", archive, size, digest)
    assert reporter.close("succeeded", timeout=10)
    (checkpoint,) = fake_lab.checkpoints.values()
    assert checkpoint["status"] == "ready"
    assert (checkpoint["step"], checkpoint["format"], checkpoint["attempt"]) == (2, "peft-lora", 1)
    assert checkpoint["path"].read_bytes() == archive.read_bytes()


def test_it_writes_the_same_bodies_under_the_workdir_offline(tmp_path):
    reporter = Reporter(OfflineTransport(tmp_path), job_id="demo", attempt=2, spool_dir=tmp_path / "spool", heartbeat_interval=0.1)
    reporter.start()
    reporter.metrics(1, {"reward/mean": 0.25})
    reporter.samples([{"step": 1, "group": 0, "prompt": "p", "completion": "c", "reward": 0.0, "advantage": 0.0, "metrics": {}}])
    assert reporter.close("succeeded", timeout=5)
    (point,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (point["step"], point["attempt"], point["values"]) == (1, 2, {"reward/mean": 0.25})
    assert json.loads((tmp_path / "finish.json").read_text()) == {"attempt": 2, "outcome": "succeeded"}


def make_archive(tmp_path, step):
    directory = tmp_path / f"step-{step:06d}"
    (directory / "trainer_state").mkdir(parents=True)
    (directory / "trainer_state" / "state.json").write_text(json.dumps({"step": step}))
    archive = tmp_path / f"step-{step:06d}.tar"
    size, digest = write_tar(directory, archive)
    return archive, size, digest


def test_it_fails_a_checkpoint_whose_archive_vanished_and_moves_on(fake_lab, tmp_path):
    gone, gone_size, gone_digest = make_archive(tmp_path, 10)
    kept, kept_size, kept_digest = make_archive(tmp_path, 20)
    gone.unlink()
    settled = []
    reporter = make_reporter(fake_lab, tmp_path)
    reporter.checkpoint(10, "peft-lora", gone, gone_size, gone_digest, on_done=settled.append)
    reporter.checkpoint(20, "peft-lora", kept, kept_size, kept_digest, on_done=settled.append)
    reporter.start()
    assert reporter.close("succeeded", timeout=10)
    assert [(c["step"], c["status"]) for c in fake_lab.checkpoints.values()] == [(10, "failed"), (20, "ready")]
    assert settled == ["ckpt_1", "ckpt_2"]
    assert (tmp_path / "spool" / "checkpoints.sent").read_text() == "2"


def test_it_keeps_sending_metrics_samples_and_logs_while_checkpoints_cannot_get_through(fake_lab, tmp_path):
    archive, size, digest = make_archive(tmp_path, 5)
    fake_lab.down_for = ("checkpoints",)
    reporter = make_reporter(fake_lab, tmp_path)
    reporter.start()
    reporter.checkpoint(5, "peft-lora", archive, size, digest)
    time.sleep(0.5)  # the checkpoint lane is backing off by now
    for step in range(1, 31):
        reporter.metrics(step, {"reward/mean": 0.5})
        reporter.samples([{"step": step, "group": 0, "prompt": "p", "completion": "c", "reward": 0.5, "advantage": 0.0, "metrics": {}}])
        reporter.log(f"step {step}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(fake_lab.metrics) < 30 or len(fake_lab.logs) < 30 or len(fake_lab.samples) < 30):
        time.sleep(0.05)
    assert sorted(fake_lab.metrics) == list(range(1, 31))
    assert len(fake_lab.samples) == 30 and len(fake_lab.logs) == 30
    assert reporter.pending_archives() == {archive}
    assert not reporter.close("succeeded", timeout=0.5)  # the checkpoint is still owed
    assert fake_lab.checkpoints == {}
    assert not (tmp_path / "spool" / "checkpoints.sent").exists()  # left in the spool for Lab


def test_it_never_prunes_a_checkpoint_lab_has_not_settled(tmp_path):
    from engine.checkpoints import prune_checkpoints

    archives = {step: make_archive(tmp_path, step)[0] for step in (10, 20, 30, 40)}
    deleted = prune_checkpoints(tmp_path, 2, pending_archives={archives[10]})
    assert [path.name for path in deleted] == ["step-000020"]
    assert sorted(path.name for path in tmp_path.glob("step-*.tar")) == ["step-000010.tar", "step-000030.tar", "step-000040.tar"]


def test_the_http_transport_retries_what_labsdk_retry_does_and_nothing_else(fake_lab):
    from engine.reporter import IngestError

    transport = HttpTransport(fake_lab.url, "job_1", fake_lab.token, timeout=5)
    fake_lab.refuse_next = 1
    outcomes = []
    for path in ("status", "no-such-endpoint"):  # 503 (Lab down), then 404
        try:
            transport.post(path, {"attempt": 1, "phase": "running", "step": 0, "message": ""})
        except IngestError as error:
            outcomes.append((error.status_code, error.retryable))
    transport.close()
    unreachable = HttpTransport("http://127.0.0.1:9", "job_1", "token", timeout=2)
    try:
        unreachable.post("status", {})
    except IngestError as error:
        outcomes.append((error.status_code, error.retryable))
    unreachable.close()
    assert outcomes == [(503, True), (404, False), (None, True)]


def test_a_checkpoint_whose_bytes_differ_from_labs_sha256_is_never_unpacked_and_fails_the_start(fake_lab, tmp_path):
    import hashlib
    import io
    import tarfile

    import pytest

    from engine.commands.attempt import resume_checkpoint
    from engine.config import ConfigError
    from engine.reporter import IngestError

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("trainer_state/state.json")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"{}"))
    fake_lab.downloads["ckpt_1"] = (buffer.getvalue(), hashlib.sha256(b"the archive Lab verified").hexdigest())
    transport = HttpTransport(fake_lab.url, "job_1", fake_lab.token, timeout=5)

    (tmp_path / "fetched").mkdir()
    with pytest.raises(IngestError) as refused:
        transport.download_checkpoint("ckpt_1", tmp_path / "fetched" / "ckpt_1.tar")
    assert refused.value.retryable is False
    assert list((tmp_path / "fetched").iterdir()) == []
    with pytest.raises(ConfigError) as failed:
        resume_checkpoint("ckpt_1", tmp_path / "work", transport)
    transport.close()
    found = hashlib.sha256(buffer.getvalue()).hexdigest()
    assert (failed.value.code, str(failed.value)) == (
        "internal_error",
        (
            "--resume-from ckpt_1: cannot fetch it: checkpoint ckpt_1: the archive downloaded from "
            f"checkpoints/ckpt_1/download has SHA-256 {found}, not the {fake_lab.downloads['ckpt_1'][1]} Lab recorded"
        ),
    )
    assert not (tmp_path / "work" / "resume" / "ckpt_1").exists()
