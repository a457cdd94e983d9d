"""The CLI at 80 columns: tables fit the terminal and never split an id, a name, a timestamp or
a metric name across lines (a timestamp may put its time under its date). Run as a user would:
the installed ``lab`` script in a subprocess with ``COLUMNS=80``, against the fake Lab."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from labsdk.cli import main

from tests.sdk.fake_lab import API_KEY, ENVIRONMENTS

LAB = Path(sys.executable).with_name("lab")
JOB = "job_d3pw7wl8pc9fu7f0yory"
OTHER = "job_k2m9x7wl8pc9fu7f0yabc"
CHECKPOINT = "ckpt_gxsnfaqcanb45azwvm52"
METRICS = {
    "reward/mean": 0.713, "loss/mean": 0.0123, "entropy/mean": 1.25, "seq_len/mean": 33.0,
    **{f"reward/vowel-count/exact_match_{n}/mean": 0.5 for n in range(5)},
}
PACKAGE = {"id": "acme/vowel-count@0.1.0", "name": "vowel-count", "kind": "package",
           "description": "Count the vowels of a word; the reward is 1 for the exact count.",
           "args": {"min_length": 3, "max_length": 12}, "pushed_by": "api_key:key_xhhyq9abcdef",
           "created_at": "2026-12-05T10:11:12Z"}


@pytest.fixture
def jobs(lab_env, monkeypatch):
    lab_env.add_job(id=JOB, name="smol-reverse-lr1e-4", status="running", step=7, created_at="2026-12-05T10:11:12Z")
    lab_env.add_job(id=OTHER, name="smol-reverse-lr3e-5", status="succeeded", step=20,
                    created_at="2026-12-04T09:08:07Z")
    lab_env.checkpoints[JOB] = [{"id": CHECKPOINT, "job_id": JOB, "step": 10, "attempt": 1, "status": "ready",
                                 "format": "peft-lora", "size_bytes": 62_600_000, "created_at": "2026-12-05T10:21:12Z"}]
    lab_env.metrics[JOB] = [{"step": step, "time": None, "attempt": 1, "values": METRICS} for step in (1, 2, 3)]
    lab_env.metrics[OTHER] = [{"step": 20, "time": None, "attempt": 1, "values": {"reward/mean": 0.25}}]
    monkeypatch.setattr("tests.sdk.fake_lab.ENVIRONMENTS", [*ENVIRONMENTS, PACKAGE])
    return lab_env


def lab80(lab_env, *argv: str) -> str:
    env = {**os.environ, "LAB_API_KEY": API_KEY, "LAB_BASE_URL": lab_env.url, "COLUMNS": "80"}
    result = subprocess.run([str(LAB), *argv], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_tables_fit_80_columns_and_keep_every_token_whole(jobs):
    cases = {
        ("jobs", "list"): [JOB, OTHER, "smol-reverse-lr1e-4", "smol-reverse-lr3e-5", "2026-12-05 10:11:12", "7/20"],
        ("checkpoints", "list", JOB): [CHECKPOINT, "peft-lora", "62.6 MB", "2026-12-05 10:21:12"],
        ("envs",): ["lab/addition", "acme/vowel-count@0.1.0", "max_operand=20", "min_length=3", "2026-12-05"],
        ("jobs", "metrics", "--all", JOB): [*METRICS, "0.713", "0.0123"],
        ("jobs", "compare", JOB, OTHER): [JOB, OTHER, "smol-reverse-lr1e-4", "reward/mean", "0.713", "0.25"],
    }
    for argv, tokens in cases.items():
        out = lab80(jobs, *argv)
        lines = out.splitlines()
        words = {word for line in lines for word in line.split()}

        assert max(len(line.rstrip()) for line in lines) <= 80, (argv, out)
        for token in tokens:
            for word in token.split():
                assert word in words, (argv, word, out)


def test_into_a_pipe_without_columns_every_row_is_whole_on_one_line(jobs, monkeypatch):
    sorting = {"id": "lab/alphabet-sort", "name": "alphabet-sort", "kind": "builtin",
               "description": "Sort the given words alphabetically and reply with them joined by spaces, one reply per prompt.",
               "args": {"min_words": 3, "max_words": 6, "word_list": "common-english-nouns-and-verbs"}}
    monkeypatch.setattr("tests.sdk.fake_lab.ENVIRONMENTS", [*ENVIRONMENTS, sorting, PACKAGE])
    env = {name: value for name, value in os.environ.items() if name != "COLUMNS"}
    env.update(LAB_API_KEY=API_KEY, LAB_BASE_URL=jobs.url)
    result = subprocess.run([str(LAB), "envs"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr

    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["ID", "lab/addition", "lab/alphabet-sort", "acme/vowel-count@0.1.0"]
    (row,) = [line for line in lines if line.startswith("lab/alphabet-sort")]
    assert row.split() == [
        "lab/alphabet-sort", "builtin", "min_words=3", "max_words=6", 'word_list="common-english-nouns-and-verbs"',
        *sorting["description"].split(),
    ]
    assert max(len(line.rstrip()) for line in lines) > 80  # wider than a terminal's default: nothing wrapped


def test_metrics_all_never_cuts_a_header_however_many_metrics(jobs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")

    assert main(["jobs", "metrics", "--all", JOB]) == 0
    out = capsys.readouterr().out
    headers = [word for line in out.splitlines() if line.startswith("STEP") for word in line.split()[1:]]

    assert sorted(headers) == sorted(METRICS)
    assert out.count("STEP") == 1  # 300 columns hold them all in one table


def test_jobs_compare_puts_final_metrics_side_by_side(jobs, capsys):
    assert main(["jobs", "compare", JOB, OTHER, "--json"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)

    assert [(row["id"], row["final"]["reward/mean"]) for row in rows] == [(JOB, 0.713), (OTHER, 0.25)]
    assert "loss/mean" not in rows[1]["final"]


def test_jobs_samples_shows_the_latest_steps_rollouts(jobs, capsys):
    jobs.samples[JOB] = [
        {"step": step, "group": 0, "prompt": [{"role": "user", "content": "Reverse: lab"}],
         "completion": completion, "reward": reward, "advantage": 0.5, "metrics": {}}
        for step, completion, reward in ((2, "bla", 0.0), (3, "bal", 1.0))
    ]

    assert main(["jobs", "samples", JOB, "--prompt"]) == 0
    out = capsys.readouterr().out

    assert "bal" in out and "bla" not in out and "user: Reverse: lab" in out
    assert out.splitlines()[0].split() == ["STEP", "GROUP", "REWARD", "ADVANTAGE", "PROMPT", "COMPLETION"]


def test_jobs_get_shows_a_long_error_whole(jobs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    message = ("environment_error at load: VowelCount.__init__() takes no argument 'max_digit'; allowed: "
               "min_digits, max_digits (/home/user/envs/vowel_count/src/vowel_count/environment_with_a_long_name.py:42)")
    jobs.jobs[JOB].update(status="failed", error={"code": "environment_error", "message": message})

    assert main(["jobs", "get", JOB]) == 0
    out = capsys.readouterr().out

    assert message in out.splitlines()  # one line, for the terminal to wrap: nothing folded or cut


def test_billing_alone_shows_the_balance(jobs, capsys):
    jobs.balance = {"plan": "prepaid", "balance_usd": "12.50", "spend_limit_usd": None,
                    "spent_this_month_usd": "0.30", "payment_failed": False, "billing_enabled": True}

    assert main(["billing"]) == 0
    assert "balance:          $12.50" in capsys.readouterr().out
