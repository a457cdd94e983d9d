"""``lab envs try`` as a subprocess, with no Lab running: a package of every kind, written the way
its ecosystem writes it, loaded as a job loads it, its examples shown and replies scored, and its
arguments refused with a submit's words (labsdk/cli/try_environment.py,
engine/commands/try_environment.py). A run costs seconds (a bridge imports verifiers), so a test
reads all it checks from as few runs as it can: the text a ``--json`` run's answer prints as, and
an argument check against the parameters a run's probe recorded, are checked in this process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from labsdk.cli._options import _UsageError
from labsdk.cli.try_environment import _print_tried, package_wheel, parse_arguments, parse_variables

from engine.commands.try_environment import TryFailed, _check_arguments
from engine.packages import Package
from tests.environments.verifiers_wheels import calc_wheel, require_verifiers_python
from tests.support.cli import LAB_SCRIPT
from tests.support.envs_try import docs_listing, lab_try, make_v0_python, v0_folder
from tests.support.load_environment_wheels import double_it_wheel
from tests.support.openai_server import openai_server
from tests.support.wheelbuilder import folder_wheel

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "environments"


def tried(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def v0_python(tmp_path_factory) -> Path:
    """The Python of an environment holding a load_environment package's requirements (verifiers
    0.3.1, datasets and openai, from the local package index), as a user's own would."""
    return make_v0_python(tmp_path_factory.mktemp("v0") / "venv")


@pytest.fixture(scope="module")
def vowel_count_wheel(tmp_path_factory) -> str:
    """vowel-count's wheel, built once as ``lab envs try`` builds its folder, for the tests whose
    subject is not the folder's build (test_a_lab_package_folder_... tries the folder itself)."""
    return str(package_wheel(EXAMPLES / "vowel-count", tmp_path_factory.mktemp("vowel-count")))


def rendered(answer: dict, capsys) -> list[str]:
    """The lines ``lab envs try`` prints without ``--json`` for the answer ``--json`` printed."""
    capsys.readouterr()
    _print_tried(answer)
    return capsys.readouterr().out.splitlines()


def test_it_reads_args_as_json_or_toml():
    assert parse_arguments('{"max_length": 5}') == {"max_length": 5}
    assert parse_arguments("{max_length = 5, words = ['a']}") == {"max_length": 5, "words": ["a"]}
    assert parse_arguments("max_length = 5") == {"max_length": 5}
    assert parse_arguments(None) == {}
    for refused in ("[1]", "5", "{max_length = }", "when = 2026-01-01"):
        with pytest.raises(_UsageError):
            parse_arguments(refused)


def test_it_reads_env_options_as_key_value_pairs_and_refuses_labs_own():
    assert parse_variables(["JUDGE_API_KEY=sk-a=b", "EMPTY=", "JUDGE_API_KEY=sk-c"]) == {"JUDGE_API_KEY": "sk-c", "EMPTY": ""}
    assert parse_variables(None) == {}
    for refused in ("JUDGE_API_KEY", "=x", "1KEY=x", "LAB_ENGINE_VERIFIERS_PYTHON=/bin/false", "PATH=/tmp/evil", "HOME=/",
                    "PYTHONPATH=/tmp", "LD_PRELOAD=/tmp/x.so", "HF_HUB_OFFLINE=0", "UV_OFFLINE=0"):
        with pytest.raises(_UsageError):
            parse_variables([refused])


def test_a_lab_package_folder_shows_its_examples_and_scores_a_reply_as_a_job_would(tmp_path):
    shown = tried(lab_try(str(EXAMPLES / "vowel-count"), "--args", "{max_length = 4}", "--n", "2", "--json", cwd=tmp_path))
    assert shown["environment"] == {
        "id": "vowel-count@0.1.0", "kind": "lab", "api": "lab", "description": "Count the vowels of a short made-up word.",
        "args": {"min_length": 3, "max_length": 4},
        "parameters": [
            {"name": "min_length", "default": 3, "type": "int", "required": False},
            {"name": "max_length", "default": 6, "type": "int", "required": False},
        ],
        "reward_functions": [{"name": "exact", "weight": 1.0}, {"name": "close", "weight": 0.0}],
        "multi_turn": False,
    }
    assert [example["index"] for example in shown["examples"]] == [0, 1]
    first = shown["examples"][0]
    word = first["info"]["word"]
    assert 3 <= len(word) <= 4 and first["answer"] == str(sum(letter in "aeiou" for letter in word))
    assert first["messages"][1] == {"role": "user", "content": f"How many vowels are in '{word}'?"}
    assert first["reply"] is None and first["reward"] is None
    assert not (EXAMPLES / "vowel-count" / "build").exists()  # the folder is built from a copy

    scored = lab_try(str(EXAMPLES / "vowel-count"), "--args", '{"max_length": 4}', "--n", "1", "--reply", first["answer"], cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr
    assert "vowel-count@0.1.0: Lab protocol\n" in scored.stdout
    assert "  reward = 1 × exact + 0 × close\n" in scored.stdout
    assert f"  [user] How many vowels are in '{word}'?\n" in scored.stdout
    assert f"  reply: {first['answer']}\n  reward 1   exact 1  close 1\n" in scored.stdout


def test_arguments_are_refused_with_the_words_of_a_submit_every_problem_at_once(tmp_path, vowel_count_wheel):
    result = lab_try(vowel_count_wheel, "--args", '{max_digit = 3, min_length = "three"}', cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: 2 problems (invalid_spec)",
        "  env.0.args.max_digit: 'vowel-count@0.1.0' takes no argument 'max_digit': it takes min_length, max_length [unknown_key]",
        "  env.0.args.min_length: 'min_length' of 'vowel-count@0.1.0' must be an integer (int), not a string [invalid_type]",
    ]
    out_of_range = lab_try(vowel_count_wheel, "--args", "{min_length = 9, max_length = 4}", cwd=tmp_path)
    assert out_of_range.returncode == 1
    assert out_of_range.stderr.strip() == "error: vowel-count needs 1 <= min_length <= max_length <= 20 (environment_error)"


def test_a_single_turn_verifiers_taskset_folder_scores_a_reply_with_its_own_rewards(tmp_path):
    require_verifiers_python()
    result = tried(lab_try(str(EXAMPLES / "shout-word"), "--args", "{num_tasks = 20, max_syllables = 2}", "--n", "3",
                           "--reply", "LENA", "--json", cwd=tmp_path))
    assert result["environment"]["api"] == "v1" and result["environment"]["kind"] == "verifiers"
    assert result["environment"]["args"] == {"num_tasks": 20, "min_syllables": 2, "max_syllables": 2, "seed": 0}
    assert {parameter["name"]: parameter["type"] for parameter in result["environment"]["parameters"]} == {
        "num_tasks": "int", "min_syllables": "int", "max_syllables": "int", "seed": "int",
    }
    for example in result["examples"]:
        word = re.fullmatch(r"Write the word '(\w+)' in capital letters\.", example["messages"][-1]["content"]).group(1)
        assert len(word) == 4
        exact = 1.0 if word.upper() == "LENA" else 0.0
        assert example["functions"] == {"exact": exact, "shouted": exact, "capitals": 1.0, "terse": 1.0}
        assert example["reward"] == 1.0 * exact + 0.5 * exact + 0.25  # the weighted sum: 1.75 for the word itself


def test_a_taskset_whose_rewards_take_a_runtime_is_refused_saying_they_need_a_job_on_lab(tmp_path):
    """Its rewards run in sandboxes of a job's attempt, which ``lab envs try`` has not: refused as it
    loads, naming them, never scored without them."""
    require_verifiers_python()
    filename, data = folder_wheel(REPO / "tests" / "environments" / "fixtures" / "runtime-code")
    (tmp_path / filename).write_bytes(data)
    result = lab_try(str(tmp_path / filename), "--reply", "print(3)", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.strip() == (
        "error: environment local/runtime-code@0.1.0: its reward functions box_runs, prints_sum take a runtime (a box to run "
        "in: verifiers' prime sandbox, on Lab's sandboxes of the job's attempt), which an engine without Lab (--offline, "
        "lab envs try) does not have: run it as a job on Lab (environment_error)"
    )


def test_a_multi_turn_verifiers_env_folder_plays_its_episodes_with_the_reply_as_every_turn(tmp_path):
    require_verifiers_python()
    result = tried(lab_try(str(EXAMPLES / "letter-guess"), "--args", '{"letters": 8}', "--n", "2", "--reply", "M",
                           "--max-turns", "3", "--json", cwd=tmp_path))
    assert result["environment"]["multi_turn"] is True and result["environment"]["args"]["letters"] == 8
    for example in result["examples"]:
        assert example["turns"] == 3
        assert example["reply"].split("\n\n") == ["[assistant]\nM", "[user]\nEarlier in the alphabet. Guess again."] * 2 + ["[assistant]\nM"]
        functions = example["functions"]
        assert functions["solved"] == 0.0 and functions["one_letter"] == 1.0
        assert 0.52 <= functions["closeness"] <= 0.8  # the secret is one of A to H
        assert example["reward"] == pytest.approx(0.25 * 1.0 + 0.5 * functions["closeness"])


def test_replies_given_once_per_turn_answer_the_turns_in_order_the_last_one_every_later_turn(tmp_path):
    require_verifiers_python()
    result = tried(lab_try(str(EXAMPLES / "letter-guess"), "--args", '{"letters": 8}', "--n", "1", "--reply", "M", "--reply", "N",
                           "--max-turns", "3", "--json", cwd=tmp_path))
    (example,) = result["examples"]
    blocks = example["reply"].split("\n\n")
    assert [block for block in blocks if block.startswith("[assistant]")] == ["[assistant]\nM", "[assistant]\nN", "[assistant]\nN"]
    assert example["turns"] == 3


def test_a_tool_using_taskset_is_tried_calling_its_tool_then_answering_and_names_the_tools_the_model_calls(tmp_path):
    require_verifiers_python()
    filename, data = calc_wheel()
    wheel = tmp_path / filename
    wheel.write_bytes(data)
    call = '<tool_call>{"name": "calc_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    result = lab_try(str(wheel), "--args", '{"num_tasks": 1}', "--n", "1", "--reply", call, "--reply", "5", "--max-turns", "3",
                     cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "  tool: calc_add(a, b)  Add two whole numbers and return the sum.\n" in result.stdout
    assert f"  [assistant]\n  {call}\n  \n  [tool]\n  5\n  \n  [assistant]\n  5\n" in result.stdout
    assert "used_tool 1" in result.stdout


def test_several_replies_for_a_single_turn_environment_are_refused_saying_to_give_one(tmp_path, vowel_count_wheel):
    result = lab_try(vowel_count_wheel, "--reply", "1", "--reply", "2", cwd=tmp_path)
    assert result.returncode == 1
    assert "2 replies (--reply) for a single-turn environment, whose episodes have one turn: give one --reply" in result.stderr


def test_a_load_environment_wheel_without_python_is_refused_saying_how_to_make_one(tmp_path):
    filename, data = double_it_wheel()
    wheel = tmp_path / filename
    wheel.write_bytes(data)
    without = lab_try(str(wheel), "--reply", "x", cwd=tmp_path)
    assert without.returncode == 1
    assert "double-it@0.1.0 defines load_environment (verifiers' v0 API)" in without.stderr and "pass --python" in without.stderr
    assert "/tmp/v0-env/bin/pip install 'verifiers<0.4' datasets" in without.stderr


def test_a_load_environment_wheel_runs_on_the_python_that_holds_its_requirements(tmp_path, v0_python):
    filename, data = double_it_wheel()
    wheel = tmp_path / filename
    wheel.write_bytes(data)

    reply = "<answer>4</answer>"
    result = tried(lab_try(str(wheel), "--python", str(v0_python), "--args", "{num_examples = 4}", "--n", "4",
                           "--reply", reply, "--json", cwd=tmp_path))
    assert result["environment"]["api"] == "v0" and result["environment"]["args"] == {"num_examples": 4}
    recorded = {"api": result["environment"]["api"], "parameters": result["environment"]["parameters"]}  # what its probe recorded
    assert recorded["parameters"] == [{"name": "num_examples", "default": 8, "type": "int", "required": False}]
    # an argument load_environment does not take is refused with these words (printed as the vowel-count refusal shows)
    with pytest.raises(TryFailed) as refused:
        _check_arguments(Package(id="local/double-it@0.1.0", sha256="", url="", filename=filename), {"level": 2}, recorded)
    assert (refused.value.code, refused.value.errors) == ("invalid_spec", [{
        "param": "env.0.args.level", "code": "unknown_key",
        "message": "'double-it@0.1.0' takes no argument 'level': its load_environment takes num_examples",
    }])
    numbers = sorted(int(re.search(r"What is (\d+) doubled\?", example["messages"][-1]["content"]).group(1)) for example in result["examples"])
    assert numbers == [0, 1, 2, 3]
    for example in result["examples"]:
        number = int(re.search(r"(\d+)", example["messages"][-1]["content"]).group(1))
        exact = 1.0 if 2 * number == 4 else 0.0
        assert example["functions"]["exact"] == exact
        assert example["functions"]["length_penalty"] == pytest.approx(1 - len(reply) / 64)
        assert example["reward"] == pytest.approx(exact + 0.1 * (1 - len(reply) / 64))


def test_a_catalogue_model_samples_the_replies_it_scores(tmp_path, vowel_count_wheel):
    result = tried(lab_try(vowel_count_wheel, "--model", "lab/tiny-random-llama", "--max-tokens", "6", "--n", "2",
                           "--json", cwd=tmp_path))
    for example in result["examples"]:
        assert isinstance(example["reply"], str) and example["turns"] == 1
        assert set(example["functions"]) == {"exact", "close"} and example["reward"] == example["functions"]["exact"]
    unknown = lab_try(vowel_count_wheel, "--model", "acme/no-such-model", cwd=tmp_path)
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "error: unknown model 'acme/no-such-model': see `lab models` (model_not_found)"


def test_without_an_engine_it_says_where_one_is(tmp_path):
    """An SDK installed outside a Lab checkout, in a Python that has no engine, says what to run."""
    shutil.copytree(REPO / "sdk" / "labsdk", tmp_path / "elsewhere" / "sdk" / "labsdk", ignore=shutil.ignore_patterns("__pycache__"))
    env = {name: value for name, value in os.environ.items() if not name.startswith("LAB_")}
    env["PYTHONPATH"] = str(tmp_path / "elsewhere" / "sdk")
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from labsdk.cli import main; sys.exit(main(sys.argv[1:]))",
         "envs", "try", str(EXAMPLES / "vowel-count")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: lab envs try loads the package with Lab's engine, which this Python does not have: "
        "run the lab of a Lab checkout (.venv/bin/lab after make install) (engine_missing)"
    )


def test_a_dependency_the_engine_lacks_is_named_as_a_job_names_it(tmp_path):
    folder = shutil.copytree(EXAMPLES / "vowel-count", tmp_path / "vowel-count", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('dependencies = ["lab-environments>=0.1,<0.2"]', 'dependencies = ["lab-environments>=0.1,<0.2", "math-verify"]'))
    module = folder / "src" / "vowel_count" / "__init__.py"
    module.write_text(module.read_text() + "\nimport math_verify  # noqa: E402, F401\n")
    result = lab_try(str(folder), cwd=tmp_path)
    assert result.returncode == 1
    assert "needs the module 'math_verify', which is not installed in the engine's environment: a job installs the package with --no-deps" in result.stderr
    assert "none of its requirements installs" not in result.stderr


def test_a_reader_that_goes_away_ends_it_quietly(tmp_path, vowel_count_wheel):
    """``lab envs try ... --json | head``: no "error: [Errno 32] Broken pipe", exit 141 as a shell reports SIGPIPE."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LAB_") and name != "PYTHONPATH"}
    env.update(NO_COLOR="1", LAB_BASE_URL="http://127.0.0.1:9")
    command = [str(LAB_SCRIPT), "envs", "try", vowel_count_wheel, "--json"]
    process = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # the reader is gone before the JSON is written
    stderr = process.stderr.read()
    assert process.wait(timeout=300) == 141
    assert stderr == ""


# --- docs/environments.md's listings, loaded and played as written --------------------------

def _probed(python: Path, folder: Path, module: str, tmp_path: Path) -> dict:
    """What a build's probe records of the module ``module`` in ``folder`` (``lab envs``' source)."""
    from engine.environments import probe

    out = tmp_path / f"{module}.summary.json"
    result = subprocess.run([str(python), "-s", probe.__file__, module, "verifiers", "", str(out)],
                            env={**os.environ, "PYTHONPATH": str(folder)}, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


def test_the_docs_multi_turn_load_environment_plays_its_episodes_as_written(tmp_path, v0_python, capsys):
    code = docs_listing("**Multi-turn**: a `vf.MultiTurnEnv` subclass")
    folder = v0_folder(tmp_path, "nc-guess", code, description="Guess a number.")
    result = tried(lab_try(str(folder), "--python", str(v0_python), "--n", "20", "--reply", "<guess>1</guess>", "--json", cwd=tmp_path))
    environment = result["environment"]
    assert (environment["api"], environment["multi_turn"]) == ("v0", True)
    assert environment["description"] == "Guess a number from 1 to max_number, told higher or lower after each guess."
    assert environment["args"] == {"max_number": 10, "num_examples": 20, "max_turns": 4}
    assert environment["reward_functions"][0] == {"name": "solved", "weight": 1.0}
    outcomes = []
    for example in result["examples"]:  # 1 is guessed at once; any other number is "Higher." until 4 turns ran out
        outcomes.append((example["reward"], example["turns"]))
        assert outcomes[-1] in ((1.0, 1), (0.0, 4)), example
        if outcomes[-1] == (0.0, 4):
            assert example["reply"].count("Higher.") == 3, example["reply"]
    assert len(outcomes) > 10 and outcomes.count((1.0, 1)) <= 2  # the secrets are 1 + 7i mod 10: rows 0 and 10 hold 1

    lines = rendered(result, capsys)  # as printed without --json
    assert lines[:2] == ["nc-guess@0.1.0: load_environment (verifiers v0), multi-turn",
                         "  Guess a number from 1 to max_number, told higher or lower after each guess."]
    assert lines[3].startswith("  reward = 1 × solved"), lines[:4]
    recorded = _probed(v0_python, folder, "nc_guess", tmp_path)  # what lab envs and lab spec init read
    assert (recorded["multi_turn"], recorded["description"]) == (True, environment["description"])


def test_the_docs_tool_load_environment_calls_its_tool_then_answers_as_written(tmp_path, v0_python, capsys):
    code = docs_listing("**Tool**: `vf.ToolEnv(tools=[...])`")
    folder = v0_folder(tmp_path, "nc-tools", code, description="Multiply with a tool.")
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 5}}</tool_call>'
    result = tried(lab_try(str(folder), "--python", str(v0_python), "--n", "16", "--reply", call, "--reply", "<answer>10</answer>",
                           "--json", cwd=tmp_path))
    environment = result["environment"]
    assert (environment["api"], environment["multi_turn"], environment["description"]) == ("v0", True, "Multiply with a tool.")
    assert environment["reward_functions"][0] == {"name": "correct", "weight": 1.0}
    assert result["examples"]
    for example in result["examples"]:
        assert [tool["name"] for tool in example["tools"]] == ["multiply"]
        asked_for_ten = "What is 2 times 5?" in example["messages"][-1]["content"]
        a, b = map(int, re.search(r"What is (\d+) times (\d+)\?", example["messages"][-1]["content"]).groups())
        assert example["answer"] == str(a * b)  # the dataset row's answer column
        assert example["functions"]["correct"] == example["reward"] == (1.0 if asked_for_ten else 0.0)
        assert (example["turns"], example["functions"]["multiply_calls"]) == (2, 1.0)
    assert any("What is 2 times 5?" in example["messages"][-1]["content"] for example in result["examples"])

    lines = rendered(result, capsys)  # as printed without --json
    assert lines[:2] == ["nc-tools@0.1.0: load_environment (verifiers v0), multi-turn", "  Multiply with a tool."]
    assert lines[3].startswith("  reward = 1 × correct"), lines[:4]
    assert _probed(v0_python, folder, "nc_tools", tmp_path)["multi_turn"] is True


def test_the_docs_v1_multi_turn_env_plays_its_episodes_as_written(tmp_path):
    require_verifiers_python()
    code = docs_listing("## A verifiers v1 multi-turn `Env` in a few lines")
    folder = tmp_path / "nc-parity"
    folder.mkdir()
    (folder / "nc_parity.py").write_text(code)
    pyproject = docs_listing("`lab envs push` build from its folder", "toml")
    dependencies = 'dependencies = ["verifiers>=0.1.0", "datasets"]'
    assert dependencies in pyproject
    pyproject = pyproject.replace(dependencies, 'dependencies = ["verifiers>=0.4.0,<0.5"]')
    (folder / "pyproject.toml").write_text(pyproject.replace("double-it", "nc-parity").replace("double_it", "nc_parity"))
    result = tried(lab_try(str(folder), "--n", "3", "--reply", "even", "--json", cwd=tmp_path))
    environment = result["environment"]
    assert (environment["api"], environment["multi_turn"], environment["args"]) == ("v1", True, {"num_tasks": 100, "rounds": 3})
    for example in result["examples"]:
        numbers = [int(number) for number in re.findall(r"Is (\d+) even or odd\?", example["reply"])]
        first = int(re.search(r"Is (\d+)", example["messages"][-1]["content"]).group(1))
        numbers = [first, *numbers]
        assert len(numbers) == 3 and example["turns"] == 3, example
        right = sum(number % 2 == 0 for number in numbers) / 3
        assert example["functions"]["correct"] == pytest.approx(right)
        assert example["functions"]["short"] == 1.0
        assert example["reward"] == pytest.approx(right + 0.1)
    assert _probed(require_verifiers_python(), folder, "nc_parity", tmp_path)["multi_turn"] is True


_SECRET_READER = '''"""Say what the judge key is."""
import os

import verifiers as vf
from datasets import Dataset


def load_environment(**kwargs) -> vf.Environment:
    vf.ensure_keys(["NC_JUDGE_KEY"])
    question = f"key={os.environ['NC_JUDGE_KEY']} shell={os.environ.get('NC_SHELL_ONLY', 'absent')}"
    return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": question, "answer": "x"}]), rubric=vf.Rubric(), **kwargs)
'''


def test_env_options_give_a_load_environment_its_secret_and_nothing_else_of_the_shell(tmp_path, v0_python, monkeypatch):
    folder = v0_folder(tmp_path, "nc-secret", _SECRET_READER, description="Say what the judge key is.")
    monkeypatch.setenv("NC_SHELL_ONLY", "leaked")
    monkeypatch.setenv("NC_JUDGE_KEY", "from-the-shell")

    refused = lab_try(str(folder), "--python", str(v0_python), cwd=tmp_path)
    assert refused.returncode == 1
    assert "nc-secret@0.1.0 reads the secret NC_JUDGE_KEY (vf.ensure_keys): give it with -e NC_JUDGE_KEY=..." in refused.stderr

    result = tried(lab_try(str(folder), "--python", str(v0_python), "-e", "NC_JUDGE_KEY=sk-given", "--env", "NC_OTHER=1",
                           "--n", "1", "--json", cwd=tmp_path))
    assert result["examples"][0]["messages"][-1]["content"] == "key=sk-given shell=absent"

    malformed = lab_try(str(folder), "--python", str(v0_python), "-e", "NC_JUDGE_KEY", cwd=tmp_path)
    assert malformed.returncode == 2 and "-e NC_JUDGE_KEY: give KEY=VALUE" in malformed.stderr


def test_env_options_are_refused_for_a_package_whose_jobs_give_it_no_variables(tmp_path, vowel_count_wheel):
    refused = lab_try(vowel_count_wheel, "-e", "NC_JUDGE_KEY=sk-given", cwd=tmp_path)
    assert refused.returncode == 1
    assert "-e gives variables to a load_environment environment's bridge; vowel-count" in refused.stderr


def test_the_docs_stateful_tool_environment_fills_in_the_argument_it_hides_from_the_model(tmp_path, v0_python):
    folder = v0_folder(tmp_path, "nc-peek", docs_listing("**Stateful tool**: a `vf.StatefulToolEnv` subclass"))
    call = '<tool_call>{"name": "peek", "arguments": {"position": 0}}</tool_call>'
    result = tried(lab_try(str(folder), "--python", str(v0_python), "--n", "4", "--reply", call, "--reply", "<answer>p</answer>",
                            "--json", cwd=tmp_path))
    assert (result["environment"]["api"], result["environment"]["multi_turn"]) == ("v0", True)
    words = ["planet", "garden", "silver", "winter"]
    assert len(result["examples"]) == 4
    for example in result["examples"]:
        row = example["info"]["idx"]  # row i hides words[i % 4] and asks for its letter at i % 6
        [tool] = example["tools"]
        assert (tool["name"], list(tool["parameters"]["properties"]), tool["parameters"]["required"]) == ("peek", ["position"], ["position"])
        assert f"[tool]\n{words[row % 4][0]}\n" in example["reply"], example["reply"]  # the row's own word, from update_tool_args
        assert (example["turns"], example["functions"]["peek_calls"]) == (2, 1.0)
        assert example["reward"] == example["functions"]["correct"] == (1.0 if words[row % 4][row % 6] == "p" else 0.0)


def _verdict(body: dict) -> str:
    """A judge that says yes when the response is the ground truth (verifiers' default judge prompt)."""
    prompt = body["messages"][-1]["content"]
    truth = re.search(r"Ground truth answer:\n```\n(.*?)\n```", prompt, re.S).group(1)
    response = re.search(r"Response:\n```\n(.*?)\n```", prompt, re.S).group(1)
    return "yes" if response.strip().lower() == truth.strip().lower() else "no"


def test_the_docs_judge_environment_asks_its_judge_and_scores_its_verdict(tmp_path, v0_python):
    folder = v0_folder(tmp_path, "nc-judge", docs_listing("**Judge**: a `vf.JudgeRubric("), dependencies=("openai",))
    with openai_server(_verdict, key="sk-judge") as judge:
        arguments = json.dumps({"judge_base_url": judge.base_url, "judge_model": "grader", "num_examples": 2})
        result = tried(lab_try(str(folder), "--python", str(v0_python), "--args", arguments, "-e", "JUDGE_API_KEY=sk-judge",
                                "--n", "2", "--reply", "banana", "--json", cwd=tmp_path))
    scored = {example["info"]["idx"]: (example["reward"], example["functions"]["judged"]) for example in result["examples"]}
    assert scored == {0: (1.0, 1.0), 1: (0.0, 0.0)}  # row 0 asks for a yellow thing (banana), row 1 a red one (tomato)
    assert [request["body"]["model"] for request in judge.requests] == ["grader", "grader"]
    keys = [{name.lower(): value for name, value in request["headers"].items()}["authorization"] for request in judge.requests]
    assert keys == ["Bearer sk-judge", "Bearer sk-judge"]  # the key -e gave, read through vf.ensure_keys
    asked = [request["body"]["messages"][-1]["content"] for request in judge.requests]
    assert sorted("Ground truth answer:\n```\ntomato\n```" in prompt for prompt in asked) == [False, True]
    assert sorted("Question:\n```\nName one thing that is yellow. One word.\n```" in prompt for prompt in asked) == [False, True]
    assert all("Response:\n```\nbanana\n```" in prompt for prompt in asked), asked


def test_a_model_sampling_a_tool_environment_shows_the_tools_it_was_offered(tmp_path, v0_python):
    folder = v0_folder(tmp_path, "nc-peek", docs_listing("**Stateful tool**: a `vf.StatefulToolEnv` subclass"))
    result = tried(lab_try(str(folder), "--python", str(v0_python), "--model", "lab/tiny-random-llama", "--max-tokens", "4",
                            "--max-turns", "2", "--n", "2", "--json", cwd=tmp_path))
    assert len(result["examples"]) == 2
    for example in result["examples"]:
        assert isinstance(example["reply"], str) and example["turns"] >= 1
        [tool] = example["tools"]
        assert (tool["name"], tool["description"], list(tool["parameters"]["properties"])) == (
            "peek", "Read one letter of the hidden word.", ["position"])
