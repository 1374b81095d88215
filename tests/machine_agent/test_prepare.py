"""Preparing a worker: drives filled once from their source, exposed to processes (what it
waits for meanwhile is reported as a Wait; the server writes the seed's sentence: tests/
lifecycle/test_scenarios.py). Filling and linking as root touch only what the machine allows
(issue 17)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from agent import prepare
from agent.start import Credential, Mount, StartSpec

GID = 4242424  # no such group: ownership by number only
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another group needs root")


def start(tmp_path: Path, path: str | None = None, **mount: Any) -> StartSpec:
    drive = Mount("training-data", path or str(tmp_path / "mnt"), **mount)
    return StartSpec(workspace_id=7, mounts=(drive,))


def fill(source: Path, folder: Path, *roots: Path, gid: int | None = None) -> str | None:
    return prepare.fill_drive(source, folder, allowed_roots=list(roots), gid=gid)


def expose(tmp_path: Path, path: str, *roots: Path, gid: int | None = None) -> prepare.Exposed:
    return prepare.expose_drives(
        start(tmp_path, path),
        tmp_path / "drives",
        home=tmp_path / "home",
        mount_roots=list(roots),
        gid=gid,
    )


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    """/allowed with a data set, beside a secret of another worker."""
    (tmp_path / "allowed" / "set" / "shards").mkdir(parents=True)
    (tmp_path / "allowed" / "set" / "shards" / "0.bin").write_bytes(b"\x00" * 10)
    (tmp_path / "other-worker").mkdir()
    (tmp_path / "other-worker" / "token.txt").write_text("hf_secret")
    (tmp_path / "home").mkdir()
    return tmp_path / "allowed"


def test_a_drive_is_filled_once_from_its_source(tmp_path: Path, allowed: Path) -> None:
    source = allowed / "set"
    spec = start(tmp_path, fill_from=str(source))
    [(drive, from_, folder)] = prepare.drives_to_fill(spec, tmp_path / "drives")
    assert (drive, from_) == ("training-data", source)
    assert folder == tmp_path / "drives" / "7" / "training-data"
    assert fill(from_, folder, allowed) is None
    assert (folder / "shards" / "0.bin").read_bytes() == b"\x00" * 10
    assert sorted(os.listdir(folder.parent)) == ["training-data"]  # no copy left beside it
    assert prepare.drives_to_fill(spec, tmp_path / "drives") == []  # filled: not again


# issue 17
def test_a_missing_source_is_said_plainly_without_the_machines_paths(
    tmp_path: Path, allowed: Path
) -> None:
    (allowed / "file").write_text("x")
    folder = tmp_path / "drives" / "1" / "data"
    for source in (allowed / "nowhere", allowed / "file"):
        problem = fill(source, folder, allowed)
        assert problem == "Could not fill drive data: fill_from is not a folder on this machine"


# issue 17
def test_fill_from_is_refused_when_the_machine_allows_no_folder(
    tmp_path: Path, allowed: Path
) -> None:
    folder = tmp_path / "drives" / "7" / "training-data"
    assert fill(tmp_path / "other-worker", folder) == "fill_from is not allowed on this machine"
    assert fill(allowed / "set", folder) == "fill_from is not allowed on this machine"
    assert not (tmp_path / "drives").exists()


# issue 17
def test_fill_from_outside_the_allowed_folders_is_refused(tmp_path: Path, allowed: Path) -> None:
    (tmp_path / "allowed2").mkdir()
    (tmp_path / "allowed2" / "x").write_text("x")
    (allowed / "escape").symlink_to(tmp_path / "other-worker")
    folder = tmp_path / "drives" / "7" / "training-data"
    refused = f"fill_from must be under a folder this machine allows: {allowed}, {tmp_path / 'a'}"
    for source in (
        tmp_path / "other-worker",
        allowed / ".." / "other-worker",  # /allowed/../etc
        allowed / "escape",  # a link inside the allowed folder, to outside it
        tmp_path / "allowed2",  # /allowed2 is not under /allowed
        tmp_path,
        Path("/etc"),
    ):
        assert fill(source, folder, allowed, tmp_path / "a") == refused, source
    assert not (tmp_path / "drives").exists()


# issue 17
def test_the_allowed_folder_itself_may_be_copied(tmp_path: Path, allowed: Path) -> None:
    folder = tmp_path / "drives" / "7" / "training-data"
    assert fill(allowed, folder, allowed) is None
    assert (folder / "set" / "shards" / "0.bin").read_bytes() == b"\x00" * 10


# issue 17
def test_links_in_the_source_are_copied_as_links_and_never_followed(
    tmp_path: Path, allowed: Path
) -> None:
    secret = tmp_path / "other-worker" / "token.txt"
    (allowed / "set" / "shadow").symlink_to(secret)
    (allowed / "set" / "elsewhere").symlink_to(tmp_path / "other-worker")
    os.mkfifo(allowed / "set" / "pipe")
    folder = tmp_path / "drives" / "7" / "training-data"
    assert fill(allowed / "set", folder, allowed) is None
    assert os.readlink(folder / "shadow") == str(secret)
    assert os.readlink(folder / "elsewhere") == str(tmp_path / "other-worker")
    assert sorted(os.listdir(folder)) == [prepare.FILLED, "elsewhere", "shadow", "shards"]
    assert not any("hf_secret" in p.read_text() for p in folder.rglob("*") if _plain_file(p))


def _plain_file(path: Path) -> bool:
    return stat.S_ISREG(os.lstat(path).st_mode)


# issue 17
def test_a_fill_replaces_what_a_workload_left_in_the_drive_without_following_it(
    tmp_path: Path, allowed: Path
) -> None:
    folder = tmp_path / "drives" / "7" / "training-data"
    folder.mkdir(parents=True)
    victim = tmp_path / "other-worker" / "token.txt"
    (folder / "shards").symlink_to(tmp_path / "other-worker")
    (folder / prepare.FILLED).symlink_to(victim)  # the marker is replaced, never written to
    assert fill(allowed / "set", folder, allowed) is None
    assert (folder / "shards" / "0.bin").read_bytes() == b"\x00" * 10
    assert not (folder / prepare.FILLED).is_symlink()
    assert victim.read_text() == "hf_secret"
    assert os.listdir(tmp_path / "other-worker") == ["token.txt"]


# issue 17
@as_root
def test_a_drive_belongs_to_its_workspaces_group(tmp_path: Path, allowed: Path) -> None:
    (allowed / "set" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(allowed / "set" / "run.sh", 0o4700)  # setuid: never carried over
    os.chmod(allowed / "set" / "shards" / "0.bin", 0o400)
    (allowed / "set" / "link").symlink_to("shards")
    folder = tmp_path / "drives" / "7" / "training-data"
    assert fill(allowed / "set", folder, allowed, gid=GID) is None

    def owner_and_mode(path: Path) -> tuple[int, int, int]:
        info = os.lstat(path)
        return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)

    assert owner_and_mode(tmp_path / "drives")[2] == 0o711
    assert owner_and_mode(tmp_path / "drives" / "7") == (0, GID, 0o750)
    assert owner_and_mode(folder) == (0, GID, 0o2770)
    assert owner_and_mode(folder / "shards") == (0, GID, 0o2770)
    assert owner_and_mode(folder / "shards" / "0.bin") == (0, GID, 0o660)
    assert owner_and_mode(folder / "run.sh") == (0, GID, 0o770)
    assert owner_and_mode(folder / "link")[:2] == (0, GID)


# issue 17
@as_root
def test_exposing_a_drive_gives_it_to_the_workspaces_group(tmp_path: Path, allowed: Path) -> None:
    exposed = expose(tmp_path, "data", gid=GID)
    assert exposed.problem is None
    folder = tmp_path / "drives" / "7" / "training-data"
    assert (os.stat(folder).st_gid, stat.S_IMODE(os.stat(folder).st_mode)) == (GID, 0o2770)
    assert os.stat(tmp_path / "drives" / "7").st_gid == GID


# issue 17
def test_without_a_group_nothing_is_given_away(tmp_path: Path, allowed: Path) -> None:
    os.chmod(allowed / "set" / "shards" / "0.bin", 0o4640)
    folder = tmp_path / "drives" / "7" / "training-data"
    assert fill(allowed / "set", folder, allowed, gid=None) is None
    info = os.stat(folder / "shards" / "0.bin")
    assert (info.st_uid, info.st_gid) == (os.geteuid(), os.getegid())
    assert stat.S_IMODE(info.st_mode) == 0o640


def test_a_process_finds_its_drive_by_variable_and_at_its_path(
    tmp_path: Path, allowed: Path
) -> None:
    exposed = expose(tmp_path, str(tmp_path / "mnt"), tmp_path)
    folder = tmp_path / "drives" / "7" / "training-data"
    assert exposed.problem is None
    assert exposed.variables == {"ASTRAEUS_DRIVE_TRAINING_DATA": str(folder)}
    assert exposed.links == [tmp_path / "mnt"]
    assert (tmp_path / "mnt").resolve() == folder.resolve()


# issue 17
def test_a_relative_mount_path_is_under_the_workers_own_folder(
    tmp_path: Path, allowed: Path
) -> None:
    exposed = expose(tmp_path, "data/train", tmp_path / "allowed")
    folder = tmp_path / "drives" / "7" / "training-data"
    assert exposed.problem is None
    assert exposed.links == [tmp_path / "home" / "data" / "train"]
    assert os.readlink(tmp_path / "home" / "data" / "train") == str(folder)
    # an absolute path under the worker's folder is the same thing
    assert expose(tmp_path, str(tmp_path / "home" / "b" / "c")).links == [
        tmp_path / "home" / "b" / "c"
    ]


# issue 17
def test_a_mount_path_outside_the_workers_folder_and_the_allowed_ones_is_refused(
    tmp_path: Path, allowed: Path
) -> None:
    (tmp_path / "home" / "out").symlink_to(tmp_path / "other-worker")
    (allowed / "escape").symlink_to(tmp_path / "other-worker")
    (tmp_path / "allowed2").mkdir()
    outside = (
        "mounts[0].path must be relative (under the worker's own folder) or under a folder "
        "this machine allows"
    )
    cases = {
        "../other-worker/x": outside,
        "a/../../x": outside,
        str(tmp_path / "other-worker" / "x"): outside,
        str(tmp_path / "allowed2" / "x"): outside,
        "/etc/cron.d/x": outside,
        str(allowed / "escape" / "x"): outside,
    }
    # issue 36: where none is allowed, the reason says how a machine allows some
    none = " (none: its agent's --mount-root or ASTRAEUS_AGENT_MOUNT_ROOTS names them)"
    before = sorted(os.listdir(tmp_path / "other-worker"))
    for path, reason in cases.items():
        assert expose(tmp_path, path).problem == reason + none, path
        assert expose(tmp_path, path, allowed).problem == f"{reason}: {allowed}", path
    # through a link the workload left in its own folder: never followed
    assert expose(tmp_path, "out/x").problem == outside + none
    (tmp_path / "home" / "file").write_text("x")
    problem = expose(tmp_path, "file/x").problem
    assert problem == "Could not link mounts[0].path: Not a directory"
    assert sorted(os.listdir(tmp_path / "other-worker")) == before
    assert sorted(os.listdir(tmp_path / "allowed2")) == []


# issue 17
def test_a_mount_path_under_an_allowed_folder_needs_its_parent_to_exist(
    tmp_path: Path, allowed: Path
) -> None:
    assert expose(tmp_path, str(allowed / "data"), allowed).links == [allowed / "data"]
    problem = expose(tmp_path, str(allowed / "new" / "data"), allowed).problem
    assert problem == "Could not link mounts[0].path: No such file or directory"
    assert not (allowed / "new").exists()


# issue 17
def test_nothing_already_at_a_mount_path_is_replaced(tmp_path: Path, allowed: Path) -> None:
    other = tmp_path / "drives" / "8" / "training-data"
    other.mkdir(parents=True)
    (allowed / "taken").symlink_to(other)  # another workspace's link
    (allowed / "file").write_text("mine")
    (tmp_path / "home" / "dangling").symlink_to(tmp_path / "nowhere")
    exists = "mounts[0].path already exists on this machine"
    for path in (str(allowed / "taken"), str(allowed / "file"), str(allowed / "set")):
        assert expose(tmp_path, path, allowed) == prepare.Exposed(problem=exists), path
    for path in ("dangling", ".", str(tmp_path / "home")):
        assert expose(tmp_path, path).problem == exists, path
    assert os.readlink(allowed / "taken") == str(other)
    assert (allowed / "file").read_text() == "mine"
    assert os.readlink(tmp_path / "home" / "dangling") == str(tmp_path / "nowhere")


# issue 17
def test_a_refused_mount_removes_the_links_made_before_it(tmp_path: Path, allowed: Path) -> None:
    spec = StartSpec(workspace_id=7, mounts=(Mount("a", "first"), Mount("b", "/etc/x")))
    exposed = prepare.expose_drives(
        spec, tmp_path / "drives", home=tmp_path / "home", mount_roots=[], gid=None
    )
    assert exposed.problem is not None and exposed.problem.startswith("mounts[1].path must be")
    assert (exposed.variables, exposed.links) == ({}, [])
    assert os.listdir(tmp_path / "home") == []


# issue 17
def test_remove_links_removes_only_its_own_links(tmp_path: Path, allowed: Path) -> None:
    exposed = expose(tmp_path, "data")
    kept = expose(tmp_path, str(allowed / "kept"), allowed)
    replaced = expose(tmp_path, str(allowed / "replaced"), allowed)
    (allowed / "replaced").unlink()
    (allowed / "replaced").symlink_to(tmp_path / "other-worker")  # someone else's since
    relinked = expose(tmp_path, str(allowed / "relinked"), allowed)
    (allowed / "relinked").unlink()
    (allowed / "relinked").mkdir()  # a folder now: never removed
    links = exposed.links + replaced.links + relinked.links
    prepare.remove_links(links, exposed.folders + replaced.folders + relinked.folders)
    assert not os.path.lexists(tmp_path / "home" / "data")
    assert os.path.islink(allowed / "kept")  # not in the list
    assert os.readlink(allowed / "replaced") == str(tmp_path / "other-worker")
    assert (allowed / "relinked").is_dir()
    assert kept.links == [allowed / "kept"]


def test_secret_files_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    credentials = [Credential("hf-token", file="token.txt"), Credential("x", env="X")]
    prepare.write_secret_files(credentials, {"hf-token": "hf_abc", "x": "y"}, tmp_path / "s")
    written = tmp_path / "s" / "token.txt"
    assert written.read_text() == "hf_abc"
    assert os.stat(written).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["token.txt"]
