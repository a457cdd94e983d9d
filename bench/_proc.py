"""What the benchmarks read of a process (Linux ``/proc``)."""

from __future__ import annotations


def rss_kib(pid: int) -> int:
    """Return a process's resident set size in KiB (``/proc/<pid>/status`` ``VmRSS``); RuntimeError without one."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")
