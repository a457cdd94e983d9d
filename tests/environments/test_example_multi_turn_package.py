"""The example multi-turn verifiers package: `make example-multi-turn-env` builds a wheel that Lab
accepts as it is, and the engine trains on it turn by turn (examples/environments/letter-guess)."""

from __future__ import annotations

from labsdk.spec import load_spec_file

from environments.wheels import read_wheel
from tests.environments.verifiers_wheels import read_lines, require_verifiers_python
from tests.support.packages import REPO, build_example, run_engine

EXAMPLE = REPO / "examples" / "environments" / "letter-guess"


def test_make_builds_the_example_multi_turn_wheel_that_the_engine_trains_on_turn_by_turn(tmp_path):
    require_verifiers_python()
    wheel = build_example(tmp_path, "example-multi-turn-env")
    assert wheel.name == "letter_guess-0.1.0-py3-none-any.whl"
    assert not (EXAMPLE / "build").exists()
    with wheel.open("rb") as handle:
        info = read_wheel(handle, filename=wheel.name)
    assert (info.name, info.version, info.kind, info.entry_point) == ("letter-guess", "0.1.0", "verifiers", "letter_guess")

    result = run_engine(tmp_path, "acme/letter-guess@0.1.0", [(wheel.name, wheel.read_bytes())],
                        args={"num_tasks": 20, "letters": 8}, block={"max_turns": 3})
    assert result.returncode == 0, result.stderr
    points = read_lines(tmp_path / "work" / "metrics.jsonl")
    assert {f"reward/letter-guess/{name}/mean" for name in ("solved", "closeness", "one_letter")} <= set(points[-1]["values"])
    samples = read_lines(tmp_path / "work" / "samples.jsonl")
    assert all("I am thinking of a capital letter from A to H. Guess it." in sample["prompt"] for sample in samples)
    # The environment answered: its turns are in the rollouts (and never trained on: tests/engine/test_multi_turn.py).
    assert any("in the alphabet." in sample["completion"] or "Reply with a single letter." in sample["completion"] for sample in samples)


def test_the_example_multi_turn_spec_is_valid_and_names_the_example_package():
    parsed = load_spec_file(EXAMPLE / "letter-guess-tiny.toml")
    (env,) = parsed.spec.env
    assert (env.id, env.max_turns) == ("acme/letter-guess", 4)
    assert parsed.warnings == []
