"""Reading environment wheels without importing them: what is accepted, and every hostile form refused."""

from __future__ import annotations

import io
import stat
import zipfile

import pytest

from environments.wheels import InvalidWheel, read_wheel
from tests.support.wheelbuilder import build_wheel, lab_wheel


def read(filename_and_bytes):
    filename, data = filename_and_bytes
    return read_wheel(io.BytesIO(data), filename=filename)


def test_it_reads_a_verifiers_package_from_its_metadata():
    info = read(build_wheel("My_Env", "0.1.0", requires=["verifiers>=0.4.0", "numpy<3"]))
    assert (info.name, info.version, info.kind, info.module, info.entry_point) == ("my-env", "0.1.0", "verifiers", "my_env", "my_env")
    assert info.dependencies == ["verifiers>=0.4.0", "numpy<3"]
    assert info.verifiers_version == ">=0.4.0"
    assert info.summary == "a test environment"


def test_it_reads_a_lab_package_from_its_entry_point():
    info = read(lab_wheel("echo-env", "1.2"))
    assert (info.kind, info.module, info.entry_point, info.version) == ("lab", "echo_env", "echo_env:Echo", "1.2")
    assert info.verifiers_version == ""


@pytest.mark.parametrize(
    ("wheel", "message"),
    [
        (("notes.txt", b"hello"), "not a wheel file name"),
        (("my_env-0.1.0-py3-none-any.whl", b"not a zip at all"), "not a zip archive"),
        (("my_env-0.1.0-cp311-cp311-linux_x86_64.whl", build_wheel()[1]), "pure Python"),
        (build_wheel(metadata_name="other-env"), "METADATA names the package 'other-env'"),
        (build_wheel(metadata_version="0.2.0"), "METADATA says version '0.2.0'"),
        (build_wheel(metadata="Metadata-Version: 2.1\nName: my-env\n"), "must declare Metadata-Version, Name and Version"),
        (build_wheel(drop=("{dist_info}/METADATA",)), "has no my_env-0.1.0.dist-info/METADATA"),
        (build_wheel(drop=("{dist_info}/RECORD",)), "has no my_env-0.1.0.dist-info/RECORD"),
        (build_wheel(record="my_env/__init__.py,sha256=AAAA,10\n"), "RECORD lies about 'my_env/__init__.py'"),
        (build_wheel(files={"other/__init__.py": ""}), "no top-level module 'my_env'"),
        (build_wheel(requires=[]), "neither a verifiers environment"),
        (build_wheel(requires=["verifiers>=>0.4"]), "invalid Requires-Dist"),
        (build_wheel("json", files={"json/__init__.py": ""}), "cannot be an environment's"),
        (build_wheel("textarena", files={"textarena/__init__.py": ""}), "verifiers has a taskset 'textarena' of its own"),
        (build_wheel(entry_points="[lab.environments]\na = x:Y\nb = x:Z\n"), "exactly one entry"),
        (build_wheel(entry_points="[lab.environments]\na = not a path\n"), "must read module:Class"),
        (build_wheel(entry_points="this is not ini"), "not a valid INI file"),
    ],
)
def test_it_refuses_wheels_whose_metadata_is_missing_or_lies(wheel, message):
    with pytest.raises(InvalidWheel, match=message.replace("(", r"\(").replace(".", r"\.")):
        read(wheel)


@pytest.mark.parametrize("member", ["../evil.py", "/etc/evil.py", "my_env/../../evil.py", "C:/evil.py", "my_env\\..\\evil.py"])
def test_it_refuses_path_traversing_members(member):
    with pytest.raises(InvalidWheel, match="points outside the package"):
        read(build_wheel(extra_members=[(member, b"x = 1\n")]))


def test_it_refuses_symbolic_links():
    link = zipfile.ZipInfo("my_env/link.py")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with pytest.raises(InvalidWheel, match="symbolic link"):
        read(build_wheel(extra_members=[(link, b"/etc/passwd")]))


def test_it_refuses_zip_bombs_by_their_ratio():
    with pytest.raises(InvalidWheel, match="zip bomb"):
        read(build_wheel(extra_members=[("my_env/zeros.bin", b"\0" * (50 * 1024 * 1024))]))


def test_it_refuses_members_that_expand_past_the_total_limit(monkeypatch):
    from environments import wheels

    monkeypatch.setattr(wheels, "MAX_UNCOMPRESSED_BYTES", 2 * 1024 * 1024)
    text = "".join(f"{index:08x}" for index in range(400_000)).encode()  # 3.2 MB, compresses ~3x
    with pytest.raises(InvalidWheel, match="expand to more than 2 MB"):
        read(build_wheel(extra_members=[("my_env/data.txt", text)]))


def test_it_refuses_a_member_whose_header_lies_about_its_size():
    text = "".join(f"{index:08x}" for index in range(100_000)).encode()
    filename, wheel = build_wheel(files={"my_env/__init__.py": "", "my_env/data.txt": text})
    raw = bytearray(wheel)
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        info = archive.getinfo("my_env/data.txt")
    # The local header and the central directory both claim 100 bytes (offsets 22 and 24, PKWARE APPNOTE 4.3.7/4.3.12).
    raw[info.header_offset + 22 : info.header_offset + 26] = (100).to_bytes(4, "little")
    central = raw.find(b"PK\x01\x02" + raw[info.header_offset + 4 : info.header_offset + 6])
    while raw[central + 46 : central + 46 + len(info.filename)] != info.filename.encode():
        central = raw.find(b"PK\x01\x02", central + 1)
    raw[central + 24 : central + 28] = (100).to_bytes(4, "little")
    with pytest.raises(InvalidWheel, match="damaged|RECORD lies"):
        read((filename, bytes(raw)))


def test_it_refuses_huge_metadata():
    with pytest.raises(InvalidWheel, match="METADATA is larger than 256 KB"):
        read(build_wheel(metadata="Metadata-Version: 2.1\nName: my-env\nVersion: 0.1.0\nSummary: " + "x" * 300_000 + "\n"))


def test_it_refuses_too_many_members(monkeypatch):
    from environments import wheels

    monkeypatch.setattr(wheels, "MAX_MEMBERS", 5)
    with pytest.raises(InvalidWheel, match="at most 5 are allowed"):
        read(build_wheel(files={f"my_env/m{index}.py": "" for index in range(6)} | {"my_env/__init__.py": ""}))


def test_it_refuses_a_member_missing_from_record():
    filename, wheel = build_wheel()
    buffer = io.BytesIO(wheel)
    with zipfile.ZipFile(buffer, "a") as archive:
        archive.writestr("my_env/extra.py", "x = 1\n")
    with pytest.raises(InvalidWheel, match="'my_env/extra.py' is in the wheel but not in its RECORD"):
        read((filename, buffer.getvalue()))
