"""The engine opens its attempt at pod start (docs/ingest-api.md "Opening an attempt"): against
a local HTTP server standing in for Lab, through the real HTTP transport."""

from __future__ import annotations

import argparse
import json

import pytest
from werkzeug import Response

from engine.commands import attempt
from engine.commands.common import EXIT_INVALID, EXIT_STOPPED
from engine.http_transport import AttemptRefused, open_attempt
from engine.reporter import IngestError

PATH = "/api/v1/ingest/jobs/job_1/attempts"
GRANT = {"attempt": 2, "token": "ljt_2.sig", "resume_from": "ckpt_abc"}


def not_ready() -> Response:
    body = {"error": {"type": "invalid_request_error", "code": "attempt_not_ready", "message": "ask again"}}
    return Response(json.dumps(body), status=409, headers={"Retry-After": "0", "Content-Type": "application/json"})


def test_it_asks_again_while_lab_is_not_ready_then_takes_the_grant(httpserver):
    answers = iter([not_ready(), not_ready(), Response(json.dumps(GRANT), content_type="application/json")])
    seen = []

    def handler(request):
        seen.append((request.headers["Authorization"], request.get_json()))
        return next(answers)

    httpserver.expect_request(PATH, method="POST").respond_with_handler(handler)
    slept = []

    grant = open_attempt(httpserver.url_for(""), "job_1", "ljb_boot", pod_uid="uid-7", jobset="js", sleep=slept.append)

    assert (grant.attempt, grant.token, grant.resume_from) == (2, "ljt_2.sig", "ckpt_abc")
    assert seen == [("Bearer ljb_boot", {"pod_uid": "uid-7", "jobset": "js"})] * 3
    assert slept == [0.0, 0.0]


def test_a_refusal_for_good_is_not_asked_again(httpserver):
    body = {"error": {"type": "invalid_request_error", "code": "invalid_state", "message": "The job has cancelled"}}
    httpserver.expect_oneshot_request(PATH, method="POST").respond_with_json(body, status=409)

    with pytest.raises(AttemptRefused, match="cancelled"):
        open_attempt(httpserver.url_for(""), "job_1", "ljb_boot", pod_uid="uid-7", jobset="js", sleep=lambda s: None)


def test_it_gives_up_after_its_wait(httpserver):
    httpserver.expect_request(PATH, method="POST").respond_with_response(not_ready())

    with pytest.raises(IngestError):
        open_attempt(httpserver.url_for(""), "job_1", "ljb_boot", pod_uid="uid-7", jobset="js", wait_s=0.0)


def test_the_cli_takes_the_attempt_and_resume_point_from_the_grant(httpserver, monkeypatch):
    httpserver.expect_oneshot_request(PATH, method="POST").respond_with_json(GRANT)
    monkeypatch.setenv("LAB_POD_UID", "uid-7")
    monkeypatch.setenv("LAB_JOBSET_NAME", "js")
    args = argparse.Namespace(lab_url=httpserver.url_for(""), job_id="job_1", attempt=1, resume_from=None)

    assert attempt.open_attempt_of(args, "ljb_boot") == "ljt_2.sig"
    assert (args.attempt, args.resume_from) == (2, "ckpt_abc")


def test_the_cli_installs_the_environment_packages_of_the_grant_not_the_secrets(httpserver, monkeypatch):
    """The Secret's download URLs were made at launch; the grant's were made when the pod asked."""
    fresh = [{"id": "acme/my-env@0.1.0", "sha256": "ab" * 32, "url": "https://store/fresh", "filename": "my_env-0.1.0-py3-none-any.whl"}]
    httpserver.expect_oneshot_request(PATH, method="POST").respond_with_json({**GRANT, "environment_packages": fresh})
    monkeypatch.setenv("LAB_POD_UID", "uid-7")
    monkeypatch.setenv("LAB_JOBSET_NAME", "js")
    monkeypatch.setenv("LAB_JOB_ENVIRONMENT_PACKAGES", json.dumps([{**fresh[0], "url": "https://store/expired"}]))
    args = argparse.Namespace(lab_url=httpserver.url_for(""), job_id="job_1", attempt=1, resume_from=None)

    assert attempt.open_attempt_of(args, "ljb_boot") == "ljt_2.sig"
    from engine.packages import packages_from_environment

    assert [package.url for package in packages_from_environment()] == ["https://store/fresh"]


@pytest.mark.parametrize(("answer", "code"), [(None, EXIT_INVALID), ({"status": 409, "code": "invalid_state"}, EXIT_STOPPED)])
def test_the_cli_exits_without_an_attempt_to_run(httpserver, monkeypatch, answer, code):
    if answer is None:
        monkeypatch.delenv("LAB_POD_UID", raising=False)
    else:
        monkeypatch.setenv("LAB_POD_UID", "uid-7")
        httpserver.expect_oneshot_request(PATH, method="POST").respond_with_json(
            {"error": {"type": "invalid_request_error", "code": answer["code"], "message": "no"}}, status=answer["status"])
    monkeypatch.setenv("LAB_JOBSET_NAME", "js")
    args = argparse.Namespace(lab_url=httpserver.url_for(""), job_id="job_1", attempt=1, resume_from=None)

    assert attempt.open_attempt_of(args, "ljb_boot") == code
