"""The engine trains on uploaded verifiers v1 tasksets: tasks from the taskset, prompts through
the policy's chat template, completions from Lab's sampler, rewards from the taskset's own reward
functions through the verifiers bridge (run with .venv-verifiers' Python)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from engine.environments import probe
from engine.environments.verifiers_taskset import bridge_environment
from tests.environments.verifiers_wheels import (
    SPELL_TASKSET,
    read_lines,
    require_verifiers_python,
    run_in_verifiers,
    spell_wheel,
)
from tests.support.packages import run_engine
from tests.support.wheelbuilder import build_wheel

ENV_ID = "acme/spell-env@0.1.0"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The work dir of one tiny job on the spell taskset (40 tasks, two steps), shared by the tests that read it."""
    require_verifiers_python()
    root = tmp_path_factory.mktemp("spell-job")
    result = run_engine(root, ENV_ID, [spell_wheel()], args={"num_tasks": 40})
    assert result.returncode == 0, result.stderr
    return root / "work"


def test_it_trains_on_a_verifiers_taskset_with_one_metric_per_reward_function(trained):
    work = trained
    points = read_lines(work / "metrics.jsonl")
    assert [point["step"] for point in points] == [1, 2]
    for point in points:
        values = point["values"]
        assert {"reward/spell-env/mean", "reward/spell-env/exact/mean", "reward/spell-env/letters/mean",
                "reward/spell-env/short/mean"} <= set(values)
        # The rollout's reward is verifiers' weighted sum: exact x 1 + letters x 0.5 + short x 0.
        expected = values["reward/spell-env/exact/mean"] + 0.5 * values["reward/spell-env/letters/mean"]
        assert abs(values["reward/spell-env/mean"] - expected) < 1e-9
    samples = read_lines(work / "samples.jsonl")
    assert samples and all("spell '" in sample["prompt"] and "Answer with the word only." in sample["prompt"] for sample in samples)
    assert all(set(sample["metrics"]) == {"exact", "letters", "short"} for sample in samples)


# Scores each sample again by calling the taskset's reward methods directly (not Task.score, not
# the bridge): the task is found by its prompt, the trace holds the prompt and the reply.
_DIRECT_SCORES = r'''
import asyncio, json, sys
sys.path.append(sys.argv[1])
import verifiers.v1 as vf
from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage
import spell_env

taskset = spell_env.SpellTaskset(spell_env.SpellConfig(id="spell-env", num_tasks=40))
tasks = list(taskset)
answers = []
for line in open(sys.argv[2]):
    sample = json.loads(line)
    (task,) = [t for t in tasks if t.data.prompt in sample["prompt"]]
    nodes = [MessageNode(message=SystemMessage(content=task.data.system_prompt)),
             MessageNode(parent=0, message=UserMessage(content=task.data.prompt)),
             MessageNode(parent=1, message=AssistantMessage(content=sample["completion"]), sampled=True)]
    trace = Trace(task=TraceTask(type="SpellTask", data=task.data),
                  agent=AgentInfo(config=AgentConfig.model_validate({"harness": {"id": "null"}, "runtime": {"type": "subprocess"}})),
                  nodes=nodes)
    scores = {name: asyncio.run(getattr(task, name)(trace)) for name in ("exact", "letters", "short")}
    answers.append({"functions": scores, "reward": scores["exact"] + 0.5 * scores["letters"]})
print(json.dumps(answers))
'''


def test_labs_rewards_equal_the_tasksets_own_reward_functions_for_the_same_completions(trained, tmp_path):
    work = trained
    samples = read_lines(work / "samples.jsonl")
    assert len(samples) == 8  # two steps, four samples each
    direct = run_in_verifiers(_DIRECT_SCORES, str(work / "environments" / "site"), str(work / "samples.jsonl"), cwd=tmp_path)
    assert direct.returncode == 0, direct.stderr
    expected = json.loads(direct.stdout)
    assert [sample["metrics"] for sample in samples] == [answer["functions"] for answer in expected]
    assert [sample["reward"] for sample in samples] == [answer["reward"] for answer in expected]
    # The tiny model's random replies score something: the comparison is not between zeros only.
    assert any(0.0 < sample["metrics"]["letters"] < 1.0 for sample in samples)


def test_it_exits_2_naming_a_module_missing_from_the_verifiers_environment(tmp_path):
    require_verifiers_python()
    wheel = spell_wheel("needy-spell", "1.0", prelude="import frobnicator_9000", requires=("verifiers>=0.4.0", "frobnicator-9000"))
    result = run_engine(tmp_path, "acme/needy-spell@1.0", [wheel])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "engine: environment acme/needy-spell@1.0 needs the module 'frobnicator_9000', which is not installed in the "
        "verifiers environment (verifiers 0.4.0 and its dependencies, requirements-verifiers.txt; packages install "
        "with --no-deps: every other dependency must already be there)"
    )
    finish = json.loads((tmp_path / "work" / "finish.json").read_text())
    assert finish["error"]["code"] == "environment_error"
    assert not (tmp_path / "work" / "metrics.jsonl").exists()


def test_it_exits_2_for_a_package_that_wants_another_verifiers(tmp_path):
    require_verifiers_python()
    result = run_engine(tmp_path, "acme/old-spell@1.0", [spell_wheel("old-spell", "1.0", requires=("verifiers<0.4",))])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "engine: environment acme/old-spell@1.0 needs verifiers<0.4; this engine runs verifiers 0.4.0"
    )


def test_it_refuses_arguments_the_taskset_config_does_not_have_and_values_of_another_type(tmp_path):
    require_verifiers_python()
    (tmp_path / "unknown").mkdir()
    (tmp_path / "mistyped").mkdir()
    unknown = run_engine(tmp_path / "unknown", ENV_ID, [spell_wheel()], args={"colour": "red"})
    assert unknown.returncode == 2
    assert "env.0.args.colour" in unknown.stderr and "max_length" in unknown.stderr
    mistyped = run_engine(tmp_path / "mistyped", ENV_ID, [spell_wheel()], args={"num_tasks": "many"})
    assert mistyped.returncode == 2
    assert "env.0.args.num_tasks" in mistyped.stderr


def test_it_exits_2_when_the_engine_has_no_verifiers_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_ENGINE_VERIFIERS_PYTHON", str(tmp_path / "nowhere" / "python"))
    result = run_engine(tmp_path, ENV_ID, [spell_wheel()])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"engine: environment {ENV_ID} is a verifiers package, and this engine has no verifiers environment: "
        f"{tmp_path / 'nowhere' / 'python'} does not exist (`make install` creates .venv-verifiers; "
        "LAB_ENGINE_VERIFIERS_PYTHON names another)"
    )


# Run at import of the package, in the bridge: where it runs, with which variables, as which process.
_PROBE = '''
import json as _json, os as _os
with open("bridge-probe.json", "w") as _probe:
    _json.dump({"cwd": _os.getcwd(), "pid": _os.getpid(), "pgid": _os.getpgid(0), "environ": sorted(_os.environ)}, _probe)
'''


def test_the_bridge_runs_in_the_work_dir_without_lab_secrets_in_its_own_group_and_ends_with_the_engine(tmp_path, monkeypatch):
    require_verifiers_python()
    monkeypatch.setenv("LAB_JOB_TOKEN", "lab-token-never-in-the-bridge")
    monkeypatch.setenv("OPENAI_API_KEY", "a-job-secret-never-in-the-bridge")
    result = run_engine(tmp_path, "acme/probe-spell@0.1.0", [spell_wheel("probe-spell", prelude=_PROBE)])
    assert result.returncode == 0, result.stderr
    work = tmp_path / "work"
    probe = json.loads((work / "bridge-probe.json").read_text())
    assert probe["cwd"] == str(work.resolve())
    assert not [name for name in probe["environ"] if name.startswith("LAB_") or name == "OPENAI_API_KEY"]
    assert {"UV_OFFLINE", "HF_HUB_OFFLINE", "PYTHONNOUSERSITE"} <= set(probe["environ"])
    assert probe["pgid"] == probe["pid"] != os.getpgid(0)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{probe['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{probe['pid']}").exists(), "the bridge outlived the engine"


def test_bridge_environment_keeps_the_basics_and_drops_lab_variables_and_secrets():
    environment = bridge_environment({
        "PATH": "/usr/bin", "HOME": "/home/lab", "LC_ALL": "C.UTF-8", "LAB_JOB_TOKEN": "t", "LAB_ENGINE_THREADS": "1",
        "OPENAI_API_KEY": "k", "DATABASE_URL": "postgres://x", "PYTHONPATH": "/work/main",
    })
    assert environment == {
        "PATH": "/usr/bin", "HOME": "/home/lab", "LC_ALL": "C.UTF-8", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1", "UV_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "PIP_NO_INDEX": "1",
    }
    assert bridge_environment({"HOME": "/home/lab"}, home=Path("/work/job/environments/home"))["HOME"] == "/work/job/environments/home"


def test_it_exits_2_for_a_multi_turn_taskset_that_brings_its_own_harness(tmp_path):
    require_verifiers_python()
    source = SPELL_TASKSET.format(prelude="") + (
        "\n\nclass SpellHarness(vf.Harness):\n    async def launch(self, *args, **kwargs):\n        return None\n\n\n"
        '__all__ = ["SpellTaskset", "SpellHarness"]\n'
    )
    wheel = build_wheel("chatty-spell", "0.1.0", files={"chatty_spell/__init__.py": source}, requires=["verifiers>=0.4.0"])
    result = run_engine(tmp_path, "acme/chatty-spell@0.1.0", [wheel])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "engine: environment acme/chatty-spell@0.1.0: brings its own Harness, which Lab does not run (only verifiers' null harness runs)"
    )


def test_it_exits_2_for_a_taskset_whose_tasks_have_no_prompt(tmp_path):
    require_verifiers_python()
    source = SPELL_TASKSET.format(prelude="").replace('prompt=f"Task {index}: spell \'{word}\' backwards.",', "prompt=None,")
    assert "prompt=None," in source
    wheel = build_wheel("mute-spell", "0.1.0", files={"mute_spell/__init__.py": source}, requires=["verifiers>=0.4.0"])
    result = run_engine(tmp_path, "acme/mute-spell@0.1.0", [wheel])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "engine: environment acme/mute-spell@0.1.0: a task has no prompt (the user opens the conversation)"
    )
    assert "rollout backend:" not in result.stderr  # refused before the model loaded (engine.commands.run)


def test_a_reward_function_that_raises_fails_the_job_with_exit_2_not_a_crash(tmp_path):
    """The taskset's own code failing is the job's fault: a retry would fail the same way."""
    require_verifiers_python()
    broken = SPELL_TASKSET.replace(
        "return 1.0 if trace.last_reply == self.data.word[::-1] else 0.0", "raise ValueError('the exact reward broke')"
    )
    assert broken != SPELL_TASKSET
    wheel = build_wheel("broken-spell", "1.0", files={"broken_spell/__init__.py": broken.format(prelude="")},
                        requires=["verifiers>=0.4.0"])
    result = run_engine(tmp_path, "acme/broken-spell@1.0", [wheel])
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("engine: environment acme/broken-spell@1.0: ") and "the exact reward broke" in last, last
    assert json.loads((tmp_path / "work" / "finish.json").read_text())["error"]["code"] == "environment_error"


def test_a_scoring_past_the_timeout_is_cancelled_and_answered_timed_out(tmp_path):
    """[[env]] timeout on a single-turn taskset bounds its scoring (the environment's part of
    the episode; Lab samples the completion itself): a reward function still running past it is
    cancelled and the bridge answers timed out instead of rewards."""
    import io
    import zipfile

    from engine.environments.verifiers_taskset import Bridge, verifiers_python

    require_verifiers_python()
    slow = SPELL_TASKSET.replace(
        "        reply = trace.last_reply\n",
        "        reply = trace.last_reply\n        if reply == 'slow':\n            await asyncio.sleep(60)\n",
    ).format(prelude="import asyncio")
    assert "asyncio.sleep(60)" in slow
    wheel = build_wheel("slow-spell", "1.0", files={"slow_spell/__init__.py": slow}, requires=["verifiers>=0.4.0"])
    zipfile.ZipFile(io.BytesIO(wheel[1])).extractall(tmp_path / "site")
    bridge = Bridge(python=verifiers_python(), site=tmp_path / "site", workdir=tmp_path, package_id="acme/slow-spell@1.0")
    try:
        handle = bridge.request("open", taskset="acme/slow-spell@1.0", args={})["handle"]
        (task,) = bridge.request("tasks", handle=handle, split="train", start=0, n=1, seed=0)["tasks"]
        started = time.monotonic()
        answer = bridge.request("score", handle=handle, task_id=task["id"], completion="slow", timeout_s=0.5)
        assert answer == {"timeout": True, "message": "taskset acme/slow-spell@1.0: scoring took longer than its 0.5s timeout"}
        assert time.monotonic() - started < 10
        scored = bridge.request("score", handle=handle, task_id=task["id"], completion="fast", timeout_s=0.5)
        assert set(scored["functions"]) == {"exact", "letters", "short"}
    finally:
        bridge.close()


@pytest.mark.parametrize("beside_others", [False, True], ids=["alone", "beside-trace-rewards"])
def test_it_exits_2_offline_for_a_taskset_with_a_reward_that_runs_in_a_runtime(tmp_path, beside_others):
    """A reward that runs the reply in verifiers' runtime (its prime sandbox, on Lab's sandboxes of
    the attempt) needs Lab: an engine without it refuses the taskset before any rollout, naming the
    reward, whether or not other rewards read the trace alone (never dropped silently)."""
    require_verifiers_python()
    source = SPELL_TASKSET.format(prelude="")
    start, end = source.index("    @vf.reward(weight=1.0)"), source.index("class SpellTaskset")
    rewards = (
        "    @vf.reward(weight=1.0)\n    async def runs(self, trace: vf.Trace, runtime) -> float:\n"
        "        result = await runtime.run(['python3', '-c', trace.last_reply], {})\n"
        "        return 1.0 if result.exit_code == 0 else 0.0\n\n\n"
    )
    kept = source[start:end] if beside_others else ""
    wheel = build_wheel("boxed-spell", "0.1.0", files={"boxed_spell/__init__.py": source[:start] + kept + rewards + source[end:]},
                        requires=["verifiers>=0.4.0"])
    result = run_engine(tmp_path, "acme/boxed-spell@0.1.0", [wheel])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "engine: environment acme/boxed-spell@0.1.0: its reward function runs takes a runtime (a box to run in: verifiers' "
        "prime sandbox, on Lab's sandboxes of the job's attempt), which an engine without Lab (--offline, lab envs try) "
        "does not have: run it as a job on Lab"
    )
    assert not (tmp_path / "work" / "metrics.jsonl").exists()


def test_a_build_records_which_reward_functions_take_a_runtime(tmp_path):
    """The probe (a build's summary, ``lab envs info``) marks each reward function that takes a
    runtime: a job scores it in a sandbox of its attempt."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "runtime-code"
    out = tmp_path / "summary.json"
    result = subprocess.run(
        [str(require_verifiers_python()), "-s", probe.__file__, "runtime_code", "verifiers", "", str(out)],
        env={**os.environ, "PYTHONPATH": str(fixture)}, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert (summary.get("error"), summary["api"], summary["multi_turn"]) == (None, "v1", False), summary
    assert summary["reward_functions"] == [
        {"name": "box_runs", "weight": 0.0, "runtime": True}, {"name": "prints_sum", "weight": 1.0, "runtime": True},
        {"name": "short", "weight": 0.0},
    ]
