"""``lab spec init`` writes what Lab knows of the environment: its arguments with their defaults in
``[[env]] args``, and for a multi-turn one (its build recorded ``multi_turn``) the episode limits
(``max_turns`` set; the token caps and timeout commented out, each valid once uncommented), with
``sampling.max_tokens`` fitted to the model's context. Through the CLI against a live Lab."""

from __future__ import annotations

import re
import tomllib

import pytest
from labsdk.cli import main
from labsdk.spec import SpecError, parse_spec

from environments.models import BuildStatus, EnvironmentBuild
from tests.support.environments import push
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]

#: What a build of the docs' number-guess game (docs/environments.md) records.
GUESS = [
    {"name": "max_number", "default": 10, "type": "int", "required": False},
    {"name": "num_examples", "default": 20, "type": "int", "required": False},
    {"name": "max_turns", "default": 4, "type": "int", "required": False},
    {"name": "prompt", "default": None, "type": "str | None", "required": False},
]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


@pytest.fixture
def cli(live_server, owner, monkeypatch, capsys):
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)

    def init(*argv: str) -> str:
        assert main(["spec", "init", "--model", "lab/tiny-random-llama", *argv]) == 0
        return capsys.readouterr().out

    return init


#: What a build of a judged environment records: Prime's judge arguments beside its own.
JUDGED = [
    {"name": "num_examples", "default": 12, "type": "int", "required": False},
    {"name": "judge_model", "default": "grader", "type": "str", "required": False},
    {"name": "judge_base_url", "default": "http://127.0.0.1:9/v1", "type": "str", "required": False},
    {"name": "judge_api_key_var", "default": "JUDGE_API_KEY", "type": "str", "required": False},
]


def _pushed(owner, name: str, *, multi_turn: bool, parameters: list[dict] = GUESS) -> None:
    push(owner, build_wheel(name, "0.1.0"))
    build = EnvironmentBuild.objects.unscoped().get(package__name=name)
    build.status, build.summary = BuildStatus.READY, {"api": "v0", "parameters": parameters, "multi_turn": multi_turn}
    build.save()


def _env_block(template: str) -> list[str]:
    return template.split("[[env]]", 1)[1].split("\n[", 1)[0].splitlines()[1:]


def test_a_multi_turn_environment_gets_its_defaults_and_episode_limits_fitted_to_the_context(owner, cli):
    _pushed(owner, "nc-guess", multi_turn=True)
    template = cli("--environment", "acme/nc-guess")

    block = [line.split("  # ")[0] for line in _env_block(template) if line]
    assert block == [
        'id = "acme/nc-guess"',
        'args = { "max_number" = 10, "num_examples" = 20, "max_turns" = 4 }',  # null cannot be written in TOML
        "max_turns = 4",  # the environment's own
        "# max_output_tokens = 256",  # 4 replies of 64 tokens
        "# max_input_tokens = 512",  # the model's context
        "# timeout = 600.0",
    ]
    assert re.search(r"^max_tokens = 64  # ", template, flags=re.M)  # 512 tokens over 4 replies and 4 environment turns
    spec = parse_spec(tomllib.loads(template)).spec
    assert (spec.env[0].max_turns, spec.env[0].args, spec.sampling.max_tokens) == (
        4, {"max_number": 10, "num_examples": 20, "max_turns": 4}, 64,
    )
    lines = template.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(("# max_output_tokens", "# max_input_tokens", "# timeout")) and index > lines.index("[[env]]  # Environments."):
            uncommented = [*lines[:index], line.removeprefix("# "), *lines[index + 1:]]
            try:
                parse_spec(tomllib.loads("\n".join(uncommented)))
            except SpecError as exc:
                pytest.fail(f"{line} uncommented: {[problem.to_dict() for problem in exc.errors]}")


def test_a_single_turn_environment_gets_its_defaults_and_no_episode_limits(owner, cli):
    _pushed(owner, "nc-double", multi_turn=False)
    template = cli("--environment", "acme/nc-double")
    block = [line.split("  # ")[0] for line in _env_block(template) if line]
    assert block == ['id = "acme/nc-double"', 'args = { "max_number" = 10, "num_examples" = 20, "max_turns" = 4 }']
    assert re.search(r"^max_tokens = 128  # ", template, flags=re.M)  # the default fits 512 tokens
    assert "max_turns = " not in template.split("[[env]]", 1)[1].split("\n[", 1)[0].replace('"max_turns" = 4', "")


def test_a_built_in_gets_its_defaults_and_multi_turn_is_asked_for_where_lab_cannot_tell(cli):
    template = cli("--environment", "lab/addition")
    args = tomllib.loads(template)["env"][0]["args"]
    assert args and all(isinstance(value, int) for value in args.values())
    assert "max_turns" not in tomllib.loads(template)["env"][0]
    asked = tomllib.loads(cli("--environment", "lab/addition", "--multi-turn"))
    assert (asked["env"][0]["max_turns"], asked["sampling"]["max_tokens"]) == (8, 32)  # 512 tokens over 8 turns of two


def test_a_judged_environment_gets_its_judge_commented_out_with_its_defaults_and_no_judge_args(owner, cli):
    _pushed(owner, "nc-judge", multi_turn=False, parameters=JUDGED)
    template = cli("--environment", "acme/nc-judge")

    block = [line.split("  # ")[0] for line in _env_block(template) if line]
    assert block == [
        'id = "acme/nc-judge"',
        'args = { "num_examples" = 12 }',
        '# judge = { base_url = "http://127.0.0.1:9/v1", model = "grader", api_key_var = "JUDGE_API_KEY" }',
    ]
    assert "Uncomment with its API key as a job secret (-e JUDGE_API_KEY=...)." in template
    uncommented = template.replace("# judge = ", "judge = ", 1)
    env = parse_spec(tomllib.loads(uncommented)).spec.env[0]
    assert (env.judge.base_url, env.judge.model, env.judge.api_key_var) == ("http://127.0.0.1:9/v1", "grader", "JUDGE_API_KEY")
    assert env.args == {"num_examples": 12}


def test_an_environment_whose_build_still_runs_gets_no_args_and_a_warning_to_run_it_again(owner, live_server, monkeypatch, capsys):
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)
    push(owner, build_wheel("nc-slow", "0.1.0"))
    EnvironmentBuild.objects.unscoped().filter(package__name="nc-slow").update(status=BuildStatus.RUNNING)

    assert main(["spec", "init", "--model", "lab/tiny-random-llama", "--environment", "acme/nc-slow"]) == 0
    written = capsys.readouterr()
    assert tomllib.loads(written.out)["env"][0]["args"] == {}
    assert written.err == (
        "warning: the build of acme/nc-slow is still running, so its arguments are not known yet: the template leaves its "
        "args empty; run `lab spec init` again once `lab envs info acme/nc-slow` shows it ready\n"
    )


def test_an_environment_whose_build_failed_gets_no_args_and_a_warning_saying_where_to_look(owner, live_server, monkeypatch, capsys):
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)
    push(owner, build_wheel("nc-broken", "0.1.0"))
    EnvironmentBuild.objects.unscoped().filter(package__name="nc-broken").update(status=BuildStatus.FAILED)

    assert main(["spec", "init", "--model", "lab/tiny-random-llama", "--environment", "acme/nc-broken"]) == 0
    written = capsys.readouterr()
    assert tomllib.loads(written.out)["env"][0]["args"] == {}
    assert written.err == (
        "warning: the build of acme/nc-broken failed, so its arguments are not known: the template leaves its args empty; "
        "`lab envs info acme/nc-broken` says why, `lab envs rebuild` builds it again\n"
    )
