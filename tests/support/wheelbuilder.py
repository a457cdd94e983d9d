"""Build environment wheels in tests, byte for byte (PEP 427 layout, RECORD with true digests),
and hostile ones by overriding any part."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import tomllib
import zipfile
from pathlib import Path

ADDITION_LIKE = '''"""A tiny Lab-protocol environment: repeat a digit."""
import random

from engine.catalog import EnvironmentInfo
from engine.environments import Environment, Example, RewardFunction


def _exact(completion, example):
    return 1.0 if completion.strip() == example.answer else 0.0


def _starts(completion, example):
    return 1.0 if completion.strip().startswith(example.answer) else 0.0


class Echo(Environment):
    info = EnvironmentInfo(id="{id}", name="{name}", description="repeat a digit", args={{"digits": 1}})
    rubric = (RewardFunction("exact", 1.0, _exact), RewardFunction("starts", 0.0, _starts))

    def make_example(self, rng: random.Random) -> Example:
        answer = "".join(str(rng.randint(0, 9)) for _ in range(self.args["digits"]))
        return Example(messages=[{{"role": "user", "content": f"Say {{answer}}"}}], answer=answer)
'''


def record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(
    name: str = "my-env",
    version: str = "0.1.0",
    *,
    files: dict[str, bytes | str] | None = None,
    requires: list[str] | None = None,
    entry_points: str | None = None,
    metadata: str | None = None,
    metadata_name: str | None = None,
    metadata_version: str | None = None,
    record: str | None = None,
    extra_members: list[tuple[zipfile.ZipInfo | str, bytes]] | None = None,
    drop: tuple[str, ...] = (),
) -> tuple[str, bytes]:
    """Return ``(file name, wheel bytes)``. By default a verifiers-form package: module ``my_env``
    and ``Requires-Dist: verifiers>=0.4.0``. ``files`` are the package's own members."""
    module = re.sub(r"[-_.]+", "_", name).lower()
    dist_info = f"{module}-{version}.dist-info"
    files = {f"{module}/__init__.py": '__all__ = ["MyTaskset"]\n\n\nclass MyTaskset:\n    pass\n'} if files is None else files
    requires = ["verifiers>=0.4.0"] if requires is None else requires
    members: dict[str, bytes] = {path: data.encode() if isinstance(data, str) else data for path, data in files.items()}
    if metadata is None:
        metadata = (
            "Metadata-Version: 2.1\n"
            f"Name: {metadata_name or name}\n"
            f"Version: {metadata_version or version}\n"
            "Summary: a test environment\n"
            + "".join(f"Requires-Dist: {line}\n" for line in requires)
        )
    members[f"{dist_info}/METADATA"] = metadata.encode()
    members[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if entry_points is not None:
        members[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    for path in drop:
        members.pop(path.format(dist_info=dist_info), None)
    if record is None:
        record = "".join(f"{path},{record_digest(data)},{len(data)}\n" for path, data in members.items())
        record += f"{dist_info}/RECORD,,\n"
    members[f"{dist_info}/RECORD"] = record.encode()
    for path in drop:
        members.pop(path.format(dist_info=dist_info), None)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in members.items():  # a fixed date: the same arguments give the same bytes
            archive.writestr(zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0)), data, compress_type=zipfile.ZIP_DEFLATED)
        for info, data in extra_members or []:
            archive.writestr(info, data)
    return f"{module}-{version}-py3-none-any.whl", buffer.getvalue()


def lab_wheel(
    name: str = "echo-env", version: str = "0.1.0", *, organization: str = "acme", extra_requires=(), prelude: str = ""
) -> tuple[str, bytes]:
    """Return a Lab-protocol package (entry point ``lab.environments``) whose Environment repeats a
    digit; ``prelude`` is module code that runs first, on import."""
    module = name.replace("-", "_")
    source = prelude + ADDITION_LIKE.format(id=f"{organization}/{name}@{version}", name=name)
    if extra_requires:
        source = "".join(f"import {requirement}\n" for requirement in extra_requires) + source
    return build_wheel(
        name,
        version,
        files={f"{module}/__init__.py": source},
        requires=list(extra_requires),
        entry_points=f"[lab.environments]\n{name} = {module}:Echo\n",
    )


def folder_wheel(folder: Path) -> tuple[str, bytes]:
    """The package laid out in ``folder`` as the Environments Hub's are (a ``pyproject.toml`` and
    one module named after the project) as a wheel, ``(file name, bytes)``: its module, and its
    pyproject's name, version and dependencies as the wheel's metadata."""
    project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    module = f"{project['name'].replace('-', '_')}.py"
    return build_wheel(
        project["name"],
        project["version"],
        files={module: (folder / module).read_text()},
        requires=project["dependencies"],
    )
