"""Who a workload runs as: never root, never the agent.

An agent running as root starts each worker as an unprivileged user of its own: the spec's
``user`` when the machine's owner allows that name (``--allow-user``), else a user id from the
agent's range (``--workload-uids``, 2000000-2065535 by default), the worker's own (a hash of
its opaque id modulo the range: the same at every attempt) or, where a kept worker runs as
that, the next free, with no entry in /etc/passwd. Its group is its workspace's
(``--workload-gid-base`` plus the workspace's id), which owns the workspace's drives: a
workspace's workers share its drives and nothing else; another workspace's are another group.
The worker's own folder (its home, progress file and secret files) is its user's alone.

An agent running as an ordinary user (someone's laptop) cannot change user: its workloads run
as that user, and can read whatever that user can.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import stat
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.start import StartSpec

# The server's opaque id of a worker (issue 37 N8), sent in its start as worker_key.
WORKER_KEY = re.compile(r"[A-Za-z0-9_-]{22}")

UID_RANGE = (2_000_000, 2_065_535)
GID_BASE = 2_100_000
MAX_WORKSPACE_ID = 899_999  # gids stay under 3 000 000
NO_SUCH_USER = "The user {user} does not exist on this machine"
NO_FREE_UID = "No user id is free on this machine for another worker (--workload-uids)"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Identity:
    """The user, group and supplementary groups a workload runs with."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    # The name it runs under (USER, LOGNAME); a user id of the range has none in /etc/passwd.
    user: str = ""


@dataclass(frozen=True)
class WorkloadUsers:
    """The machine owner's settings for workloads' users."""

    allowed: frozenset[str] = frozenset()
    uids: tuple[int, int] = UID_RANGE
    gid_base: int = GID_BASE
    switch: bool = field(default_factory=lambda: os.geteuid() == 0)

    def workspace_gid(self, workspace_id: int) -> int | None:
        """The group of the workspace's drives; None where workloads run as the agent's user."""
        if not self.switch:
            return None
        if not 0 <= workspace_id <= MAX_WORKSPACE_ID:
            raise ValueError(f"workspace id {workspace_id} is beyond this machine's group range")
        return self.gid_base + workspace_id

    def free_uid(self, taken: Collection[int], seed: int) -> int:
        """The worker's own id of the range (its ``uid_seed`` modulo the range), else the next
        no kept worker runs as. Every attempt of a worker then runs as one user, on any machine
        with the same range: what an attempt wrote to shared storage (a checkpoint, replaced
        by the next attempt in a folder with the sticky bit) stays its own. The lowest free
        id, as before, gave a restart the id another run had let go meanwhile (issue 36:
        a DDP run resumed from its checkpoint, then failed at every save, "Operation not
        permitted", its 10 restarts long)."""
        low, high = self.uids
        span = high - low + 1
        first = seed % span
        for step in range(span):
            uid = low + (first + step) % span
            if uid not in taken:
                return uid
        raise LookupError(NO_FREE_UID)

    def identity(
        self, spec_user: str | None, uid: int | None, workspace_id: int
    ) -> Identity | None:
        """Who the worker runs as (None: as the agent's user). ``uid`` is the one allocated
        from the range. Raises LookupError with a sentence when it cannot run at all."""
        gid = self.workspace_gid(workspace_id)
        if gid is None:
            return None
        if spec_user and spec_user in self.allowed:
            try:
                entry = pwd.getpwnam(spec_user)
            except KeyError:
                raise LookupError(NO_SUCH_USER.format(user=spec_user)) from None
            if entry.pw_uid != 0:  # root is never a workload's user, allowed or not
                return Identity(entry.pw_uid, entry.pw_gid, (gid,), spec_user)
        assert uid is not None, "a worker of the range is given its uid when it is kept"
        return Identity(uid, gid, (), f"astraeus-{uid}")

    def of_worker(self, spec: StartSpec) -> Identity | None:
        """Who the worker of this start runs as (``identity``, from its spec)."""
        return self.identity(spec.user, spec.uid, spec.workspace_id)


def base_environment(identity: Identity | None, home: str) -> dict[str, str]:
    """What every workload starts from, before the spec's variables and Astraeus' own: nothing
    of the agent's, but where it runs as the agent's own user (it may as well have its PATH)."""
    if identity is None:
        path = os.environ.get("PATH", SYSTEM_PATH)
        user = os.environ.get("USER") or pwd.getpwuid(os.geteuid()).pw_name
    else:
        path, user = SYSTEM_PATH, identity.user
    return {
        "PATH": path,
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
    }


WORKLOADS_FALLBACK = Path("/var/lib/astraeus-agent")


def reachable_by_others(folder: Path) -> bool:
    """Whether a user other than the agent's can pass through every folder above ``folder``
    (each searchable by others): a workload's own folder under it can then be reached."""
    for parent in [folder.resolve(), *folder.resolve().parents]:
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except FileNotFoundError:
            continue
    return True


def workload_dir(data_dir: Path, users: WorkloadUsers) -> Path:
    """Where workers' folders and drives live: the data folder, unless workloads run as other
    users and could not reach into it (a data folder under /root, say); then a folder of
    /var/lib of this install's own."""
    if not users.switch or reachable_by_others(data_dir):
        return data_dir
    install = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
    return WORKLOADS_FALLBACK / install


def local_name(worker_id: int, spec: StartSpec) -> str:
    """What names the worker on this machine where its workload can see it (its folder, in
    ``HOME`` and the working directory, and its control group, in ``/proc/self/cgroup``): the
    server's opaque id of it, which counts nothing (issue 37 N8: the database's number would
    tell a workload how many workers every workspace started before it); the number where a
    server sends none."""
    key = spec.worker_key
    if key is not None and WORKER_KEY.fullmatch(key):
        return key
    return str(worker_id)


def uid_seed(worker_id: int, spec: StartSpec) -> int:
    """Where the worker's own user id of the range is: from its opaque id, the same at every
    attempt and on every machine (a user id of the number would tell a workload the number)."""
    key = local_name(worker_id, spec)
    if key.isdigit():
        return worker_id
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
