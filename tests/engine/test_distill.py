"""Distillation (`loss = "sft"`, engine.distill): the teacher client against a recording HTTP
server, the SFT loss, and a whole offline job distilling from the engine's own inference server
(`python -m engine inference`, the tiny model) started by the test as the teacher endpoint."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from labsdk.spec import parse_spec
from werkzeug import Response

from engine.distill import (
    TeacherClient,
    TeacherCompletion,
    TeacherRefused,
    TeacherUnavailable,
    teacher_token_ids,
)
from engine.grpo import sft_loss
from tests.support.engine import (
    MODEL,
    teacher_server,  # noqa: F401  (a fixture)
)

from .conftest import REPO_ROOT, tiny_spec, write_spec

CHAT = {"choices": [{"message": {"role": "assistant", "content": "cba"}, "finish_reason": "stop"},
                    {"message": {"role": "assistant", "content": "cb"}, "finish_reason": "length"}]}


def teacher_spec(**client):
    return parse_spec({**tiny_spec(), "loss": "sft", "teacher": {"model": "big/teacher", "client": client}}).spec.teacher


def client_for(httpserver, waits=None, **headers):
    return TeacherClient(base_url=httpserver.url_for("/v1"), model="big/teacher", headers=headers,
                         sleep=(waits.append if waits is not None else lambda seconds: None))


def test_it_sends_the_key_and_headers_from_the_jobs_secrets(httpserver):
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(CHAT)
    teacher = teacher_spec(base_url=httpserver.url_for("/v1/"), api_key_var="TEACHER_KEY", headers_from_env={"X-Org": "TEACHER_ORG"})
    client = TeacherClient.from_spec(teacher, {"TEACHER_KEY": "sk-secret", "TEACHER_ORG": "acme", "OTHER": "x"})
    answer = client.complete([{"role": "user", "content": "reverse: abc"}], n=2, max_tokens=5, temperature=0.5, seed=7,
                             extra_body={"top_p": 1.0, "chat_template_kwargs": {"enable_thinking": False}})
    assert answer == [TeacherCompletion("cba", True), TeacherCompletion("cb", False)]
    request, _ = httpserver.log[0]
    assert request.headers["Authorization"] == "Bearer sk-secret"
    assert request.headers["X-Org"] == "acme"
    assert json.loads(request.data) == {
        "model": "big/teacher", "messages": [{"role": "user", "content": "reverse: abc"}], "n": 2, "max_tokens": 5,
        "temperature": 0.5, "seed": 7, "top_p": 1.0, "chat_template_kwargs": {"enable_thinking": False},
    }


def test_a_missing_secret_is_refused_naming_it_and_a_teacher_without_client_needs_prime_api_key():
    with pytest.raises(TeacherRefused, match="needs the job secret\\(s\\) TEACHER_ORG,"):
        TeacherClient.from_spec(teacher_spec(base_url="http://127.0.0.1:9/v1", api_key_var="TEACHER_KEY",
                                             headers_from_env={"X-Org": "TEACHER_ORG"}), {"TEACHER_KEY": "k"})
    prime = parse_spec({**tiny_spec(), "loss": "sft", "teacher": {"model": "openai/gpt-oss-120b"}}).spec.teacher
    with pytest.raises(TeacherRefused, match="PRIME_API_KEY"):
        TeacherClient.from_spec(prime, {})
    assert TeacherClient.from_spec(prime, {"PRIME_API_KEY": "k"}).base_url == "https://api.pinference.ai/api/v1"


def test_it_retries_503_and_429_with_backoff_then_answers(httpserver):
    httpserver.expect_ordered_request("/v1/chat/completions").respond_with_data("busy", status=503)
    httpserver.expect_ordered_request("/v1/chat/completions").respond_with_response(Response("slow down", 429, {"Retry-After": "3"}))
    httpserver.expect_ordered_request("/v1/chat/completions").respond_with_json(CHAT)
    waits = []
    answer = client_for(httpserver, waits).complete([{"role": "user", "content": "q"}], n=2, max_tokens=5, temperature=1.0, seed=0)
    assert [c.text for c in answer] == ["cba", "cb"]
    assert waits == [0.5, 3.0]


def test_it_gives_up_after_five_failures_as_unavailable(httpserver):
    httpserver.expect_request("/v1/chat/completions").respond_with_data("down", status=502)
    waits = []
    with pytest.raises(TeacherUnavailable, match="failed 5 times on POST /chat/completions: HTTP 502"):
        client_for(httpserver, waits).complete([{"role": "user", "content": "q"}], n=1, max_tokens=5, temperature=1.0, seed=0)
    assert waits == [0.5, 1.0, 2.0, 4.0]


def test_a_4xx_is_refused_at_once_with_the_endpoints_message_and_never_the_key(httpserver):
    httpserver.expect_request("/v1/chat/completions").respond_with_json({"error": {"message": "Incorrect API key provided"}}, status=401)
    waits = []
    with pytest.raises(TeacherRefused) as refused:
        client_for(httpserver, waits, Authorization="Bearer sk-very-secret").complete(
            [{"role": "user", "content": "q"}], n=1, max_tokens=5, temperature=1.0, seed=0)
    assert str(refused.value) == "the teacher endpoint refused POST /chat/completions with HTTP 401: Incorrect API key provided"
    assert waits == [] and len(httpserver.log) == 1


@pytest.mark.parametrize("answer", [{"choices": []}, {"choices": [{"message": {"content": None}}]}, ["not", "an", "object"]])
def test_an_answer_without_the_completions_asked_for_is_unavailable(httpserver, answer):
    httpserver.expect_request("/v1/chat/completions").respond_with_json(answer)
    with pytest.raises(TeacherUnavailable, match="answered 0 usable completions, 1 were asked for"):
        client_for(httpserver).complete([{"role": "user", "content": "q"}], n=1, max_tokens=5, temperature=1.0, seed=0)


def test_the_model_check_reads_the_endpoints_model_list(httpserver):
    httpserver.expect_request("/v1/models").respond_with_json({"object": "list", "data": [{"id": "small/other"}]})
    with pytest.raises(TeacherRefused, match="does not serve 'big/teacher' \\(it lists small/other\\)"):
        client_for(httpserver).check_model()


def test_teacher_tokens_end_with_the_end_token_only_when_the_teacher_stopped():
    class Tokenizer:
        def __call__(self, text, add_special_tokens):
            assert add_special_tokens is False
            return {"input_ids": [ord(ch) for ch in text]}

    assert teacher_token_ids(Tokenizer(), TeacherCompletion("abc", True), end_token_id=2, max_tokens=8) == [97, 98, 99, 2]
    assert teacher_token_ids(Tokenizer(), TeacherCompletion("abc", False), end_token_id=2, max_tokens=8) == [97, 98, 99]
    assert teacher_token_ids(Tokenizer(), TeacherCompletion("abcd", True), end_token_id=2, max_tokens=3) == [97, 98, 99]


def test_the_sft_loss_is_the_mean_negative_log_likelihood_per_token_across_micro_batches():
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.125, 0.9, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    whole = sft_loss(logprobs, mask, num_tokens=3)
    halves = sft_loss(logprobs[:1], mask[:1], num_tokens=3) + sft_loss(logprobs[1:], mask[1:], num_tokens=3)
    expected = -(math.log(0.5) + math.log(0.25) + math.log(0.125)) / 3
    assert float(whole) == pytest.approx(expected) and float(halves) == pytest.approx(expected)


def run_engine(tmp_path, spec_path, env):
    environment = {**os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}", **env}
    return subprocess.run(
        [sys.executable, "-m", "engine", "run", "--job-id", "job_1", "--attempt", "1", "--workdir", str(tmp_path / "work"),
         "--spec", str(spec_path), "--offline"],
        cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=600,
    )


def test_an_sft_job_distils_the_teachers_greedy_completions(tmp_path, teacher_server):  # noqa: F811
    teacher = {"model": MODEL, "client": {"base_url": f"{teacher_server}/v1", "api_key_var": "TEACHER_KEY"},
               "sampling": {"temperature": 0.0, "max_tokens": 6}}
    spec = write_spec(tmp_path / "spec.json", loss="sft", teacher=teacher, max_steps=6, learning_rate=2e-2,
                      checkpoints={"interval": 0, "keep_last": 1})
    done = run_engine(tmp_path, spec, {"TEACHER_KEY": "sk-test-teacher"})
    assert done.returncode == 0, done.stderr[-3000:]
    points = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    losses = [point["values"]["loss/mean"] for point in sorted(points, key=lambda p: p["step"])]
    assert len(losses) == 6 and all(math.isfinite(loss) and loss > 0 for loss in losses)
    # Greedy teacher completions of the same random base: the student learns to reproduce them.
    assert losses[-1] < losses[0] * 0.8, losses
    assert "mismatch_kl/mean" not in points[0]["values"] and "reward/mean" in points[0]["values"]
    samples = [json.loads(line) for line in (tmp_path / "work" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(sample["advantage"] == 0.0 for sample in samples)
    # The teacher samples greedily: both completions of a prompt are the same text.
    first_group = [s["completion"] for s in samples if s["step"] == 1 and s["group"] == 0]
    assert len(first_group) >= 2 and len(set(first_group)) == 1
    everything = done.stdout + done.stderr + "".join(p.read_text(errors="replace") for p in (tmp_path / "work").rglob("*.jsonl"))
    assert "distilling from lab/tiny-random-llama" in done.stderr
    assert "sk-test-teacher" not in everything


def test_an_sft_job_whose_teacher_does_not_serve_the_model_exits_2(tmp_path, teacher_server):  # noqa: F811
    teacher = {"model": "big/teacher", "client": {"base_url": f"{teacher_server}/v1", "api_key_var": "TEACHER_KEY"}}
    spec = write_spec(tmp_path / "spec.json", loss="sft", teacher=teacher, max_steps=1)
    done = run_engine(tmp_path, spec, {"TEACHER_KEY": "k"})
    assert done.returncode == 2
    assert f"engine: the teacher endpoint {teacher_server}/v1 does not serve 'big/teacher' (it lists {MODEL})" in done.stderr


def test_an_sft_job_without_its_teachers_secret_exits_2_naming_it(tmp_path):
    teacher = {"model": MODEL, "client": {"base_url": "http://127.0.0.1:9/v1", "api_key_var": "TEACHER_KEY"}}
    spec = write_spec(tmp_path / "spec.json", loss="sft", teacher=teacher, max_steps=1)
    done = run_engine(tmp_path, spec, {})
    assert done.returncode == 2
    assert "needs the job secret(s) TEACHER_KEY, which this job was not given" in done.stderr
