"""What of the machine a worker of this agent sees: which parts of its sandbox this machine
gives (probed once as the agent starts), and the sandbox a worker's start asks for.

A process worker of an agent running as root runs in namespaces of its own, made by
agent/enter.py as it starts: its own /tmp and /var/tmp (folders in the worker's folder, its
user's alone, removed with it), /dev/shm, /run/lock and /dev/mqueue (file systems that end
with it), a /proc that shows it only its own processes (``hidepid=invisible``), and its own
IPC namespace; its control group caps its processes and threads (``pids.max``). The probe
tries each part in a throwaway namespace of a child process, so what the agent reports
(``Isolation``, in its Hello: the machine's ``isolation``) is what the kernel did, not what it
was expected to do; a worker's start asks for no part the probe did not find, and enter.py
refuses a start whose asked part fails.

An agent that is not root gives none of it: its workloads run as its own user, and see what
that user sees. The Docker executor's containers have theirs from the engine (a private /tmp
of the image's, /dev/shm, pid and IPC namespaces) and ``--pids-limit`` (agent/engine_answers.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import cgroups

ENTER = str(Path(__file__).with_name("enter.py"))
# A worker's processes and threads (pids.max). Threads count: a PyTorch process holds about
# as many as the machine has cores (intra-op pool) plus a few dozen of its own, and each
# DataLoader worker is a process of its own with threads of its own. 8 192 keeps 8 dataloader
# workers on a 256-core machine (8 x 256 + the trainer) with room to spare, and a fork bomb
# at a quarter of the default pid_max (32 768) on the machine.
PIDS_MAX = 8192
# /dev/shm of a worker without a memory limit: half the machine's memory, tmpfs' own default
# (its pages are charged to the worker's memory group all the same).
SHM_SHARE = 0.5

# The parts, by the names the protocol reports them (Hello.isolation).
UNPRIVILEGED_USER = "unprivileged_user"  # its own user id, never root nor the agent's
PRIVATE_TMP = "private_tmp"  # /tmp and /var/tmp of its own
PRIVATE_SHM = "private_shm"  # /dev/shm, /run/lock and /dev/mqueue of its own
HIDDEN_PROCESSES = "hidden_processes"  # /proc shows its own processes only
PRIVATE_IPC = "private_ipc"  # System V IPC and POSIX queues of its own
PROCESS_LIMIT = "process_limit"  # pids.max in its control group
UID_HANDOVER = "uid_handover"  # a user id goes to another workspace only cleaned (uid_handover.py)
PARTS = (
    UNPRIVILEGED_USER,
    PRIVATE_TMP,
    PRIVATE_SHM,
    HIDDEN_PROCESSES,
    PRIVATE_IPC,
    PROCESS_LIMIT,
    UID_HANDOVER,
)
NAMESPACE_PARTS = (PRIVATE_TMP, PRIVATE_SHM, HIDDEN_PROCESSES, PRIVATE_IPC)
TOGETHER = (PRIVATE_TMP, PRIVATE_SHM, PRIVATE_IPC)  # one namespace, made whole or not at all


@dataclass(frozen=True)
class Isolation:
    """The parts this machine gives its process workers, and its workers' process limit."""

    enforced: frozenset[str] = frozenset()
    pids_max: int = 0  # 0: none

    @property
    def not_enforced(self) -> tuple[str, ...]:
        return tuple(p for p in PARTS if p not in self.enforced)

    def has(self, part: str) -> bool:
        return part in self.enforced

    @property
    def sandboxed(self) -> bool:
        """Whether workers get their namespaces (enter.py makes these parts together)."""
        return all(part in self.enforced for part in TOGETHER)


def probe(switch: bool, pids_max: int, cgroup_root: Path = cgroups.ROOT) -> Isolation:
    """What this machine gives: the namespace parts as enter.py's probe found them (a child
    process: its namespaces end with it), the process limit where the agent may write the
    pids controller. An agent that is not root gives none."""
    if not switch:
        return Isolation()
    found = {UNPRIVILEGED_USER, UID_HANDOVER}
    found |= _namespace_parts()
    if pids_max and cgroups.pids_available(cgroup_root):
        found.add(PROCESS_LIMIT)
    return Isolation(frozenset(found), pids_max if PROCESS_LIMIT in found else 0)


def _namespace_parts() -> set[str]:
    with tempfile.TemporaryDirectory(prefix="astraeus-probe-") as folder:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", ENTER, "--probe", folder],
                capture_output=True,
                text=True,
                timeout=30,
                env={},
                cwd="/",
            )
            found = json.loads(done.stdout.strip().splitlines()[-1])
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return set()
    parts = {part for part in NAMESPACE_PARTS if found.get(part) is True}
    if not parts >= set(TOGETHER):
        return set()  # /proc alone is not made: it is part of the same namespace
    return parts


def shm_bytes(memory_limit: int | None, machine_memory: int) -> int:
    """The size of a worker's /dev/shm: its memory limit, at most half the machine's memory."""
    share = int(machine_memory * SHM_SHARE)
    return min(memory_limit, share) if memory_limit else share


def under_shared_tmp(path: Path) -> bool:
    """Whether ``path`` is below /tmp or /var/tmp (not one of them): the sandbox covers it."""
    resolved = Path(os.path.realpath(path))
    return any(resolved.is_relative_to(top) and resolved != top for top in SHARED_TMP)


SHARED_TMP = (Path("/tmp"), Path("/var/tmp"))
TMP_FOLDERS = ("tmp", "var-tmp")  # in the worker's folder, bound over SHARED_TMP


def spec(
    isolation: Isolation,
    folder: Path,
    *,
    shm: int,
    keep: list[Path],
    links: list[tuple[Path, Path]],
) -> dict[str, Any] | None:
    """enter.py's ``sandbox``: the private folders, /dev/shm's size, the folders the workload
    needs under /tmp or /var/tmp (bound back at their paths) and its links there; None where
    the machine gives no namespace part."""
    if not isolation.sandboxed:
        return None
    kept = sorted({str(Path(os.path.realpath(p))) for p in keep if under_shared_tmp(p)})
    return {
        "tmp": [str(folder / name) for name in TMP_FOLDERS],
        "shm_bytes": shm,
        "keep": kept,
        "links": [[str(link), str(target)] for link, target in links],
        "hide_processes": isolation.has(HIDDEN_PROCESSES),
    }
