"""A drive mounted read-only is read-only to the workload, whatever it tries (issue 36: a process
worker could write it). The worker's process binds the drive's folder read-only onto itself in
a mount namespace of its own before it becomes the workload (agent/enter.py); the workload,
hostile, writes, creates, removes, renames, changes modes and times, then makes a user and
mount namespace of its own to remount the folder writable or uncover it: every attempt fails,
the drive is as it was, and the machine's own mount table never saw the mount."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import shim
from agent.logs import WorkerLog
from tests.support import WORKLOAD_PYTHON

ROOT = Path(__file__).resolve().parents[2]
ENTER = ROOT / "agent" / "enter.py"
UID, GID = 2_000_123, 2_100_007  # a workload's user and its workspace's group (none in passwd)
DEBIAN_PYTHON = "/usr/bin/python3"

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="an agent as root: a user of its own")

# argv: the read-only drive's folder, the writable one's. Each attempt prints what it did or the
# error's name; the last ones are an attacker's, in a user and mount namespace of its own.
HOSTILE = r"""
import ctypes, errno, os, sys

drive, scratch = sys.argv[1], sys.argv[2]
weights = os.path.join(drive, "weights.bin")
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]


def attempt(what, act):
    try:
        act()
        print(what, "done", flush=True)
    except OSError as error:
        print(what, errno.errorcode[error.errno], flush=True)


def called(result):
    if result != 0:
        raise OSError(ctypes.get_errno(), "")


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def own_namespaces():
    uid, gid = os.getuid(), os.getgid()
    called(libc.unshare(0x10000000 | 0x00020000))
    write("/proc/self/setgroups", "deny")
    write("/proc/self/uid_map", f"0 {uid} 1")
    write("/proc/self/gid_map", f"0 {gid} 1")


print("read", open(weights).read(), flush=True)
attempt("write", lambda: open(weights, "a").write("x"))
attempt("truncate", lambda: os.truncate(weights, 0))
attempt("create", lambda: open(os.path.join(drive, "new.txt"), "x"))
attempt("mkdir", lambda: os.mkdir(os.path.join(drive, "sub")))
attempt("unlink", lambda: os.unlink(weights))
attempt("rename", lambda: os.rename(weights, weights + ".old"))
attempt("chmod", lambda: os.chmod(weights, 0o777))
attempt("utime", lambda: os.utime(weights, (0, 0)))
attempt("symlink", lambda: os.symlink("/etc", os.path.join(drive, "etc")))
attempt("scratch", lambda: write(os.path.join(scratch, "out.txt"), "kept"))
attempt("namespaces", own_namespaces)
attempt("remount", lambda: called(libc.mount(None, drive.encode(), None, 0x20 | 0x1000, None)))
attempt("umount", lambda: called(libc.umount2(drive.encode(), 2)))
attempt("write as root of its own", lambda: open(weights, "a").write("x"))
"""
REFUSED = [
    "write EROFS",
    "truncate EROFS",
    "create EROFS",
    "mkdir EROFS",
    "unlink EROFS",
    "rename EROFS",
    "chmod EROFS",
    "utime EROFS",
    "symlink EROFS",
    "scratch done",
    "namespaces done",
    # The kernel locks the mounts a less privileged namespace was given: not made writable,
    # not taken off (EINVAL: a locked mount is no mount point of its own there).
    "remount EPERM",
    "umount EINVAL",
    "write as root of its own EROFS",
]


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder a workload's user may pass through (pytest's own is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="astraeus-read-only-"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _drive(folder: Path, owner: tuple[int, int]) -> Path:
    """A drive with a file, owned and moded as prepare.py makes them (the workspace's group may
    read and write): only the mount stands between the workload and a change."""
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_text("v1")
    os.chown(folder, *owner)
    os.chown(folder / "weights.bin", *owner)
    folder.chmod(0o2770)
    (folder / "weights.bin").chmod(0o660)
    return folder


def _as_found(folder: Path) -> list[tuple[str, int, int, int, bytes]]:
    """Every entry's name, mode, owner, mtime and content."""
    out = []
    for entry in sorted(folder.rglob("*")):
        info = entry.lstat()
        data = entry.read_bytes() if stat.S_ISREG(info.st_mode) else b""
        out.append((entry.name, info.st_mode, info.st_uid, info.st_mtime_ns, data))
    return out


def _spec(place: Path, python: str, identity: dict[str, object] | None) -> dict[str, object]:
    drive, scratch = place / "drives" / "7" / "ref", place / "drives" / "7" / "scratch"
    return {
        "worker": "7",
        "argv": [python, "-c", HOSTILE, str(drive), str(scratch)],
        "env": {"PATH": "/usr/bin:/bin"},
        "cwd": "/",
        "log_root": str(place / "logs"),
        "cgroup": None,
        "cgroup_procs": [],
        "read_only": [str(drive)],
        "identity": identity,
    }


def _mounts(place: Path) -> list[str]:
    """The machine's mounts at or below ``place``, or of a folder in it: what a mount of the
    drive leaking out of the worker's namespace would add. Only these: the tests run in
    parallel lanes, and another lane's agent adds mounts of its own meanwhile (a network
    namespace's, under /run/netns)."""
    mine = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        root, point = (field.encode().decode("unicode_escape") for field in line.split()[3:5])
        if any(Path(each).is_relative_to(place) for each in (root, point)):
            mine.append(line)
    return mine


@root_only
def test_a_read_only_drive_refuses_every_change_of_a_hostile_workload(place: Path) -> None:
    owner = (0, GID)
    drive = _drive(place / "drives" / "7" / "ref", owner)
    scratch = _drive(place / "drives" / "7" / "scratch", owner)
    (place / "drives").chmod(0o711)
    os.chown(place / "drives" / "7", 0, GID)
    (place / "drives" / "7").chmod(0o750)
    before, mounts = _as_found(drive), _mounts(place)
    folder = place / "worker"
    folder.mkdir()
    identity = {"uid": UID, "gid": GID, "groups": [GID]}
    (folder / shim.SPEC).write_text(json.dumps(_spec(place, WORKLOAD_PYTHON, identity)))
    WorkerLog(place / "logs", "7").begin()
    subprocess.run([sys.executable, "-m", "agent.shim", str(folder)], cwd=ROOT, check=True)
    log, _ = WorkerLog(place / "logs", "7").tail(100)
    assert log.splitlines() == ["read v1", *REFUSED], log
    assert shim.recorded_exit(folder) == shim.Exit(0, shim.EndCause.EXITED)
    assert _as_found(drive) == before
    assert (scratch / "out.txt").read_text() == "kept"  # a writable drive beside it is
    assert _mounts(place) == mounts == []  # the machine's namespace never saw the mount


@pytest.mark.skipif(not os.path.exists(DEBIAN_PYTHON), reason="runs enter.py as another user")
@root_only
def test_an_agent_that_is_not_root_makes_it_read_only_in_a_user_namespace(place: Path) -> None:
    # An ordinary user's agent (a laptop's `astraeus up`): enter.py runs as that user, its
    # workload too. Played here by a user id of its own running enter.py as the shim would.
    owner = (UID, GID)
    drive = _drive(place / "drives" / "7" / "ref", owner)
    _drive(place / "drives" / "7" / "scratch", owner)
    before, mounts = _as_found(drive), _mounts(place)
    folder = place / "worker"
    folder.mkdir()
    (folder / shim.SPEC).write_text(json.dumps(_spec(place, DEBIAN_PYTHON, None)))
    os.chown(folder / shim.SPEC, *owner)
    os.chown(folder, *owner)
    entered = subprocess.run(
        [DEBIAN_PYTHON, "-I", "-S", str(ENTER), str(folder)],
        user=UID,
        group=GID,
        extra_groups=[],
        capture_output=True,
        text=True,
    )
    seen = (entered.stdout.splitlines(), entered.returncode)
    assert seen == (["read v1", *REFUSED], 0), entered.stderr
    assert _as_found(drive) == before
    assert _mounts(place) == mounts == []
