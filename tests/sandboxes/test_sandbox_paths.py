"""Which area of a sandbox a file route's path is in (sandboxes/runtime/paths.py): ``/workspace``
for relative paths, ``/tmp``, and the rest of its writable root, never a path with ``..`` or one
through a folder the sandbox mounts on its own. No sandbox runs here; test_local_runtime.py moves
files through an agent."""

from __future__ import annotations

import pytest

from sandboxes.runtime.base import RuntimeRefusal
from sandboxes.runtime.paths import ROOT, sandbox_parts


@pytest.mark.parametrize(("path", "area", "parts"), [
    ("answer.txt", "/workspace", ["answer.txt"]),
    ("/workspace/src/./main.py", "/workspace", ["src", "main.py"]),
    ("/tmp/in/data.txt", "/tmp", ["in", "data.txt"]),
    ("/app/answer.txt", ROOT, ["app", "answer.txt"]),
    ("/etc//hosts", ROOT, ["etc", "hosts"]),
    ("/workspacex/a", ROOT, ["workspacex", "a"]),
    ("/tmpx", ROOT, ["tmpx"]),
])
def test_it_names_the_area_and_components_of_a_path(path, area, parts):
    assert sandbox_parts(path) == (area, parts)


@pytest.mark.parametrize("path", [
    "", "/", "/workspace", "/tmp", "/proc/1/environ", "/dev/null", "/app/../etc/passwd", "/../etc",
    "../escape", "/tmp/../etc/passwd", "a\x00b", "/" + "a" * 4096, None,
])
def test_it_refuses_a_path_that_leaves_names_nothing_or_goes_through_a_mount_of_its_own(path):
    with pytest.raises(RuntimeRefusal) as refused:
        sandbox_parts(path)
    assert refused.value.code == "invalid_path"


@pytest.mark.parametrize(("path", "said"), [
    ("/", "/ is a folder: name a file in it."),
    ("/tmp", "/tmp is a folder: name a file in it."),
    ("/workspace/", "/workspace is a folder: name a file in it."),
    (".", "/workspace is a folder: name a file in it."),
    ("/app/../etc/passwd", "path must not contain '..'."),
    ("/proc/1/environ", "path must not be in /proc, the sandbox's own kernel file system."),
    ("", "path must name a file: an absolute path, or one relative to /workspace."),
])
def test_a_refusal_says_what_is_wrong_with_the_path(path, said):
    with pytest.raises(RuntimeRefusal) as refused:
        sandbox_parts(path)
    assert refused.value.message == said
