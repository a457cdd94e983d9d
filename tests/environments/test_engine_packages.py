"""The engine installs a job's uploaded packages into its own work dir (pip --no-deps --no-index
--target), imports them, and trains on a Lab-protocol one; a missing dependency is exit 2 naming it."""

from __future__ import annotations

import json

from engine.environments.probe import not_in_engine
from tests.support.packages import run_engine
from tests.support.wheelbuilder import build_wheel, lab_wheel


def test_it_trains_on_an_uploaded_lab_environment_installed_in_the_work_dir(tmp_path):
    result = run_engine(tmp_path, "acme/echo-env@0.1.0", [lab_wheel("echo-env", "0.1.0")], args={"digits": 2})
    assert result.returncode == 0, result.stderr
    work = tmp_path / "work"
    assert (work / "environments" / "site" / "echo_env" / "__init__.py").is_file()
    points = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [point["step"] for point in points] == [1, 2]
    assert {"reward/echo-env/mean", "reward/echo-env/exact/mean", "reward/echo-env/starts/mean"} <= set(points[0]["values"])
    prompts = [json.loads(line)["prompt"] for line in (work / "samples.jsonl").read_text().splitlines()]
    assert all("Say " in str(prompt) for prompt in prompts)


def test_as_three_roles_only_the_orchestrator_installs_and_imports_the_package(tmp_path):
    """The trainer role holds Lab's token and never imports environment code (docs/engine.md "Three roles")."""
    result = run_engine(tmp_path, "acme/echo-env@0.1.0", [lab_wheel("echo-env", "0.1.0")], args={"digits": 2},
                        extra_env={"LAB_ENGINE_ROLES": "process"})
    assert result.returncode == 0, result.stderr
    work = tmp_path / "work"
    assert (work / "orchestrator" / "environments" / "site" / "echo_env" / "__init__.py").is_file()
    assert not (work / "environments").exists()  # the trainer installed nothing
    points = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [point["step"] for point in points] == [1, 2]
    assert {"reward/echo-env/mean", "reward/echo-env/exact/mean"} <= set(points[0]["values"])

    (tmp_path / "args").mkdir()  # the orchestrator, which alone loads the package, checks its arguments
    refused = run_engine(tmp_path / "args", "acme/echo-env@0.1.0", [lab_wheel()], args={"colour": "red"},
                         extra_env={"LAB_ENGINE_ROLES": "process"})
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "the orchestrator role failed:" in refused.stderr and "env.0.args.colour" in refused.stderr


def test_it_exits_2_naming_a_missing_dependency(tmp_path):
    result = run_engine(tmp_path, "acme/needy-env@1.0", [lab_wheel("needy-env", "1.0", extra_requires=("frobnicator_9000",))])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "engine: " + not_in_engine("environment acme/needy-env@1.0 needs the module 'frobnicator_9000'")
    )
    assert "which is not installed in the engine's environment: a job installs the package with --no-deps" in result.stderr
    assert json.loads((tmp_path / "work" / "finish.json").read_text())["error"]["code"] == "environment_error"


def test_it_exits_2_when_the_wheel_is_not_the_pushed_one(tmp_path):
    result = run_engine(tmp_path, "acme/echo-env@0.1.0", [lab_wheel()], sha256="0" * 64)
    assert result.returncode == 2
    assert "the fetched wheel's SHA-256 is not the pushed one's" in result.stderr


def test_it_refuses_arguments_the_package_does_not_declare(tmp_path):
    result = run_engine(tmp_path, "acme/echo-env@0.1.0", [lab_wheel()], args={"colour": "red"})
    assert result.returncode == 2
    assert "env.0.args.colour" in result.stderr


def test_it_exits_2_for_a_verifiers_package_whose_module_exports_no_taskset(tmp_path):
    # Trained verifiers packages are tests/environments/test_verifiers_tasksets.py's part.
    result = run_engine(tmp_path, "acme/my-env@0.1.0", [build_wheel(requires=["verifiers>=0.4.0"])])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "engine: environment acme/my-env@0.1.0: taskset module 'my_env' exports no Taskset subclass via `__all__` "
        "(found ['MyTaskset']); export exactly one."
    )
