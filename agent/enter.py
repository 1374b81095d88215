"""The last step before a workload runs: join its control group, stop being root, become it.

    python -I -S agent/enter.py <worker folder>

The shim starts this as root, with an empty environment (the spec's variables, LD_PRELOAD or
PYTHONPATH say, must never reach a root process) and run by path (``-I -S``: no site, no
user's path, nothing of this package imported). It reads ``spec.json`` (the agent's, 0600),
writes its own pid into the group's ``cgroup.procs`` (so everything the workload ever forks is
in the group), turns off gaining privileges through setuid programs, takes the workload's
groups and user, moves to its working folder, and execs the command in its environment. A
command that cannot be run ends like a shell's: 127 when it is not found, 126 otherwise.

A worker with read-only drives gets a mount namespace of its own first, in which each such
drive's folder is bound read-only onto itself: its link and its variable lead there, and
writing, creating, removing or changing anything in it fails (EROFS). The workload cannot undo
it: it is not root, and in a namespace it makes of its own the kernel locks these mounts (no
less privileged namespace may make them writable or uncover what is beneath). An agent that is
not root makes the namespace in a user namespace of the workload's own (its workload runs as
the agent's user, and so could reach the folder through another of that user's processes: a
guard against mistakes there, as everything else such an agent gives).

Before it execs, it looks, as the workload's user, at the files the command names (an argument
that is a path to something that exists, as root sees it; the working folder): one its user may
not read, or behind a folder it may not enter (a script under /root), is not run at all. What it
found goes to ``unreadable.json`` (opened while still root; the shim reports it as a cause), and
a line to the log: the workload would otherwise end "Exited with code 2", Python's "Permission
denied" in its log alone.
"""

import ctypes
import json
import os
import sys
from typing import Any

PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 0x20, 0x1000, 0x4000, 0x80000
WORKLOAD_UMASK = 0o007  # the user and its workspace's group (its drives), nobody else
UNREADABLE = "unreadable.json"  # what the command names that its user may not reach (shim.py)


def _no_new_privileges() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def _checked(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        why = f"its read-only drives could not be made read-only ({what}: {os.strerror(number)})"
        raise OSError(number, why)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read_only(folders: list[str]) -> None:
    """Bind each folder read-only onto itself in a mount namespace of this process's own
    (see above); nothing made here reaches the machine's namespace."""
    if not folders:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_void_p,
    ]
    if os.geteuid() == 0:
        _checked(libc.unshare(CLONE_NEWNS), "unshare")
    else:
        uid, gid = os.geteuid(), os.getegid()
        _checked(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _checked(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    for folder in folders:
        path = folder.encode()
        # A remount keeps the flags a namespace may not drop (noexec of the folder's own file
        # system); nosuid and nodev may always be added.
        kept = MS_NOEXEC if os.statvfs(folder).f_flag & os.ST_NOEXEC else 0
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | kept
        _checked(libc.mount(path, path, None, MS_BIND, None), "mount --bind")
        _checked(libc.mount(None, path, None, flags, None), "mount -o remount,bind,ro")


def _become(spec: dict[str, Any]) -> None:
    identity = spec.get("identity")
    if not identity:
        return  # the agent's own user runs it (the agent is not root)
    os.setgroups([int(g) for g in identity.get("groups") or []])
    os.setresgid(identity["gid"], identity["gid"], identity["gid"])
    os.setresuid(identity["uid"], identity["uid"], identity["uid"])
    if os.getuid() == 0 or os.geteuid() == 0:
        raise PermissionError("still root after setresuid")


def named_paths(argv: list[str], cwd: str) -> list[str]:
    """What the command names that exists (as root sees it): its working folder, the command
    itself when it is a path, and every argument that is a path, absolute or in the working
    folder (``python3 train.py``). An option (``--out=…``) or a script's text is not one."""
    found = [cwd] if os.path.isdir(cwd) else []
    for index, arg in enumerate(argv):
        if not arg or arg.startswith("-") or "\0" in arg or (index == 0 and "/" not in arg):
            continue
        path = os.path.normpath(os.path.join(cwd, arg))  # an absolute arg stays itself
        if os.path.exists(path) and path not in found:  # False for a text too long to be one
            found.append(path)
    return found


def blocked(path: str, *, run_only: bool = False) -> str | None:
    """Whether this process may reach ``path``: None if so; else the first folder on the way
    it may not enter (the path itself, a folder), or "" when it is a file it may not read. The
    command itself need only be run (``run_only``: exec checks the rest)."""
    folders: list[str] = []
    parent = os.path.dirname(path)
    while parent and parent not in folders:
        folders.insert(0, parent)
        parent = os.path.dirname(parent)
    for folder in folders:
        if not os.access(folder, os.X_OK):
            return folder
    if run_only:
        return None
    if os.path.isdir(path):
        return None if os.access(path, os.X_OK) else path
    return None if os.access(path, os.R_OK) else ""


def _unreadable(report: int, paths: list[str], argv0: str | None, uid: int) -> bool:
    """As the workload's user: write the first path it cannot reach to ``report`` (opened while
    root), say so in the log; True when there was one."""
    for path in paths:
        where = blocked(path, run_only=path == argv0)
        if where is None:
            continue
        found = {"path": path, "blocked_at": where, "uid": uid}
        os.write(report, json.dumps(found).encode())
        why = f"may not enter {where}" if where else "may not read it"
        print(f"astraeus: not run: {path}: uid {uid} {why} (Permission denied)", flush=True)
        return True
    return False


def main() -> int:
    folder = sys.argv[1]
    with open(os.path.join(folder, "spec.json")) as f:
        spec = json.load(f)
    argv, cwd = spec["argv"], spec.get("cwd") or "/"
    paths = named_paths(argv, cwd)
    argv0 = os.path.normpath(os.path.join(cwd, argv[0])) if "/" in argv[0] else None
    try:
        for procs in spec.get("cgroup_procs") or []:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        _read_only(spec.get("read_only") or [])
        # Opened while root (the folder is the agent's), written as the workload's user; never
        # the workload's own: closed at exec.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        report = os.open(os.path.join(folder, UNREADABLE), flags, 0o600)
        _no_new_privileges()
        _become(spec)
        os.umask(WORKLOAD_UMASK)
        if _unreadable(report, paths, argv0, os.getuid()):
            return 126
        os.close(report)
        os.chdir(cwd)
    except OSError as error:
        print(f"astraeus: the worker could not be started: {error.strerror or error}", flush=True)
        return 126
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except FileNotFoundError:
        print(f"{argv[0]}: command not found", flush=True)  # as a shell says it
        return 127
    except OSError as error:
        print(f"{argv[0]}: {error.strerror}", flush=True)
        return 126


if __name__ == "__main__":
    sys.exit(main())
