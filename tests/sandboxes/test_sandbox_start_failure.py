"""A sandbox that fails as it starts leaves nothing on its machine: its folder, its disk's tmpfs
and its root's overlay are removed whatever step failed (here bubblewrap is missing, as on a
machine set up wrong, or the ``setpriv`` that starts it), and the failure is a ``start_failed``
refusal."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sandboxes.agent.sandbox import RunningSandbox
from sandboxes.runtime.base import RuntimeRefusal, SandboxSpec
from sandboxes.runtime.local import LocalHost


def _mounts_under(folder: Path) -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines() if line.split()[4].startswith(str(folder))]


@pytest.mark.parametrize(("tool", "said"), [
    ("setpriv", "The sandbox could not start on its machine: No such file or directory."),  # nothing started
    # setpriv and prlimit started, then ended; the tool's path on the machine is not shown
    ("bwrap", "The sandbox ended as it started: prlimit: failed to execute bwrap: No such file or directory"),
])
def test_a_sandbox_that_cannot_start_leaves_no_folder_or_mount(tmp_path, tool, said):
    missing = tmp_path / "no-such" / tool
    host = LocalHost(tmp_path / "sandboxes", **{tool: str(missing)})
    spec = SandboxSpec(sandbox_id="sbx_fails", image="python:3.11", cpu_cores=1.0, memory_gb=0.5, disk_gb=0.05,
                       expires_at=time.time() + 60, slot=1)
    sandbox = RunningSandbox(host, spec, expires_at=spec.expires_at, max_output_bytes=1024)

    with pytest.raises(RuntimeRefusal) as refused:
        asyncio.run(sandbox.start())

    assert refused.value.code == "start_failed"
    assert refused.value.message.startswith(said) and str(tmp_path) not in refused.value.message, refused.value.message
    assert not host.folder(spec).exists()
    assert _mounts_under(host.root) == []
