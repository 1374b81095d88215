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

A worker of an agent running as root gets its sandbox in that namespace (``spec["sandbox"]``):
its own /tmp and /var/tmp (folders of its own, in the worker's folder, its user's alone, bound
over them: what an earlier workload left in the machine's /tmp is not there, and what this one
leaves goes with the worker's folder), its own /dev/shm, /run/lock and /dev/mqueue (fresh
file systems that end with it), a /proc of its own mounted ``hidepid=invisible`` (per mount
since Linux 5.8: the machine's /proc is untouched), where it sees only its own user's
processes (each worker runs as a user of its own), and an IPC namespace of its own (System V
shared memory, semaphores and message queues). Folders it needs that lie under /tmp or
/var/tmp (its own folder, its drives, on a machine whose data folder is there; the entry of
/tmp that holds a script the command names, its working folder or a folder of its PYTHONPATH)
are bound back at their paths, and its links at mount paths made again. The machine's
services' Unix sockets that anyone may connect to (PostgreSQL's, which trusts local users on
many machines) are covered by /dev/null: nftables sees no Unix socket. A part the agent asked
for that cannot be made ends the start (126): the agent asks only for what its probe of the
machine found (``probe``, below) and says what it does not enforce.

Not a pid namespace: its first process would be the namespace's init, which ignores the
SIGTERM of the agent's stop unless it handles it and must reap every orphan (a container needs
an init for it, --init); hidepid gives the workload the same view of /proc, while the agent's
stop, the signals and the exit codes the shim reports stay as they are.

Before it execs, it looks, as the workload's user, at the files the command names (an argument
that is a path to something that exists, as root sees it; the working folder): one its user may
not read, or behind a folder it may not enter (a script under /root), is not run at all. What it
found goes to ``unreadable.json`` (opened while still root; the shim reports it as a cause), and
a line to the log: the workload would otherwise end "Exited with code 2", Python's "Permission
denied" in its log alone.
"""

import contextlib
import ctypes
import json
import os
import stat
import sys
from typing import Any

PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWIPC = 0x00020000, 0x10000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 0x20, 0x1000, 0x4000, 0x80000
SHARED_TMP = ("/tmp", "/var/tmp")  # each covered by a folder of the worker's own
RUN_LOCK_BYTES = 1 << 20  # lock files: a private /run/lock needs little
WORKLOAD_UMASK = 0o007  # the user and its workspace's group (its drives), nobody else
UNREADABLE = "unreadable.json"  # what the command names that its user may not reach (shim.py)


def _no_new_privileges() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def _checked(result: int, what: str, part: str = "its read-only drives") -> None:
    if result != 0:
        number = ctypes.get_errno()
        why = f"{part} could not be made ({what}: {os.strerror(number)})"
        raise OSError(number, why)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_void_p,
    ]
    return libc


def _held_open(folder: str) -> int:
    """The folder, held open (O_PATH): bound later through /proc/self/fd whatever covers it."""
    return os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def named_in_shared_tmp(paths: list[str], env: dict[str, str]) -> list[str]:
    """The entries of the machine's /tmp or /var/tmp that hold what the command names (its
    script, its working folder, the folders of its PYTHONPATH), as root sees them: bound back
    in its sandbox, so that ``python /tmp/repo/train.py`` runs as it did, its neighbours
    importable; the rest of the machine's /tmp stays out of its sight."""
    pythonpath = [p for p in (env.get("PYTHONPATH") or "").split(":") if p.startswith("/")]
    found: list[str] = []
    for path in [*paths, *(p for p in pythonpath if os.path.exists(p))]:
        real = os.path.realpath(path)
        for top in SHARED_TMP:
            if real.startswith(top + "/"):
                entry = os.path.join(top, real[len(top) + 1 :].split("/")[0])
                if entry not in found:
                    found.append(entry)
    return found


def control_plane_sockets(own_uid: int | None) -> list[str]:
    """The machine's Unix sockets that any user may connect to and that a service user owns
    (neither root nor the workload): PostgreSQL's /run/postgresql/.s.PGSQL.5432, which trusts
    local connections on many machines (its superuser to anyone), MariaDB's, Redis'. Each is
    covered in the sandbox by /dev/null (a connection is refused): nftables sees no Unix socket.
    Root's own (the system's logger, its bus) stay; a socket in an abstract name (no path) is
    not covered (see the README)."""
    try:
        with open("/proc/net/unix") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or not fields[7].startswith("/") or fields[7] in found:
            continue
        try:
            st = os.lstat(fields[7])
        except OSError:
            continue  # in another mount namespace, or gone
        service = st.st_uid not in (0, own_uid)
        if stat.S_ISSOCK(st.st_mode) and service and st.st_mode & 0o002:
            found.append(fields[7])
    return found


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _sandbox(libc: ctypes.CDLL, sandbox: dict[str, Any]) -> None:
    """The worker's own /tmp, /var/tmp, /dev/shm, /run/lock, /dev/mqueue and /proc, in the
    mount and IPC namespaces this process has just made (see above)."""
    part = "its sandbox"

    def mount(source: str | None, target: str, kind: str | None, flags: int, data: str) -> None:
        def text(value: str | None) -> bytes | None:
            return value.encode() if value else None

        result = libc.mount(text(source), text(target), text(kind), flags, text(data))
        _checked(result, f"mount {kind or 'bind'} on {target}", part)

    # Its own folders and what it needs under /tmp or /var/tmp, held open before they are
    # covered (they may be under /tmp themselves, on a machine whose data folder is there).
    own = [_held_open(folder) for folder in sandbox["tmp"]]
    kept = []
    for path in sandbox.get("keep") or []:
        with contextlib.suppress(OSError):
            kept.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
    private = MS_NOSUID | MS_NODEV
    for top, fd in zip(SHARED_TMP, own, strict=True):
        if os.path.isdir(top):
            mount(f"/proc/self/fd/{fd}", top, None, MS_BIND, "")
            mount(None, top, None, MS_REMOUNT | MS_BIND | private, "")
    for path, fd in kept:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.makedirs(path, mode=0o755, exist_ok=True)
        else:  # a script directly in /tmp: bound onto an empty file of its name
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, "")
    for fd in own + [fd for _, fd in kept]:
        os.close(fd)
    for link, target in sandbox.get("links") or []:
        if any(_under(link, top) for top in SHARED_TMP) and not os.path.lexists(link):
            os.makedirs(os.path.dirname(link), mode=0o755, exist_ok=True)
            os.symlink(target, link)
    mount("tmpfs", "/dev/shm", "tmpfs", private, f"size={int(sandbox['shm_bytes'])},mode=1777")
    if os.path.isdir("/run/lock"):
        size = f"size={RUN_LOCK_BYTES},mode=1777"
        mount("tmpfs", "/run/lock", "tmpfs", private | MS_NOEXEC, size)
    if os.path.ismount("/dev/mqueue"):  # the new IPC namespace's queues
        mount("mqueue", "/dev/mqueue", "mqueue", private | MS_NOEXEC, "")
    for socket_path in sandbox.get("hidden_sockets") or []:
        with contextlib.suppress(OSError):  # gone since it was listed
            mount("/dev/null", socket_path, None, MS_BIND, "")
    if sandbox.get("hide_processes"):
        mount("proc", "/proc", "proc", private | MS_NOEXEC, "hidepid=invisible")


def probe(folder: str) -> dict[str, bool]:
    """Which parts of the sandbox this machine gives, tried in namespaces of this process's own
    (``--probe``: a process of its own, whose namespaces end with it)."""
    found = dict.fromkeys(("private_tmp", "private_shm", "private_ipc", "hidden_processes"), False)
    if os.geteuid() != 0:
        return found
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) or libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None):
        return found
    found["private_ipc"] = libc.unshare(CLONE_NEWIPC) == 0
    own = f"/proc/self/fd/{_held_open(folder)}".encode()  # the folder may be under /tmp
    tops = [top.encode() for top in SHARED_TMP if os.path.isdir(top)]
    found["private_tmp"] = all(libc.mount(own, top, None, MS_BIND, None) == 0 for top in tops)
    shm = libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=1777")
    found["private_shm"] = shm == 0
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    hidden = libc.mount(b"proc", b"/proc", b"proc", flags, b"hidepid=invisible") == 0
    found["hidden_processes"] = hidden and _hidepid_on_proc()
    return found


def _hidepid_on_proc() -> bool:
    """Whether the /proc this process sees now is mounted hidepid=invisible (a kernel before
    5.8 knows no such value, and had one /proc for the whole machine)."""
    with open("/proc/self/mountinfo") as f:
        lines = [line.split() for line in f]
    procs = [line for line in lines if len(line) > 4 and line[4] == "/proc"]
    return bool(procs) and "hidepid=invisible" in procs[-1][-1].split(",")


def _namespaces(read_only: list[str], sandbox: dict[str, Any] | None) -> None:
    """Bind each read-only drive's folder read-only onto itself, and make the sandbox, in a
    mount namespace of this process's own (see above); nothing made here reaches the
    machine's namespace."""
    if not read_only and not sandbox:
        return
    libc = _libc()
    if os.geteuid() == 0:
        flags = CLONE_NEWNS | (CLONE_NEWIPC if sandbox else 0)
        _checked(libc.unshare(flags), "unshare", "its sandbox" if sandbox else "its drives")
    else:
        uid, gid = os.geteuid(), os.getegid()
        _checked(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _checked(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    if sandbox and os.geteuid() == 0:
        _sandbox(libc, sandbox)
    for folder in read_only:
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
    if sys.argv[1] == "--probe":
        print(json.dumps(probe(sys.argv[2])), flush=True)
        return 0
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
        sandbox = spec.get("sandbox")
        if sandbox:
            named = named_in_shared_tmp(paths, spec["env"])
            sandbox["keep"] = list(dict.fromkeys([*(sandbox.get("keep") or []), *named]))
            own_uid = (spec.get("identity") or {}).get("uid")
            sandbox["hidden_sockets"] = control_plane_sockets(own_uid)
        _namespaces(spec.get("read_only") or [], sandbox)
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
