"""Tests for the ``lab`` command line against a fake Lab on a real local socket."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from labsdk.cli import main

from tests.sdk.fake_lab import error_body
from tests.support.spec_examples import DESIGN_EXAMPLE_TOML, PRIME_ONLY_TOML


@pytest.fixture
def spec_file(tmp_path):
    def write(text, name="job.toml"):
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return str(path)
    return write


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_jobs_create_prints_the_job_id(lab_env, capsys, spec_file):
    status, out, err = run(capsys, "jobs", "create", "-f", spec_file(DESIGN_EXAMPLE_TOML))

    assert (status, out, err) == (0, "job_0001\n", "")
    assert lab_env.jobs["job_0001"]["name"] == "addition-smollm2"


def test_jobs_create_takes_a_name_and_prints_prime_warnings(lab_env, capsys, spec_file):
    spec_file("HF_TOKEN=hf_from_file\n", name="secrets.env")
    status, out, err = run(capsys, "jobs", "create", "-f", spec_file(PRIME_ONLY_TOML), "--name", "prime-run")

    assert status == 0 and out == "job_0001\n"
    assert err.count("warning: ") == 4  # env_files were read here, and left out of the spec
    assert "'wandb' is a Prime Intellect setting" in err
    assert lab_env.jobs["job_0001"]["name"] == "prime-run"
    assert "env_files" not in lab_env.jobs["job_0001"]["spec"]
    assert lab_env.secrets == [{"HF_TOKEN": "hf_from_file"}]


def test_jobs_create_sends_secrets_from_the_spec_files_the_command_line_and_env_files(
    lab_env, capsys, spec_file, monkeypatch
):
    monkeypatch.setenv("FROM_SHELL", "shell-value")
    spec_file('A=from-spec\nB="quoted ${FROM_SHELL}"\nexport C=\'${literal}\'\n# comment\n', name="secrets.env")
    extra = spec_file("A=from-env-file\n", name="extra.env")
    path = spec_file(PRIME_ONLY_TOML)

    status, out, err = run(capsys, "jobs", "create", "-f", path, "--env-file", extra, "-e", "D=x=y", "-e", "FROM_SHELL")

    assert status == 0, err
    assert lab_env.secrets == [{
        "A": "from-env-file", "B": "quoted shell-value", "C": "${literal}", "D": "x=y", "FROM_SHELL": "shell-value",
    }]
    assert "shell-value" not in out + err


@pytest.mark.parametrize("argv, message", [
    (["-e", "1BAD=x"], "error: -e: '1BAD' is not an environment variable name"),
    (["-e", "UNSET_HERE"], "error: -e UNSET_HERE: UNSET_HERE is not set in this environment"),
    (["--env-file", "missing.env"], "missing.env"),
])
def test_jobs_create_refuses_unreadable_secrets_and_sends_nothing(lab_env, capsys, spec_file, monkeypatch, argv, message):
    monkeypatch.delenv("UNSET_HERE", raising=False)
    path = spec_file(DESIGN_EXAMPLE_TOML)

    status, out, err = run(capsys, "jobs", "create", "-f", path, *argv)

    assert status == 1 and out == ""
    assert message in err
    assert lab_env.count("POST", "/api/v1/jobs") == 0


def test_a_secrets_file_over_64_kb_is_refused(lab_env, capsys, spec_file):
    big = spec_file("KEY=" + "x" * 65_536 + "\n", name="big.env")

    status, _, err = run(capsys, "jobs", "create", "-f", spec_file(DESIGN_EXAMPLE_TOML), "--env-file", big)

    assert status == 1
    assert "a secrets file may hold at most 65536 bytes" in err
    assert lab_env.count("POST", "/api/v1/jobs") == 0


def test_jobs_create_json_prints_the_job(lab_env, capsys, spec_file):
    status, out, _ = run(capsys, "jobs", "create", "-f", spec_file(DESIGN_EXAMPLE_TOML), "--json")

    assert status == 0
    assert json.loads(out)["id"] == "job_0001"
    assert json.loads(out)["spec"]["env"] == [{"id": "lab/addition", "args": {"max_operand": 20}}]


def test_jobs_create_prints_every_server_problem_and_fails(lab_env, capsys, spec_file):
    text = 'model = "m"\nbatch_size = 30\n[sampling]\ntemperature = 3.0\n[[env]]\nid = "addition"\n'

    status, out, err = run(capsys, "jobs", "create", "-f", spec_file(text))

    assert status == 1 and out == ""
    assert err.splitlines() == [
        "error: 3 problems (invalid_spec)",
        "  sampling.temperature: Input should be less than or equal to 2 [out_of_range]",
        '  env.0.id: must be an environment id like "lab/addition" or "owner/name@version" [invalid_value]',
        (
            "  batch_size: batch_size (30) must be a multiple of rollouts_per_example (4): "
            "each step trains on whole groups [not_divisible]"
        ),
    ]
    assert lab_env.jobs == {}


def test_jobs_create_refuses_nan_locally_since_json_cannot_carry_it(lab_env, capsys, spec_file):
    text = 'model = "m"\n[sampling]\ntemperature = nan\n[[env]]\nid = "lab/addition"\n'

    status, _, err = run(capsys, "jobs", "create", "-f", spec_file(text))

    assert status == 1
    assert err.splitlines()[1] == "  sampling.temperature: Input should be a finite number [invalid_value]"
    assert lab_env.requests == []


def test_jobs_create_refuses_a_broken_file_without_a_traceback(lab_env, capsys, spec_file):
    status, _, err = run(capsys, "jobs", "create", "-f", spec_file(b'model = "caf\xe9"\n'))

    assert status == 1
    assert "not UTF-8" in err and "[invalid_encoding]" in err
    assert "Traceback" not in err
    assert lab_env.requests == []


def test_jobs_create_reports_a_missing_file(lab_env, capsys, tmp_path):
    status, _, err = run(capsys, "jobs", "create", "-f", str(tmp_path / "missing.toml"))

    assert status == 1
    assert err == f"error: No such file or directory: {tmp_path / 'missing.toml'}\n"


def test_it_reports_an_unreachable_lab(capsys, sleeps, monkeypatch, spec_file):
    monkeypatch.setenv("LAB_API_KEY", "lab_key")
    monkeypatch.setenv("LAB_BASE_URL", "http://127.0.0.1:9")

    status, _, err = run(capsys, "models")

    assert status == 1
    assert err.startswith("error: could not reach Lab at http://127.0.0.1:9/api/v1")


def test_jobs_list_shows_a_table_and_json(lab_env, capsys):
    for _ in range(3):
        lab_env.add_job(name="addition")

    status, out, _ = run(capsys, "jobs", "list", "--limit", "2")
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "STEP", "CREATED"]
    assert [line.split()[0] for line in lines[1:]] == ["job_0003", "job_0002"]

    status, out, _ = run(capsys, "jobs", "list", "--json", "--status", "queued", "--metadata", "team=x")
    assert status == 0 and json.loads(out) == []
    assert lab_env.requests[-1].query["metadata[team]"] == ["x"]


def test_jobs_without_a_command_lists_as_lab_envs_does(lab_env, capsys):
    for _ in range(2):
        lab_env.add_job(name="addition")
    status, out, _ = run(capsys, "jobs")
    assert status == 0
    assert [line.split()[0] for line in out.splitlines()] == ["ID", "job_0002", "job_0001"]
    status, out, _ = run(capsys, "jobs", "--json")
    assert status == 0 and [job["id"] for job in json.loads(out)] == ["job_0002", "job_0001"]


def test_jobs_list_refuses_a_malformed_metadata_filter(lab_env, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["jobs", "list", "--metadata", "team"])

    assert caught.value.code == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_jobs_get_cancel_and_events(lab_env, capsys):
    job = lab_env.add_job(name="addition", metadata={"team": "research"})

    status, out, _ = run(capsys, "jobs", "get", job["id"])
    assert status == 0
    assert "queued (waiting)" in out and "team=research" in out and "0/20" in out

    assert run(capsys, "jobs", "events", job["id"])[1].splitlines()[1].split()[2:4] == ["info", "job.queued"]
    assert run(capsys, "jobs", "cancel", job["id"])[:2] == (0, f"{job['id']} cancelled\n")

    status, _, err = run(capsys, "jobs", "cancel", job["id"])
    assert (status, err) == (1, "error: Job is already cancelled. (invalid_state)\n")


def test_jobs_get_unknown_id_fails_with_the_server_message(lab_env, capsys):
    assert run(capsys, "jobs", "get", "job_nope")[::2] == (1, "error: No such job. (not_found)\n")


def test_jobs_wait_exits_zero_on_success_and_one_on_failure(lab_env, capsys, monkeypatch):
    good = lab_env.add_job()
    lab_env.timelines[good["id"]] = [
        {"status": "running", "step": 3, "reward": 0.5}, {"status": "succeeded", "step": 20},
    ]
    bad = lab_env.add_job()
    lab_env.timelines[bad["id"]] = [{"status": "failed", "error": {"code": "oom", "message": "Out of memory."}}]

    with monkeypatch.context() as terminal:
        terminal.setattr(sys.stderr, "isatty", lambda: True)  # the progress bar is drawn on a terminal only
        status, out, err = run(capsys, "jobs", "wait", good["id"])
    assert (status, out) == (0, f"{good['id']} succeeded\n")
    assert "reward/mean=0.500" in err

    status, out, err = run(capsys, "jobs", "wait", bad["id"], "--json")
    assert status == 1
    assert json.loads(out)["error"]["code"] == "oom"
    assert err == f"error: job {bad['id']} failed (oom: Out of memory.)\n"


def test_jobs_wait_into_a_pipe_or_a_file_draws_no_progress_bar(lab_env, capsys):
    job = lab_env.add_job()
    lab_env.timelines[job["id"]] = [
        {"status": "running", "step": 3, "reward": 0.5}, {"status": "succeeded", "step": 20},
    ]

    status, out, err = run(capsys, "jobs", "wait", job["id"])  # capsys: stdout and stderr are no terminal

    assert (status, out, err) == (0, f"{job['id']} succeeded\n", "")


def test_spec_check_lists_every_local_problem_without_lab(capsys, spec_file, monkeypatch):
    monkeypatch.delenv("LAB_API_KEY", raising=False)
    text = 'modle = "x"\nmax_steps = 0\n[[env]]\nid = "lab/addition"\nargs = { a = inf }\n'

    status, out, err = run(capsys, "spec", "check", spec_file(text))

    assert status == 1 and out == ""
    assert "4 problems" in err.splitlines()[0]
    assert "  model: 'model' is required [required]" in err
    assert "  max_steps: Input should be greater than or equal to 1 [out_of_range]" in err
    assert "  env.0.args.a: NaN and infinity are not allowed [invalid_value]" in err
    assert "  modle: unknown key 'modle' (did you mean 'model'?); allowed keys: name, model," in err


def test_spec_check_passes_locally_when_no_lab_is_configured(capsys, spec_file, monkeypatch):
    monkeypatch.delenv("LAB_API_KEY", raising=False)

    spec_file("HF_TOKEN=hf_from_file\n", name="secrets.env")
    status, out, err = run(capsys, "spec", "check", spec_file(PRIME_ONLY_TOML))

    assert status == 0
    assert "valid locally; its model and environments were not checked (no LAB_API_KEY)" in out
    assert err.count("warning: ") == 4


def test_spec_check_warns_that_episode_limits_do_nothing_on_a_single_turn_environment(capsys, spec_file, monkeypatch):
    monkeypatch.delenv("LAB_API_KEY", raising=False)
    text = 'model = "lab/tiny-random-llama"\nmax_steps = 3\n[[env]]\nid = "lab/reverse-text"\nmax_turns = 4\n'

    status, out, err = run(capsys, "spec", "check", spec_file(text))

    assert status == 0 and "valid locally" in out
    assert err == (
        "warning: 'env.0.max_turns': lab/reverse-text is a single-turn environment (one completion per example), "
        "so max_turns, which bounds the turns of a multi-turn episode, has no effect on it; it is stored and ignored\n"
    )


def test_spec_check_asks_lab_for_an_estimate_when_configured(lab_env, capsys, spec_file):
    status, out, _ = run(capsys, "spec", "check", spec_file(DESIGN_EXAMPLE_TOML), "--json")

    assert status == 0
    result = json.loads(out)
    assert result["valid"] is True and result["errors"] == []
    assert result["estimate"]["cost_usd"] == "0.01"
    assert lab_env.count("POST", "/api/v1/jobs/estimate") == 1
    assert lab_env.jobs == {}


def test_spec_check_reports_the_servers_catalogue_problems(lab_env, capsys, spec_file):
    body = error_body(400, "invalid_spec", "environment 'primeintellect/reverse-text' is not installed", [
        {"param": "env.0.id", "code": "unknown_environment",
         "message": "environment 'primeintellect/reverse-text' is not installed; installed environments: lab/addition"},
    ])
    lab_env.fail_next = [(400, {}, body)]

    status, _, err = run(capsys, "spec", "check", spec_file(DESIGN_EXAMPLE_TOML))

    assert status == 1
    assert "  env.0.id: environment 'primeintellect/reverse-text' is not installed; installed environments: " \
           "lab/addition [unknown_environment]" in err


def test_models_envs_and_whoami(lab_env, capsys):
    status, out, _ = run(capsys, "models")
    assert status == 0 and "lab/tiny-random-llama" in out and "8192" in out

    status, out, _ = run(capsys, "envs", "--json")
    assert status == 0 and json.loads(out)[0]["id"] == "lab/addition"

    status, out, _ = run(capsys, "whoami")
    assert status == 0 and out.splitlines()[0] == "organization: acme (Acme)"


def test_the_console_script_is_installed():
    script = Path(sys.executable).with_name("lab")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, "LAB_API_KEY": ""})

    assert result.returncode == 0
    assert result.stdout.startswith("labsdk ")


def test_prices_shows_the_price_table(lab_env, capsys):
    status, out, _ = run(capsys, "prices")

    assert status == 0
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [["cpu", "0.10"], ["H100", "2.50"]]


def test_jobs_list_refuses_a_limit_below_one(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["jobs", "list", "--limit", "0"])

    assert caught.value.code == 2
    assert "at least 1" in capsys.readouterr().err


def test_jobs_restart_delete_logs_and_checkpoints(lab_env, capsys):
    job = lab_env.add_job(status="failed")
    lab_env.logs[job["id"]] = [{"seq": 1, "time": None, "attempt": 1, "stream": "stdout", "line": "step 1"}]
    lab_env.checkpoints[job["id"]] = [{"id": "ckpt_7", "job_id": job["id"], "step": 5, "attempt": 1,
                                       "status": "ready", "format": "peft-lora", "size_bytes": 1024}]

    assert run(capsys, "jobs", "logs", job["id"])[:2] == (0, "step 1\n")
    assert run(capsys, "jobs", "checkpoints", job["id"])[1].splitlines()[1].split()[:5] == [
        "ckpt_7", "5", "1", "ready", "peft-lora",
    ]
    assert run(capsys, "jobs", "restart", job["id"])[:2] == (0, f"{job['id']} queued: attempt 2 will run from the start\n")
    lab_env.jobs[job["id"]].update(status="failed", attempt=2, latest_checkpoint={"id": "ckpt_7", "step": 5})
    assert run(capsys, "jobs", "restart", job["id"])[1] == f"{job['id']} queued: attempt 3 will run from ckpt_7 (step 5)\n"
    lab_env.jobs[job["id"]]["status"] = "cancelled"
    assert run(capsys, "jobs", "delete", job["id"])[:2] == (0, f"{job['id']} deleted\n")
    assert lab_env.jobs == {}


def test_checkpoints_download_writes_the_archive(lab_env, capsys, tmp_path):
    lab_env.archives["ckpt_7"] = b"archive bytes"
    target = tmp_path / "out.tar"

    status, out, _ = run(capsys, "checkpoints", "download", "ckpt_7", "--tar", "-o", str(target))

    assert (status, out) == (0, f"{target}\n")
    assert target.read_bytes() == b"archive bytes"


def test_jobs_logs_follow_prints_lines_from_the_live_stream(lab_env, capsys):
    job = lab_env.add_job()
    lab_env.streams[job["id"]] = [
        {"id": 1, "event": "log", "data": {"seq": 1, "time": None, "attempt": 1, "stream": "stdout", "line": "a"}},
        {"id": 2, "event": "metrics", "data": {"step": 1, "values": {}}},
        {"id": 3, "event": "log", "data": {"seq": 2, "time": None, "attempt": 1, "stream": "stderr", "line": "b"}},
        {"id": 4, "event": "status", "data": {**job, "status": "succeeded"}},
    ]

    assert run(capsys, "jobs", "logs", job["id"], "--follow")[:2] == (0, "a\nb\n")


def test_it_prints_problems_that_lack_fields_without_a_traceback(lab_env, capsys):
    body = {"error": {"type": "invalid_request_error", "code": "invalid_spec", "message": "Bad.",
                      "errors": [{"message": "no path here"}, "not even an object"]}}
    lab_env.fail_next = [(400, {}, body)]

    status, _, err = run(capsys, "whoami")

    assert (status, err) == (1, "error: Bad. (invalid_spec)\n  <spec>: no path here\n")


def test_jobs_create_wait_prints_the_id_then_waits(lab_env, capsys, spec_file, monkeypatch):
    original_route = lab_env.route

    def route(method, path, query, body):
        answer = original_route(method, path, query, body)
        if method == "POST" and path == "/api/v1/jobs":
            lab_env.timelines[answer[2]["id"]] = [{"status": "running", "step": 1}, {"status": "succeeded", "step": 20}]
        return answer

    monkeypatch.setattr(lab_env, "route", route)

    status, out, _ = run(capsys, "jobs", "create", "-f", spec_file(DESIGN_EXAMPLE_TOML), "--wait", "--no-progress")

    assert (status, out) == (0, "job_0001\njob_0001 succeeded\n")


def test_jobs_metrics_shows_one_row_per_step(lab_env, capsys):
    job = lab_env.add_job()
    lab_env.metrics[job["id"]] = [
        {"step": 1, "time": None, "attempt": 1, "values": {"reward/mean": 0.125, "loss/mean": 0.5}},
        {"step": 2, "time": None, "attempt": 1, "values": {"reward/mean": 0.25}},
    ]

    status, out, _ = run(capsys, "jobs", "metrics", job["id"])

    assert status == 0
    assert [line.split() for line in out.splitlines()] == [
        ["STEP", "reward/mean", "loss/mean"], ["1", "0.125", "0.5"], ["2", "0.25"],
    ]
    status, out, _ = run(capsys, "jobs", "metrics", job["id"], "--names", "reward/mean", "--json")
    assert [point["values"] for point in json.loads(out)] == [{"reward/mean": 0.125}, {"reward/mean": 0.25}]


def test_tables_never_cut_ids_on_narrow_terminals(lab_env, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "50")

    status, out, _ = run(capsys, "models")

    assert status == 0
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in out
    assert "…" not in out


def test_jobs_get_shows_zero_cost_as_money(lab_env, capsys):
    job = lab_env.add_job()

    assert "0 GPU-s, 0 CPU-s, $0.00" in run(capsys, "jobs", "get", job["id"])[1]


def test_spec_check_says_the_file_is_valid_locally_when_lab_is_unreachable(capsys, sleeps, monkeypatch, spec_file):
    monkeypatch.setenv("LAB_API_KEY", "lab_key")
    monkeypatch.setenv("LAB_BASE_URL", "http://127.0.0.1:9")
    path = spec_file(DESIGN_EXAMPLE_TOML)

    status, out, err = run(capsys, "spec", "check", path)

    assert status == 1
    assert out == f"{path}: valid locally; Lab was not reached to check the catalogues and the pool\n"
    assert err.startswith("error: could not reach Lab")
