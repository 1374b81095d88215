"""The last step before a workload runs: join its control group, stop being root, become it.

    python -I -S agent/enter.py <worker folder>

The shim starts this as root, with an empty environment (the spec's variables, LD_PRELOAD or
PYTHONPATH say, must never reach a root process) and run by path (``-I -S``: no site, no
user's path, nothing of this package imported). It reads ``spec.json`` (the agent's, 0600),
writes its own pid into the group's ``cgroup.procs`` (so everything the workload ever forks is
in the group), turns off gaining privileges through setuid programs, takes the workload's
groups and user, moves to its working folder, and execs the command in its environment. A
command that cannot be run ends like a shell's: 127 when it is not found, 126 otherwise.
"""

import ctypes
import json
import os
import sys
from typing import Any

PR_SET_NO_NEW_PRIVS = 38
WORKLOAD_UMASK = 0o007  # the user and its workspace's group (its drives), nobody else


def _no_new_privileges() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def _become(spec: dict[str, Any]) -> None:
    identity = spec.get("identity")
    if not identity:
        return  # the agent's own user runs it (the agent is not root)
    os.setgroups([int(g) for g in identity.get("groups") or []])
    os.setresgid(identity["gid"], identity["gid"], identity["gid"])
    os.setresuid(identity["uid"], identity["uid"], identity["uid"])
    if os.getuid() == 0 or os.geteuid() == 0:
        raise PermissionError("still root after setresuid")


def main() -> int:
    folder = sys.argv[1]
    with open(os.path.join(folder, "spec.json")) as f:
        spec = json.load(f)
    argv = spec["argv"]
    try:
        for procs in spec.get("cgroup_procs") or []:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        _no_new_privileges()
        _become(spec)
        os.umask(WORKLOAD_UMASK)
        os.chdir(spec.get("cwd") or "/")
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
