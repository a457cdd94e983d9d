"""The example environment package: `make example-env` builds a wheel that Lab accepts as it is,
and the engine trains on it (examples/environments/vowel-count)."""

from __future__ import annotations

import json
import subprocess

from labsdk.spec import load_spec_file

from environments.wheels import read_wheel
from tests.support.packages import REPO, run_engine


def test_make_builds_the_example_wheel_that_lab_accepts_and_the_engine_trains_on(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run(["make", "-s", "example-env", f"EXAMPLE_DIST={dist}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("*.whl")
    assert wheel.name == "vowel_count-0.1.0-py3-none-any.whl"
    assert not (REPO / "examples/environments/vowel-count/build").exists()
    with wheel.open("rb") as handle:
        info = read_wheel(handle, filename=wheel.name)
    assert (info.name, info.version, info.kind, info.entry_point) == ("vowel-count", "0.1.0", "lab", "vowel_count:VowelCount")

    result = run_engine(tmp_path, "acme/vowel-count@0.1.0", [(wheel.name, wheel.read_bytes())], args={"max_length": 5})
    assert result.returncode == 0, result.stderr
    points = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    assert {"reward/vowel-count/exact/mean", "reward/vowel-count/close/mean"} <= set(points[-1]["values"])
    prompts = [json.dumps(json.loads(line)["prompt"]) for line in (tmp_path / "work" / "samples.jsonl").read_text().splitlines()]
    assert all("How many vowels are in" in prompt for prompt in prompts)


def test_the_example_spec_is_valid_and_names_the_example_package():
    parsed = load_spec_file(REPO / "examples/environments/vowel-count/vowel-count-tiny.toml")
    (env,) = parsed.spec.env
    assert (env.id, sorted(env.args)) == ("acme/vowel-count", ["max_length", "min_length"])
    assert parsed.warnings == []
