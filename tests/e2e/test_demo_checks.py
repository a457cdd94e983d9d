"""The demo's verdicts without starting Lab: the learning check's windows and threshold, and the
settings it refuses."""

from __future__ import annotations

import pytest

from demo.program import DemoError, DemoSettings, check_learning

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_it_passes_learning_when_the_last_five_steps_average_at_least_a_tenth_more():
    rewards = {step: 0.0 for step in range(1, 16)} | {step: 0.1 for step in range(16, 21)}

    check = check_learning(rewards, model=SMOLLM2, max_steps=20)

    assert check.passed is True
    assert check.detail == "0.000 over steps 1-5, 0.100 over steps 16-20 (at least +0.1 needed)"


def test_it_fails_learning_when_the_gain_is_smaller():
    rewards = {step: 0.2 for step in range(1, 16)} | {step: 0.29 for step in range(16, 21)}

    check = check_learning(rewards, model=SMOLLM2, max_steps=20)

    assert check.passed is False
    assert check.detail.startswith("0.200 over steps 1-5, 0.290 over steps 16-20")


def test_it_does_not_judge_learning_on_the_random_model_or_a_short_run():
    rising = {step: step / 20 for step in range(1, 21)}

    tiny = check_learning(rising, model="lab/tiny-random-llama", max_steps=20)
    short = check_learning({1: 0.0, 2: 0.5, 3: 1.0}, model=SMOLLM2, max_steps=3)

    assert tiny.passed is None and "random weights" in tiny.detail
    assert short.passed is None
    assert short.detail == "not checked: 3 steps with a reward, 10 needed"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DEMO_PORT", "http", "DEMO_PORT must be an integer, not 'http'"),
        ("DEMO_PORT", "0", "DEMO_PORT must be at least 1, not 0"),
        ("DEMO_MAX_STEPS", "-3", "DEMO_MAX_STEPS must be at least 1, not -3"),
        ("DEMO_TIMEOUT_S", "1.5", "DEMO_TIMEOUT_S must be an integer, not '1.5'"),
    ],
)
def test_it_names_a_setting_it_cannot_use(tmp_path, name, value, message):
    with pytest.raises(DemoError) as raised:
        DemoSettings.from_environment({"LAB_DATA_DIR": str(tmp_path), name: value})

    assert str(raised.value) == message


def test_its_processes_get_loopback_webhooks_and_their_public_url(tmp_path):
    settings = DemoSettings.from_environment({"LAB_DATA_DIR": str(tmp_path), "DEMO_PORT": "8123"})

    env = settings.process_environment({"DATABASE_URL": "postgres://db/lab"})

    assert env["DATABASE_URL"] == "postgres://db/lab"
    assert env["LAB_PUBLIC_URL"] == "http://127.0.0.1:8123"
    assert env["LAB_WEBHOOK_ALLOW_PRIVATE"] == "1"
    assert env["LAB_DATA_DIR"] == str(tmp_path.resolve())
    assert env["LAB_MODEL_DIR"] == str(tmp_path.resolve() / "models")



@pytest.mark.parametrize("exits", [True, False])
def test_the_summary_names_the_dashboard_login_only_when_lab_keeps_running(tmp_path, capsys, exits):
    import labsdk

    from demo.program import Check, Outcome, print_summary
    from labsdk.webhooks import WebhookReceiver

    environ = {"LAB_DATA_DIR": str(tmp_path), "DEMO_PASSWORD": "pw-123456", **({"DEMO_EXIT": "1"} if exits else {})}
    settings = DemoSettings.from_environment(environ)
    job = labsdk.Job(id="job_1", status="succeeded", max_steps=3, spec={"model": "lab/tiny-random-llama"})
    outcome = Outcome(job=job, run_seconds=5.0, checks=[Check("job succeeded", True, "succeeded")])

    print_summary(outcome, settings=settings, base_url="http://127.0.0.1:8123", api_key="lab_x",
                  receiver=WebhookReceiver(), usage_line="")
    out = capsys.readouterr().out

    assert ("pw-123456" in out, "Dashboard" in out, "LAB_API_KEY=lab_x" in out) == (not exits,) * 3
    assert "  [PASS] job succeeded: succeeded" in out
