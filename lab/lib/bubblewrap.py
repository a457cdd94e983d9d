"""The part of a bubblewrap (``bwrap``) command line that every sandbox of Lab shares.

Both the local launcher's engine sandbox (``jobs.launchers.isolation``) and user sandboxes
(``sandboxes.runtime.local``) start from ``base_arguments``: new user, PID, IPC, UTS, cgroup and
(unless shared) network namespaces, uid and gid 1000 inside, every capability dropped, no nested
user namespaces, the sandbox killed with the process that started it, fresh ``/tmp``, ``/dev``
and ``/proc``, and the system's programs and libraries (``/usr`` and the few ``/etc`` files a
program needs) bound read-only. Each caller then adds its own binds and its command.

``bubblewrap`` (https://github.com/containers/bubblewrap) is Debian's package of that name.
"""

from __future__ import annotations

#: The uid and gid a sandboxed process has inside (as in the engine pods' security context).
SANDBOX_UID = 1000
#: System folders bound read-only where present (symlinks to /usr on merged-/usr systems).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: The files and folders of /etc that programs need (the dynamic loader's cache, certificates,
#: time zones, name service switch, users, pip's configuration); the rest of /etc stays out.
ETC_ENTRIES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates", "ca-certificates.conf",
    "alternatives", "localtime", "timezone", "zoneinfo", "nsswitch.conf", "hosts", "passwd", "group",
    "mime.types", "os-release", "xdg", "pip.conf", "gai.conf", "host.conf",
)


def base_arguments(*, hostname: str, share_network: bool = False, bwrap: str = "bwrap") -> list[str]:
    """Return the start of a ``bwrap`` command line: namespaces, identity, fresh kernel file
    systems and the read-only system folders (see the module's docstring).

    ``share_network`` keeps the host's network namespace (every address the host reaches);
    otherwise the sandbox has only its own loopback.
    """
    args = [
        bwrap,
        "--unshare-all", "--unshare-user", "--disable-userns",
        *(["--share-net"] if share_network else []),
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        "--cap-drop", "ALL",
        "--die-with-parent",
        "--hostname", hostname,
        "--tmpfs", "/tmp",
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/dev/shm",
        "--ro-bind-try", "/sys", "/sys",
    ]
    for directory in SYSTEM_DIRS:
        args += ["--ro-bind-try", directory, directory]
    for entry in ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    return args
