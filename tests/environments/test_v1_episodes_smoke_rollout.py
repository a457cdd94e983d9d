"""A build's smoke rollout of a multi-turn verifiers v1 taskset plays whole episodes as a job plays
them (engine/environments/smoke_rollout.py ``v1_episodes_rollout``, through the verifiers bridge):
the environment's own turn code runs after the stub model's first reply, its rewards are the
episodes', and an environment turn that raises fails the probe naming the error."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from engine.environments import probe, smoke_rollout
from tests.environments.verifiers_wheels import (
    CALC_TASKSET,
    CALC_TOOLS,
    GUESS_ENV,
    REFEREE_LEFT_ENV,
    require_verifiers_python,
)

REPO = Path(__file__).resolve().parents[2]


def _probe(tmp_path: Path, module: str, files: dict[str, str] | None = None, *, source_root: Path | None = None) -> dict:
    """The summary the build's probe (with its smoke rollout) writes of ``module``, whose files are
    ``files`` (written under ``tmp_path / "src"``) or found under ``source_root``."""
    root = source_root or tmp_path / "src"
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    out = tmp_path / "summary.json"
    result = subprocess.run(
        [str(require_verifiers_python()), "-s", probe.__file__, module, "verifiers", "", str(out), "rollout"],
        env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text()) | {"log": result.stderr}


def test_a_multi_turn_tasksets_smoke_rollout_plays_whole_episodes_and_records_their_rewards(tmp_path):
    # GuessEnv's secret is at most 20 and the stub answers 42: "Lower." every turn up to the turn cap;
    # solved 0, closeness 0 (22 or more off), numeric 1 x 0.25 (every reply holds a number).
    log = tmp_path / "episodes.jsonl"
    default = '    max_number: int = 20\n    log_path: str = ""\n'
    assert default in GUESS_ENV
    summary = _probe(tmp_path, "guess_env", {"guess_env.py": GUESS_ENV.replace(default, default.replace('""', f'"{log}"'))})
    assert (summary.get("error"), summary["api"], summary["multi_turn"]) == (None, "v1", True), summary
    assert summary["rollout"]["examples"] == smoke_rollout.ROLLOUT_EXAMPLES == 2
    assert summary["rollout"]["rewards"] == [0.25, 0.25]
    assert (summary["rollout"]["reply"], summary["rollout"]["unscored"]) == ("42", [])
    # The Env's own record of each episode: its feedback after every reply; the one after the 4th is refused (the cap).
    episodes = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(episodes) == 2
    for episode in episodes:
        assert (episode["turns"], episode["replies"], episode["stop_condition"]) == (4, ["42"] * 4, "max_turns")
        assert [message["content"] for message in episode["messages"] if message["role"] == "user"][1:] == ["Lower. Guess again."] * 4
        assert episode["rewards"] == {"solved": [0.0, 1.0], "closeness": [0.0, 0.5], "numeric": [1.0, 0.25]}


def test_a_multi_turn_taskset_whose_second_turn_raises_fails_the_probe_naming_the_error(tmp_path):
    summary = _probe(tmp_path, "guess_env", {"guess_env.py": REFEREE_LEFT_ENV})
    assert summary["error"].startswith(
        "the environment's rollout raised EnvError: GuessEnv.run(): RuntimeError: the referee left (it loads, but a smoke rollout of 2 train examples"
    ), summary
    assert "`lab envs try PACKAGE --reply 42`" in summary["error"]
    assert "episode e1 failed: EnvError: GuessEnv.run(): RuntimeError: the referee left" in summary["log"]


def test_the_docs_multi_turn_env_plays_its_episodes_in_the_smoke_rollout(tmp_path):
    """docs/environments.md "A verifiers v1 multi-turn `Env` in a few lines": "42" is neither even
    nor odd (correct 0) and short (0.1 x 1)."""
    page = (REPO / "docs" / "environments.md").read_text()
    section = page.split("## A verifiers v1 multi-turn `Env` in a few lines", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    summary = _probe(tmp_path, "nc_parity", {"nc_parity.py": code})
    assert (summary.get("error"), summary["multi_turn"], summary["rollout"]["rewards"]) == (None, True, [0.1, 0.1]), summary


def test_the_example_letter_guess_package_plays_its_episodes_in_the_smoke_rollout(tmp_path):
    summary = _probe(tmp_path, "letter_guess", source_root=REPO / "examples" / "environments" / "letter-guess" / "src")
    assert (summary.get("error"), summary["multi_turn"], summary["rollout"]["examples"]) == (None, True, 2), summary
    assert summary["rollout"]["rewards"] == [0.0, 0.0]


def test_a_tool_using_tasksets_smoke_rollout_runs_verifiers_own_rollout_with_its_tool_server(tmp_path):
    # The stub calls no tool: each episode ends at its first reply, after its tool server started (its log's "start").
    log = tmp_path / "calc.jsonl"
    source = CALC_TASKSET.replace('    log_path: str = ""\n    task:', f'    log_path: str = "{log}"\n    task:')
    assert source != CALC_TASKSET
    summary = _probe(tmp_path, "calc_env", {"calc_env/__init__.py": source, "calc_env/tools.py": CALC_TOOLS})
    assert (summary.get("error"), summary["multi_turn"], summary["rollout"]["rewards"]) == (None, True, [0.0, 0.0]), summary
    assert [json.loads(line)["event"] for line in log.read_text().splitlines()] == ["start", "start"]


def test_a_multi_turn_tasksets_judge_and_runtime_rewards_are_left_unscored_in_the_smoke_rollout(tmp_path):
    """A build has no network and no sandboxes: an episode whose reward asks a judge on its own
    endpoint is left unscored (its error recorded, its reward 0, the build not failed: verifiers
    scores a task's rewards together) and a reward that takes a runtime is left out, as in a
    single-turn taskset's smoke rollout."""
    anchor = "class GuessTaskset("
    rewards = (
        "    @vf.reward(weight=0.5)\n    async def judged(self, trace: vf.Trace) -> float:\n"
        "        from openai import AsyncOpenAI\n"
        "        judge = AsyncOpenAI(base_url='http://127.0.0.1:9/v1', api_key='none', max_retries=0)\n"
        "        verdict = await judge.chat.completions.create(model='judge', messages=[{'role': 'user', 'content': trace.last_reply}])\n"
        "        return 1.0 if 'yes' in (verdict.choices[0].message.content or '') else 0.0\n\n"
        "    @vf.reward(weight=1.0)\n    async def runs(self, trace: vf.Trace, runtime) -> float:\n"
        "        result = await runtime.run(['python3', '-c', trace.last_reply], {})\n"
        "        return 1.0 if result.exit_code == 0 else 0.0\n\n\n"
    )
    source = GUESS_ENV.replace(anchor, rewards + anchor, 1)
    assert source != GUESS_ENV
    summary = _probe(tmp_path, "guess_env", {"guess_env.py": source})
    assert (summary.get("error"), summary["multi_turn"]) == (None, True), summary
    functions = {function["name"]: function for function in summary["reward_functions"]}
    assert functions["runs"].get("runtime") is True and "runtime" not in functions["judged"]
    assert summary["rollout"]["rewards"] == [0.0, 0.0]
    assert len(summary["rollout"]["unscored"]) == 2 and all(line.startswith("APIConnectionError") for line in summary["rollout"]["unscored"]), summary["rollout"]
    # The runtime's reward alone: left out, the others scored (42 is a number; the secret, at most 20, is not).
    judged = rewards[: rewards.index("    @vf.reward(weight=1.0)")]
    summary = _probe(tmp_path, "guess_env", {"guess_env.py": source.replace(judged, "", 1)})
    assert (summary.get("error"), summary["rollout"]["rewards"], summary["rollout"]["unscored"]) == (None, [0.25, 0.25], []), summary
