"""A live event stream, its reader and an engine reporting to it."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import httpx
from django.conf import settings as django_settings

from jobs.ingest.tokens import job_token
from jobs.models import Job, JobStatus
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor
from tests.support.stack import LabStack

NOW = "2026-11-29T22:16:31Z"


def _web(tmp_path, **env: str) -> LabStack:
    # The test process signs job tokens and sessions: the server must share its secret key.
    stack = LabStack(tmp_path / "stack", SECRET_KEY=django_settings.SECRET_KEY, **env)
    stack.data_dir.mkdir(parents=True, exist_ok=True)
    stack.start_web()
    return stack


@dataclass
class Frame:
    id: str | None
    event: str
    data: dict


class Reader:
    """A raw ``text/event-stream`` reader that keeps every frame and comment it saw."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, params: dict | None = None):
        self.url, self.headers, self.params = url, headers or {}, params
        self.frames: list[Frame] = []
        self.comments: list[str] = []
        self.status_code: int | None = None
        self.closed_by_server = False
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self, *, until=lambda reader: False, timeout: float = 30) -> Reader:
        """Read in this thread until the server ends the stream, ``until`` holds, or ``timeout``."""
        deadline = time.monotonic() + timeout
        with httpx.stream("GET", self.url, headers=self.headers, params=self.params, timeout=timeout) as response:
            self.status_code = response.status_code
            if response.status_code != 200:
                self.body = response.read()
                return self
            event, data, event_id = "message", [], None
            for line in response.iter_lines():
                if line == "":
                    if data:
                        self.frames.append(Frame(event_id, event, json.loads("\n".join(data))))
                    event, data, event_id = "message", [], None
                    if until(self) or self._stop.is_set() or time.monotonic() > deadline:
                        return self
                    continue
                if line.startswith(":"):
                    self.comments.append(line)
                    if until(self) or self._stop.is_set() or time.monotonic() > deadline:
                        return self
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    event = value
                elif name == "data":
                    data.append(value)
                elif name == "id":
                    event_id = value
            self.closed_by_server = True
        return self

    def start(self, **kwargs) -> Reader:
        """Read in a background thread."""

        def run():
            try:
                self.read(**kwargs)
            except BaseException as exc:  # noqa: BLE001  (reported by join)
                self.error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float = 60) -> Reader:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream reader is still reading"
        if self.error:
            raise self.error
        return self

    def stop(self) -> None:
        self._stop.set()

    def numbered(self) -> list[Frame]:
        return [frame for frame in self.frames if frame.id is not None]


class Engine:
    """Reports to the ingest API over HTTP, as the engine does."""

    def __init__(self, stack: LabStack, job: Job):
        self.attempt = job.attempts.get(number=job.attempt)
        self.base = f"{stack.base_url}/api/v1/ingest/jobs/{job.public_id}"
        self.headers = {"Authorization": f"Bearer {job_token(self.attempt)}"}

    def post(self, path: str, body: dict) -> dict:
        response = httpx.post(f"{self.base}/{path}", json={"attempt": self.attempt.number, **body}, headers=self.headers)
        assert response.status_code in (200, 201), response.text
        return response.json()

    def metrics(self, *steps: int) -> None:
        self.post(
            "metrics",
            {"points": [{"step": s, "time": NOW, "values": {"reward/mean": s / 10, "loss/mean": 1.0}} for s in steps]},
        )

    def logs(self, *lines: tuple[int, str]) -> None:
        self.post("logs", {"lines": [{"seq": seq, "time": NOW, "stream": "stdout", "line": text} for seq, text in lines]})

    def samples(self, step: int, count: int) -> None:
        self.post(
            "samples",
            {
                "samples": [
                    {"step": step, "group": g, "prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5}
                    for g in range(count)
                ]
            },
        )


def running_job(owner, spec, stack: LabStack, *, max_steps: int = 1000) -> tuple[Job, Engine]:
    spec = {**spec, "max_steps": max_steps}  # by default room for every step the tests report
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    job_claim_for_start(job_id=job.pk)
    job = Job.objects.unscoped().get(pk=job.pk)
    engine = Engine(stack, job)
    engine.post("status", {"phase": "running", "step": 0})
    return job, engine


def stream_url(stack: LabStack, job: Job) -> str:
    return f"{stack.base_url}/api/v1/jobs/{job.public_id}/stream"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def finish(job: Job) -> None:
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.SUCCEEDED, message="done")
