"""A ``load_environment`` package written for verifiers 0.1.9 (``verifiers==0.1.9``, a
``vf.SingleTurnEnv`` with an XML parser and a two-function rubric, as Hub environments of that
time are: ``tests/environments/fixtures/old-double``) builds on verifiers 0.1.9 itself and trains:
the bridge runs 0.1.9's own rollout and rubric through an ``AsyncOpenAI`` look-alike, since 0.1.9
has no ``verifiers.legacy`` clients; its multi-turn episodes are refused saying why.

Built against the local package index (``make package-index``: verifiers 0.1.9's closure, and a
wheel of ``wget``, which PyPI has as a source archive only)."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from engine import build_envs, packages
from engine.environments.verifiers_taskset import BridgeRefused, start_load_environment_bridge
from tests.support.load_environment_wheels import fixture_wheel
from tests.support.packages import build_fixture, run_engine

OLD = "acme/old-double@0.1.0"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``old-double``'s build: ready on verifiers 0.1.9."""
    return build_fixture(tmp_path_factory.mktemp("old-verifiers"), "old-double")


def test_a_package_pinning_verifiers_0_1_9_builds_on_it(built):
    versions = {entry["name"]: entry["version"] for entry in built["lock"]}
    assert (versions["verifiers"], versions["wget"]) == ("0.1.9", "3.2")
    summary = built["summary"]
    assert (summary["api"], summary["verifiers_version"], summary["environment_class"]) == (
        "v0",
        "0.1.9",
        "verifiers.envs.singleturn_env.SingleTurnEnv",
    )
    assert summary["reward_functions"] == [
        {"name": "exact", "weight": 1.0},
        {"name": "brief", "weight": 0.1},
        {"name": "num_turns", "weight": 0.0},
    ]
    # the build's smoke rollout ran on 0.1.9's own run_rollout: the stub's untagged "42" scores `brief` alone, 0.1 x (1 - 2/64)
    assert summary["rollout"]["examples"] == 2
    assert summary["rollout"]["rewards"] == [pytest.approx(0.096875), pytest.approx(0.096875)]


def test_the_bridge_scores_with_verifiers_0_1_9s_own_parser_and_rubric_and_refuses_its_multi_turn_episodes(
    tmp_path, built
):
    package = packages.Package(id=OLD, sha256=built["sha256"], url="", filename="old_double-0.1.0-py3-none-any.whl")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(build_envs.CACHE_VARIABLE, str(built["root"] / "cache"))
        python, _ = build_envs.ensure_environment(
            OLD, built["lock"], tmp_path, packages._fetch_locked(package), log=print
        )
    zipfile.ZipFile(io.BytesIO(fixture_wheel("old-double")[1])).extractall(tmp_path / "site")
    bridge = start_load_environment_bridge(
        package_id=OLD, python=python, site=tmp_path / "site", workdir=tmp_path, environ={"PATH": "/usr/bin:/bin"}
    )
    try:
        opened = bridge.request("open", taskset=OLD, args={"num_examples": 4})
        (task,) = bridge.request("tasks", handle=opened["handle"], split="eval", start=3, n=1, seed=0)["tasks"]
        right = bridge.request("score", handle=opened["handle"], task_id=task["id"], completion="<answer>6</answer>")
        wrong = bridge.request(
            "score", handle=opened["handle"], task_id=task["id"], completion="<answer>7</answer> since 3 + 3 = 7"
        )
        with pytest.raises(BridgeRefused) as refused:
            bridge.request("open", taskset=OLD, args={"turns": 2})
    finally:
        bridge.close()
    assert (opened["multi_turn"], opened["sizes"]) == (False, {"train": 4, "eval": 4, "val": 4})
    assert [message["role"] for message in task["messages"]] == ["system", "user"]
    assert task["messages"][1]["content"] == "What is 3 doubled?"
    assert right["functions"] == {"exact": 1.0, "brief": pytest.approx(1 - 18 / 64), "num_turns": 1.0}
    assert right["reward"] == pytest.approx(1.0 + 0.1 * (1 - 18 / 64))
    assert wrong["functions"]["exact"] == 0.0 and wrong["reward"] == pytest.approx(0.1 * (1 - 34 / 64))
    assert refused.value.code == "unsupported"
    assert str(refused.value) == (
        f"environment {OLD} is a TryAgainEnv on verifiers 0.1.9: Lab runs the multi-turn episodes of load_environment "
        "environments on verifiers 0.3.1 and 0.3.0 only (their v0 clients), and single-turn ones on 0.1.9 too: "
        "require verifiers>=0.3.1,<0.4"
    )


def test_a_tiny_model_job_trains_on_its_build_with_every_reward_function_reported(tmp_path, built):
    result = run_engine(
        tmp_path,
        OLD,
        [fixture_wheel("old-double")],
        args={"num_examples": 4},
        spec={"max_steps": 2},
        build={"number": 1, "api": "v0", "lock": built["lock"], "secrets": []},
        extra_env={build_envs.CACHE_VARIABLE: str(built["root"] / "cache")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    points = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    assert [point["step"] for point in points] == [1, 2]
    for point in points:
        values = point["values"]
        functions = {name: values[f"reward/old-double/{name}/mean"] for name in ("exact", "brief", "num_turns")}
        assert functions["num_turns"] == 1.0 and 0.0 <= functions["brief"] <= 1.0, values
        assert values["reward/old-double/mean"] == pytest.approx(functions["exact"] + 0.1 * functions["brief"]), values


def test_a_job_on_its_multi_turn_form_fails_at_start_saying_why(tmp_path, built):
    result = run_engine(
        tmp_path,
        OLD,
        [fixture_wheel("old-double")],
        args={"turns": 2},
        build={"number": 1, "api": "v0", "lock": built["lock"], "secrets": []},
        extra_env={build_envs.CACHE_VARIABLE: str(built["root"] / "cache")},
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"environment {OLD} is a TryAgainEnv on verifiers 0.1.9: Lab runs the multi-turn episodes" in result.stderr
