"""The SDK's ``lab.environments`` and the CLI's ``lab envs`` against the real API on a live HTTP server."""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from labsdk import BadRequestError, ConflictError, Lab, NotFoundError
from labsdk.cli import main

from environments.builds import build_log_key, latest_build
from environments.models import BuildStatus, EnvironmentPackage
from lab import storage
from tests.support.cli import lab_cli
from tests.support.load_environment_wheels import tiny_single_turn_wheel
from tests.support.wheelbuilder import build_wheel

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "environments"


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def wheel_file(tmp_path, **kwargs):
    filename, data = build_wheel(**kwargs)
    path = tmp_path / filename
    path.write_bytes(data)
    return path


def test_the_sdk_pushes_lists_gets_and_deletes(live_server, owner, outsider, tmp_path):
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    pushed = lab.environments.push(wheel_file(tmp_path, version="0.1.0"))
    assert (pushed.id, pushed.kind, pushed.version, pushed.verifiers_version) == ("acme/my-env@0.1.0", "verifiers", "0.1.0", ">=0.4.0")
    lab.environments.push(wheel_file(tmp_path, version="0.2.0"))
    assert [item.id for item in lab.environments.list()][-2:] == ["acme/my-env@0.2.0", "acme/my-env@0.1.0"]
    assert lab.environments.retrieve("acme/my-env").id == "acme/my-env@0.2.0"
    assert lab.environments.get("acme/my-env@0.1.0").sha256 == pushed.sha256
    with pytest.raises(ConflictError):
        lab.environments.push(wheel_file(tmp_path, version="0.1.0", files={"my_env/__init__.py": "__all__ = []\n"}))
    with pytest.raises(BadRequestError, match="not a zip archive"):
        bogus = tmp_path / "my_env-0.3.0-py3-none-any.whl"
        bogus.write_bytes(b"nope")
        lab.environments.push(bogus)
    with pytest.raises(NotFoundError):
        Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0).environments.retrieve("acme/my-env")
    lab.environments.delete("acme/my-env@0.2.0")
    assert lab.environments.retrieve("acme/my-env").id == "acme/my-env@0.1.0"
    assert EnvironmentPackage.objects.unscoped().filter(deleted_at__isnull=False).count() == 1


def test_the_cli_pushes_lists_shows_and_deletes(live_server, owner, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)
    wheel = wheel_file(tmp_path, version="0.1.0")

    assert main(["envs", "push", str(wheel)]) == 0
    assert capsys.readouterr().out == "acme/my-env@0.1.0\n"
    assert main(["envs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [item["id"] for item in listed] == ["lab/addition", "lab/reverse-text", "lab/alphabet-sort", "lab/python-code", "acme/my-env@0.1.0"]
    assert main(["envs", "list"]) == 0
    assert "acme/my-env@0.1.0" in capsys.readouterr().out
    assert main(["envs", "info", "acme/my-env"]) == 0
    info = capsys.readouterr().out.splitlines()
    assert info[0] == "id:           acme/my-env@0.1.0" and "kind:         verifiers" in info
    assert main(["envs", "delete", "acme/my-env"]) == 0
    assert capsys.readouterr().out == "deleted acme/my-env@0.1.0\n"
    assert main(["envs", "info", "acme/my-env"]) == 1
    assert "No such environment. (not_found)" in capsys.readouterr().err


#: What the builder records for ``tiny_single_turn_wheel`` (tests/environments/test_builds.py builds it for real).
TINY_SUMMARY = {
    "api": "v0",
    "environment_class": "verifiers.envs.singleturn_env.SingleTurnEnv",
    "parameters": [
        {"name": "num_examples", "default": 10, "type": "int", "required": False},
        {"name": "system_prompt", "default": "Answer with a number.", "type": "str", "required": False},
        {"name": "split", "default": None, "type": "str", "required": True},
    ],
    "dataset_size": 10,
    "reward_functions": [{"name": "correct", "weight": 1.0}, {"name": "short", "weight": 0.25}],
    "secrets": ["TINY_JUDGE_KEY"],
    "verifiers_version": "0.3.1",
    "multi_turn": False,
}


def test_the_sdk_and_the_cli_show_a_versions_build_and_its_log_and_rebuild_it(live_server, owner, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)
    filename, data = tiny_single_turn_wheel()
    (tmp_path / filename).write_bytes(data)
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    pushed = lab.environments.push(tmp_path / filename)
    assert (pushed.build.number, pushed.build.status) == (1, "queued")
    assert lab.environments.build_log("acme/tiny-count") == ""
    assert main(["envs", "build-log", "acme/tiny-count"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "acme/tiny-count has no build log yet" in err
    assert main(["envs", "info", "acme/tiny-count"]) == 0
    assert "verifiers:    >=0.1.0" in capsys.readouterr().out.splitlines()  # no build has installed one yet

    # The build ends as a worker ends it: its log stored, its summary recorded.
    build = latest_build(EnvironmentPackage.objects.unscoped().get(name="tiny-count"))
    log = tmp_path / "build.log"
    log.write_text("[build 12:00:01] resolving 2 requirements\n[build 12:00:15] ready in 14.2 s\n")
    build.log_key = build_log_key(build)
    storage.put_file(build.log_key, log, content_type="text/plain")
    build.status, build.summary = BuildStatus.READY, TINY_SUMMARY
    build.finished_at = datetime(2026, 12, 5, 12, 0, 15, tzinfo=UTC)
    build.save()

    got = lab.environments.retrieve("acme/tiny-count").build
    assert (got.status, got.api, got.dataset_size) == ("ready", "v0", 10)
    assert got.args == {"num_examples": 10, "system_prompt": "Answer with a number."}
    assert got.reward_functions[1] == {"name": "short", "weight": 0.25}
    assert lab.environments.build_log("acme/tiny-count@0.1.0") == log.read_text()
    assert main(["envs", "build-log", "acme/tiny-count"]) == 0
    assert capsys.readouterr().out == log.read_text()
    assert main(["envs", "info", "acme/tiny-count"]) == 0
    info = capsys.readouterr().out.splitlines()
    assert "verifiers:    0.3.1 (>=0.1.0)" in info  # what the build installed, then what the package requires
    assert info[-7:] == [
        "build:        1 ready at 2026-12-05T12:00:15Z",
        "api:          v0 (verifiers.envs.singleturn_env.SingleTurnEnv)",
        "episodes:     single-turn",
        'parameters:   num_examples=10 (int), system_prompt="Answer with a number." (str), split (str, required)',
        "rewards:      correct (weight 1.0), short (weight 0.25)",
        "dataset_size: 10",
        "secrets:      TINY_JUDGE_KEY",
    ]
    assert main(["envs", "info", "acme/tiny-count", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["build"]["status"] == "ready"

    assert main(["envs", "rebuild", "acme/tiny-count"]) == 0
    assert capsys.readouterr().out == "acme/tiny-count@0.1.0: build 2 queued (follow it with `lab envs info acme/tiny-count@0.1.0`)\n"
    assert lab.environments.retrieve("acme/tiny-count").build.number == 2
    with pytest.raises(ConflictError, match="build 2 of acme/tiny-count@0.1.0 is still queued"):
        lab.environments.rebuild("acme/tiny-count")
    assert main(["envs", "rebuild", "acme/tiny-count", "--json"]) == 1
    assert "still queued" in capsys.readouterr().err
    with pytest.raises(NotFoundError):
        lab.environments.build_log("acme/no-such-env")


def test_lab_envs_push_builds_a_project_folder_as_lab_envs_try_does(live_server, owner, tmp_path):
    folder = shutil.copytree(EXAMPLES / "vowel-count", tmp_path / "vowel-count", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pushed = lab_cli("envs", "push", str(folder), key=owner.key, base_url=live_server.url)
    assert (pushed.returncode, pushed.stdout, pushed.stderr) == (0, "acme/vowel-count@0.1.0\n", "")
    assert EnvironmentPackage.objects.unscoped().get(name="vowel-count").version == "0.1.0"
    # The same files again (a copy or a checkout dates them anew) build the same bytes: the idempotent push.
    os.utime(folder / "src" / "vowel_count" / "__init__.py", (1_700_000_000, 1_700_000_000))
    again = lab_cli("envs", "push", str(folder), "--json", key=owner.key, base_url=live_server.url)
    assert (again.returncode, again.stderr) == (0, "")
    assert json.loads(again.stdout)["sha256"] == EnvironmentPackage.objects.unscoped().get(name="vowel-count").sha256
    assert EnvironmentPackage.objects.unscoped().filter(name="vowel-count").count() == 1
    # A Lab-protocol package has no verifiers requirement: its info leaves the line out, as every empty one.
    info = lab_cli("envs", "info", "acme/vowel-count", key=owner.key, base_url=live_server.url)
    assert info.returncode == 0 and info.stdout.startswith("id:           acme/vowel-count@0.1.0\nkind:         lab\n")
    assert [line for line in info.stdout.splitlines() if not line.split(":", 1)[1].strip()] == []
    assert "verifiers:" not in info.stdout
    (tmp_path / "empty").mkdir()
    empty = lab_cli("envs", "push", str(tmp_path / "empty"), key=owner.key, base_url=live_server.url)
    assert empty.returncode == 2 and "has no pyproject.toml: pass the package's project folder or its wheel" in empty.stderr
    missing = lab_cli("envs", "push", str(tmp_path / "nothing"), key=owner.key, base_url=live_server.url)
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr


def test_lab_envs_info_reads_a_listed_built_in_and_another_organizations_package_stays_missing(live_server, owner, outsider, tmp_path):
    listed = json.loads(lab_cli("envs", "--json", key=owner.key, base_url=live_server.url).stdout)
    addition = next(item for item in listed if item["id"] == "lab/addition")
    assert Lab(api_key=owner.key, base_url=live_server.url, max_retries=0).environments.retrieve("lab/addition").model_dump() == (
        {**addition, "build": None, "created_at": None}
    )
    info = lab_cli("envs", "info", "lab/addition", key=owner.key, base_url=live_server.url)
    assert (info.returncode, info.stderr) == (0, "")
    assert info.stdout.splitlines()[:2] == ["id:           lab/addition", "kind:         builtin"]
    assert f"description:  {addition['description']}" in info.stdout.splitlines() and "version:" not in info.stdout
    assert lab_cli("envs", "info", "lab/addition@latest", key=owner.key, base_url=live_server.url).stdout == info.stdout

    Lab(api_key=owner.key, base_url=live_server.url, max_retries=0).environments.push(wheel_file(tmp_path, version="0.1.0"))
    theirs = lab_cli("envs", "info", "acme/my-env", key=outsider.key, base_url=live_server.url)
    missing = lab_cli("envs", "info", "acme/no-such-env", key=outsider.key, base_url=live_server.url)
    assert (theirs.returncode, theirs.stdout, theirs.stderr) == (missing.returncode, missing.stdout, missing.stderr)
    assert (theirs.returncode, theirs.stderr) == (1, "error: No such environment. (not_found)\n")


@pytest.mark.parametrize("command", ["info", "build-log", "rebuild", "delete"])
def test_an_environment_id_without_its_organization_is_a_usage_error_not_a_traceback(command):
    refused = lab_cli("envs", command, "nc-echo", key="lab_test_unused", base_url="http://127.0.0.1:9")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.splitlines()[-1] == (
        f"lab envs {command}: error: argument id: expected an id <organization>/<name>[@<version>], such as lab/addition "
        "or acme/my-env@0.1.0, not 'nc-echo': `lab envs` lists them"
    )
    assert "Traceback" not in refused.stderr


def test_lab_envs_info_says_a_v1_env_plays_multi_turn_episodes_and_records_rewards_as_it_plays(capsys):
    from labsdk.cli.catalog import _build_rows
    from labsdk.types import EnvironmentBuild

    build = EnvironmentBuild(number=1, status="ready", api="v1", multi_turn=True, reward_functions=[{"name": "short", "weight": 0.1}])
    rows = dict(_build_rows(build))
    assert rows["episodes"] == "multi-turn"
    assert rows["rewards"] == "short (weight 0.1); and the terms its episodes record (trace.record_reward)"
    assert "episodes" not in dict(_build_rows(EnvironmentBuild(number=1, status="queued")))  # not recorded yet
