"""The seccomp filter every bubblewrap sandbox of Lab runs under (``bwrap --seccomp FD``).

Every system call is allowed but those a container is refused by Docker's default seccomp
profile (https://github.com/moby/moby/blob/master/profiles/seccomp/default.json, the calls it
allows only with a capability an unprivileged container lacks, such as CAP_SYS_ADMIN,
CAP_SYS_PTRACE, CAP_SYS_MODULE, CAP_SYS_BOOT, CAP_SYS_RAWIO, CAP_SYS_TIME), which fail with
EPERM: ``REFUSED_SYSCALLS`` and ``clone`` asking for any new namespace (``NAMESPACE_FLAGS``); ``clone3``,
whose flags lie in memory a filter cannot read, with ENOSYS (so that the C library falls back to
``clone``), as Docker does. They are the ways out of a sandbox or into the kernel: namespaces and
mounts (bubblewrap sets those up before the filter applies), tracing and reading other processes,
kernel keyrings, eBPF, performance counters, userfaultfd, file handles, modules, kexec, reboot,
swap, the kernel log, io_uring. Unlike Docker's, the list also refuses ``ptrace`` and
``process_vm_readv``/``writev`` on every kernel. The NUMA calls (``mbind``, ``set_mempolicy``,
``move_pages``) stay allowed: the CPU engine binds its threads' memory with them; so does
``personality``, which Docker limits to a few values (libseccomp cannot say "none of these
values" in one rule), and which changes only the calling process's own execution domain.

The filter is built by libseccomp (Debian's libseccomp2, through ``pyseccomp``) for the native
architecture only (x86_64 or aarch64): a call of another ABI (32-bit x86, x32) gets ENOSYS,
so none can reach a refused call by another number. Names a kernel architecture lacks (``iopl``
on aarch64) are skipped.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pyseccomp as seccomp

#: Calls that fail with EPERM in every sandbox.
REFUSED_SYSCALLS = (
    # namespaces and mounts
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "mount_setattr",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
    # other processes' memory
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    # kernel keyrings
    "keyctl", "add_key", "request_key",
    # kernel programs, counters and page-fault handling
    "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # file handles (open_by_handle_at reads any file of a mount)
    "open_by_handle_at", "name_to_handle_at",
    # modules, kexec, reboot
    "init_module", "finit_module", "delete_module", "create_module", "get_kernel_syms", "query_module",
    "kexec_load", "kexec_file_load", "reboot",
    # the machine's settings and devices
    "swapon", "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "lookup_dcookie",
    "iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime", "stime",
    "nfsservctl", "sysfs", "_sysctl", "uselib", "ustat", "vhangup", "vm86", "vm86old",
)
#: ``clone``'s flags that ask for a new namespace: a ``clone`` with any of them fails with EPERM.
NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
#: The descriptor a command line from ``file_prefix`` hands bwrap the filter on.
FILE_FD = 9


@functools.cache
def program() -> bytes:
    """Return the filter as a BPF program (what ``bwrap --seccomp`` reads), built once."""
    refused = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    rules.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.ERRNO(errno.ENOSYS))
    for name in REFUSED_SYSCALLS:
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) >= 0:
            rules.add_rule(refused, name)
    for flag in NAMESPACE_FLAGS.values():  # the flags are clone's first argument on x86_64 and aarch64
        rules.add_rule(refused, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as exported:
        rules.export_bpf(exported)
        exported.seek(0)
        return exported.read()


def memfd() -> int:
    """Return a new descriptor (to pass to bwrap, then close) reading the filter from its start."""
    fd = os.memfd_create("lab-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def program_file() -> Path:
    """Return a file holding the filter: ``lab-seccomp-<uid>/filter-<sha256 prefix>.bpf`` in the system's
    temporary folder, a folder only this user may write (no sandbox sees the host's /tmp);
    written when missing or not the filter."""
    folder = Path(tempfile.gettempdir()) / f"lab-seccomp-{os.geteuid()}"
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    status = folder.lstat()
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid() or status.st_mode & 0o022:
        raise PermissionError(f"{folder} is not a folder only this user may write")
    data = program()
    path = folder / f"filter-{hashlib.sha256(data).hexdigest()[:16]}.bpf"
    try:
        if path.read_bytes() == data:
            return path
    except OSError:
        pass
    fd, partial = tempfile.mkstemp(dir=folder, prefix=".filter-")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(partial, path)
    return path


def file_prefix() -> list[str]:
    """Return the start of a command line that opens ``program_file()`` on ``FILE_FD`` and runs
    the rest (bwrap with ``--seccomp FILE_FD``): for a command started by a process that passes
    no descriptors on (the local launcher's supervisor, a build step)."""
    return ["/bin/sh", "-c", f'exec {FILE_FD}<"$0" && exec "$@"', str(program_file())]
