"""A user id of the agent's range goes from one workspace to another only once nothing of the
first is left under it; and no two installs on a machine give out the same user ids.

A worker runs as its own id of the range, the same at every attempt (agent/identity.py), so an
id comes back for the workers of other runs, of any workspace. What a workload leaves in the
machine's shared places (a 0600 file in /tmp, /dev/shm, a process that outlived it) belongs to
its user id: the next workspace given that id could read and change it (issue 37 N2). So the
agent keeps, in its data folder (``workload-uids.json``), which workspace last ran under each
id; before it gives an id to a worker of another workspace (or one it has no record of), it
kills every process left under that id and removes what that id owns in the machine's shared
places: the folders anyone may write on this machine's own file systems (/tmp, /var/tmp,
/dev/shm, /run/lock, and any other found as the agent starts), and below them every folder
anyone may write, where the id could have put a file; a folder the id owns goes whole. An id
with something it could not remove is not given: the next one is. Files on shared storage
(another machine's file system, a cluster's scratch) are not the machine's to clean: a
workspace's files there belong in its drives, the workspace's group's.

A worker sandboxed on this machine (agent/sandbox.py) writes none of the places the sandbox
covers; the walk still looks there, for what an agent before the sandbox left.

Two installs on one machine (two ``astraeus up``, a second agent) given the same range would
hand one id to both their workloads, and neither would know of the other's. So the agent
claims its range machine-wide as it starts (``claim_range``: a file per claim under
/run/astraeus/workload-uids, locked while it lives, naming its data folder), and refuses to
start when its range overlaps a live claim, naming the range and its claimant.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import stat
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("astraeus.agent")

LEDGER = "workload-uids.json"
CLAIMS = Path("/run/astraeus/workload-uids")
# The shared places every machine has (those that exist), and how deep the agent looks for
# others on the root file system as it starts (/srv/scratch at depth 2, say).
KNOWN_PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue")
FIND_DEPTH = 3
KILL_ROUNDS = 50

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Ledger:
    """Which workspace last ran under each user id of the range (``<data>/workload-uids.json``,
    the agent's, 0600): written before a worker runs under an id."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last: dict[int, int] = {}
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            self.last = {int(k): int(v) for k, v in json.loads(path.read_text()).items()}

    def same_workspace(self, uid: int, workspace_id: int) -> bool:
        return self.last.get(uid) == workspace_id

    def record(self, uid: int, workspace_id: int) -> None:
        self.last[uid] = workspace_id
        partial = self.path.with_suffix(".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({str(k): v for k, v in sorted(self.last.items())}, f)
            f.flush()
            os.fsync(f.fileno())
        partial.replace(self.path)


def shared_places(root: Path = Path("/")) -> list[Path]:
    """The folders anyone may write on this machine's own file systems: the known ones, and
    those found on the root file system down to FIND_DEPTH (never through a link, never onto
    another file system: a network share is not the machine's to clean)."""
    found = {Path(p) for p in KNOWN_PLACES if _world_writable(Path(p))}
    device = os.lstat(root).st_dev

    def look(folder: Path, depth: int) -> None:
        if depth > FIND_DEPTH:
            return
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                path = Path(entry.path)
                info = entry.stat(follow_symlinks=False)
                if info.st_dev != device or path == Path("/proc"):
                    continue
                if info.st_mode & stat.S_IWOTH:
                    found.add(path)  # its world-writable folders are walked in clean()
                else:
                    look(path, depth + 1)

    look(root, 1)
    return sorted({Path(os.path.realpath(p)) for p in found})


def _world_writable(path: Path) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and bool(info.st_mode & stat.S_IWOTH)


def hand_over(uid: int, places: Iterable[Path]) -> list[str]:
    """Kill every process of ``uid`` and remove what it owns in ``places``: what is left (a
    sentence each); empty when nothing is."""
    left = kill_all(uid)
    for place in places:
        left += clean(place, uid)
    return left


def processes_of(uid: int) -> list[int]:
    """Every live process whose real, effective, saved or file-system user is ``uid`` (a zombie,
    killed and not yet reaped by its parent, holds nothing of it)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
            zombie = fields["State"].split()[0] == "Z"
            if not zombie and uid in {int(u) for u in fields["Uid"].split()}:
                found.append(int(status.parent.name))
    return found


def kill_all(uid: int) -> list[str]:
    """SIGKILL ``uid``'s processes, again while any forked meanwhile."""
    for _ in range(KILL_ROUNDS):
        pids = processes_of(uid)
        if not pids:
            return []
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    return [f"processes of uid {uid} still run: {processes_of(uid)[:5]}"]


def clean(place: Path, uid: int) -> list[str]:
    """Remove what ``uid`` owns in ``place``, and in every folder below it anyone may write
    (there alone could it have made a file); a folder it owns goes whole. Never through a
    link: the walk holds each folder open (``O_NOFOLLOW``)."""
    try:
        fd = os.open(place, _FOLDER)
    except OSError:
        return []
    try:
        return _clean(fd, place, uid, depth=0)
    finally:
        os.close(fd)


def _clean(fd: int, path: Path, uid: int, depth: int) -> list[str]:
    left: list[str] = []
    for name in os.listdir(fd):
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        try:
            if info.st_uid == uid:
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH and depth < 64:
                child = os.open(name, _FOLDER, dir_fd=fd)
                try:
                    left += _clean(child, path / name, uid, depth + 1)
                finally:
                    os.close(child)
        except FileNotFoundError:
            continue
        except OSError as error:
            left.append(f"{path / name}: {error.strerror}")
    return left


# --- the range, claimed machine-wide ---------------------------------------------------------


class RangeTaken(SystemExit):
    pass


def claim_range(uids: tuple[int, int], data_dir: Path, folder: Path = CLAIMS) -> int:
    """Claim ``uids`` for this agent's life: its claim file, locked (the descriptor, kept open,
    closed on exec). RangeTaken, naming the range and the claimant, when it overlaps a live
    claim; a claim whose agent is gone (its lock free) is removed."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    low, high = uids
    guard = _locked(folder / ".lock", blocking=True)  # one claimant looks at a time
    try:
        for other in sorted(folder.glob("*-*.claim")):
            try:
                fd = _locked(other, blocking=False)
            except BlockingIOError:
                theirs = _range_of(other)
                if theirs is not None and theirs[0] <= high and low <= theirs[1]:
                    raise RangeTaken(_taken(uids, theirs, other)) from None
                continue
            except OSError:
                continue
            other.unlink(missing_ok=True)  # its agent is gone
            os.close(fd)
        mine = _locked(folder / f"{low}-{high}.{os.getpid()}.claim", blocking=False)
        os.ftruncate(mine, 0)
        os.pwrite(mine, f"{data_dir.resolve()}\n{os.getpid()}\n".encode(), 0)
        return mine
    finally:
        os.close(guard)


def _range_of(claim: Path) -> tuple[int, int] | None:
    """The range a claim file's name says (``<first>-<last>.<pid>.claim``)."""
    first, _, rest = claim.name.partition("-")
    try:
        return int(first), int(rest.partition(".")[0])
    except ValueError:
        return None


def _taken(mine: tuple[int, int], theirs: tuple[int, int], claim: Path) -> str:
    claimant = "another agent"
    with contextlib.suppress(OSError, IndexError):
        lines = claim.read_text().splitlines()
        claimant = f"the agent of data folder {lines[0]} (pid {lines[1]})"
    return (
        f"astraeus agent: workload user ids {mine[0]}-{mine[1]} overlap {theirs[0]}-{theirs[1]}, "
        f"claimed on this machine by {claimant}: two installs would run workloads as the same "
        "users; give this one a range of its own (--workload-uids FIRST-LAST)"
    )


def _locked(path: Path, *, blocking: bool) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        raise
    return fd
