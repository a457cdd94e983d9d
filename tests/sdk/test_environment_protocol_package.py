"""The environment protocol's distribution (sdk/lab-environments) stands alone: its wheel declares
no requirement, and it installs, imports and runs with nothing but the standard library (no
torch, no Django, nothing of Lab's), while the engine's names are the very same classes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import lab_environments

from engine import catalog
from engine import environments as engine_environments
from engine.environments import base

SOURCE = Path(__file__).resolve().parents[2] / "sdk" / "lab-environments"

#: Run with ``python -I -S``: the standard library and the install folder (argv[1]) only.
PROGRAM = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import lab_environments as protocol


def exact(completion, example):
    return 1.0 if completion == example.answer else 0.0


class Echo(protocol.Environment):
    info = protocol.EnvironmentInfo(id="echo", name="echo", description="say the digits", args={"digits": 2})
    rubric = (protocol.RewardFunction("exact", 1.0, exact), protocol.RewardFunction("short", 0.5, lambda c, e: float(len(c) <= 2)))

    def check_args(self):
        if not 1 <= self.args["digits"] <= 9:
            raise protocol.InvalidEnvironment("digits must be 1 to 9")

    def make_example(self, rng):
        answer = "".join(str(rng.randint(0, 9)) for _ in range(self.args["digits"]))
        return protocol.Example(messages=[{"role": "user", "content": "Say " + answer}], answer=answer)


env = Echo({"digits": 2}, seed=0)
example = env.example(0, "eval")
scores = env.score(example.answer, example)
try:
    Echo({"digits": 10}, seed=0)
    refused = None
except protocol.InvalidEnvironment as error:
    refused = str(error)
print(json.dumps({
    "file": protocol.__file__, "path": sys.path, "reward": scores.reward, "functions": scores.functions,
    "split": protocol.split_of(example), "same": Echo({}, seed=0).example(0, "eval") == example, "refused": refused,
    "foreign": sorted({name.split(".")[0] for name in sys.modules} & {"torch", "django", "engine", "labsdk", "lab", "pydantic", "numpy"}),
}))
'''


def test_its_wheel_declares_no_requirement_and_runs_with_the_standard_library_alone(tmp_path):
    source = shutil.copytree(SOURCE, tmp_path / "source", ignore=shutil.ignore_patterns("*.egg-info", "build"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    [wheel] = (tmp_path / "dist").glob("*.whl")
    assert wheel.name == f"lab_environments-{lab_environments.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"lab_environments-{lab_environments.__version__}.dist-info/METADATA").decode()
        members = sorted(name for name in archive.namelist() if not name.startswith("lab_environments-"))
    assert "Name: lab-environments\n" in metadata
    assert "Requires-Dist" not in metadata
    assert members == ["lab_environments/__init__.py", "lab_environments/py.typed"]

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )
    result = subprocess.run([sys.executable, "-I", "-S", "-c", PROGRAM, str(site)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["file"] == str(site / "lab_environments" / "__init__.py")
    assert [entry for entry in found["path"][1:] if not entry.startswith(sys.base_prefix)] == []  # the standard library only
    assert found["foreign"] == []
    assert found["reward"] == 1.5  # the weighted sum of the rubric: 1 × exact + 0.5 × short, above 1
    assert found["functions"] == {"exact": 1.0, "short": 1.0}
    assert found["split"] == "eval" and found["same"] is True
    assert found["refused"] == "digits must be 1 to 9"


def test_the_engine_and_the_catalogue_name_the_protocols_own_classes():
    for name in lab_environments.__all__:
        assert getattr(base, name) is getattr(lab_environments, name)
        assert getattr(engine_environments, name) is getattr(lab_environments, name)
    assert catalog.EnvironmentInfo is lab_environments.EnvironmentInfo
