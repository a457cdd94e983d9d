"""Every problem of a spec in one answer: the server's validation reaches the uploaded packages
whatever else is wrong, and ``lab spec check`` merges the local problems with Lab's (through
httpx's WSGI transport into Lab's real views)."""

from __future__ import annotations

import functools
import json

import pytest
from labsdk import cli
from labsdk.client import Lab

from jobs import specs
from jobs.models import Job
from lab.errors import LabError

pytestmark = pytest.mark.django_db

#: Four mistakes of four kinds: an unknown key (shape), a bad argument type and an unknown
#: environment (the catalogue) and an unknown model.
FOUR_MISTAKES = """\
name = "four-mistakes"
model = "nope/nope"
colour = "blue"
max_steps = 3
[[env]]
id = "lab/addition"
args = { max_operand = "nine" }
[[env]]
id = "primeintellect/reverse-text"
"""


@pytest.fixture
def gone(monkeypatch) -> list[bool]:
    """Every uploaded package reads as deleted since the catalogue was read; the ``lock`` of each
    lookup is recorded."""
    locks: list[bool] = []

    def find(*, organization, ref, lock) -> None:
        locks.append(lock)

    monkeypatch.setattr(specs, "environment_catalogue", lambda organization: {"acme/my-env": specs.EnvironmentInfo(
        id="acme/my-env@0.1.0", name="my-env", description="", args={})})
    monkeypatch.setattr(specs, "environment_find", find)
    return locks


def _problems(owner, data, *, lock=False) -> set[tuple[str, str]]:
    with pytest.raises(LabError) as raised:
        specs.validate_job_spec(project=owner.project, data=data, lock_environments=lock)
    return {(error.param, error.code) for error in raised.value.errors}


def test_an_uploaded_package_is_looked_up_beside_other_problems_without_locking(owner, spec, gone):
    spec["env"] = [{"id": "acme/my-env"}, {"id": "primeintellect/reverse-text"}]
    spec["init_from"] = "ckpt_missing0000000000"

    assert _problems(owner, spec, lock=True) == {
        ("env.0.id", "unknown_environment"),  # the package, looked up although init_from is wrong
        ("env.1.id", "unknown_environment"),  # the catalogue's, once: not looked up as a package
        ("init_from", "unknown_checkpoint"),
    }
    assert gone == [False]  # a spec refused anyway locks nothing


def test_a_spec_that_fails_shape_validation_still_has_its_packages_looked_up(owner, spec, gone):
    spec["env"] = [{"id": "acme/my-env"}]
    spec["colour"] = "blue"

    assert _problems(owner, spec) == {("colour", "unknown_key"), ("env.0.id", "unknown_environment")}
    assert gone == [False]


@pytest.fixture
def lab_cli(owner, monkeypatch, capsys, tmp_path, wsgi_transport):
    """Run ``lab ARGV`` in this process against Lab's views as ``owner``; returns
    (status, stdout, stderr). LAB_API_KEY is set unless ``key=False``."""
    monkeypatch.setattr(cli, "Lab", functools.partial(Lab, api_key=owner.key, base_url="http://127.0.0.1", transport=wsgi_transport))

    def run(*argv: str, key: bool = True) -> tuple[int, str, str]:
        if key:
            monkeypatch.setenv("LAB_API_KEY", owner.key)
        else:
            monkeypatch.delenv("LAB_API_KEY", raising=False)
        status = cli.main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.mark.django_db
def test_spec_check_reports_the_local_and_the_servers_problems_in_one_run(lab_cli, tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(FOUR_MISTAKES)

    status, out, err = lab_cli("spec", "check", str(path))

    assert status == 1 and out == ""
    lines = err.splitlines()
    assert lines[0] == f"{path}: 4 problems (checked locally and by Lab)"
    params = [line.split(":")[0].strip() for line in lines[1:]]
    assert sorted(params) == ["colour", "env.0.args.max_operand", "env.1.id", "model"]  # each once
    assert "'max_operand' must be a JSON integer, not string [invalid_type]" in err
    assert "installed environments: lab/addition" in err
    assert not Job.objects.unscoped().exists()

    status, out, _ = lab_cli("spec", "check", str(path), "--json")
    result = json.loads(out)
    assert (status, result["valid"], result["checked_by_lab"]) == (1, False, True)
    assert sorted((error["param"], error["code"]) for error in result["errors"]) == [
        ("colour", "unknown_key"), ("env.0.args.max_operand", "invalid_type"),
        ("env.1.id", "unknown_environment"), ("model", "unknown_model"),
    ]


@pytest.mark.django_db
def test_spec_check_without_a_key_says_the_catalogues_were_not_checked(lab_cli, tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(FOUR_MISTAKES)

    status, _, err = lab_cli("spec", "check", str(path), key=False)

    assert status == 1
    assert err.splitlines()[0] == (
        f"{path}: 1 problem (its model and environments were not checked (no LAB_API_KEY): "
        "set LAB_API_KEY to check them through Lab)"
    )
    assert "  colour: " in err and "env.1.id" not in err
