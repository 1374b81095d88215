"""Preparing a worker before the gang barrier: its credentials and its drives.

A drive is a named folder on the machine (``<data>/drives/<workspace id>/<drive>``) that
outlives runs; a mount may name a folder of the machine to fill it from, copied once, before
the first worker that needs it starts. The reasons are the seed's own words while waiting.

The agent is root and the paths come from users, so every walk below goes one folder at a
time through open descriptors that refuse links (``O_NOFOLLOW``): a path checked once cannot
be swapped for a link before it is used, and nothing is ever written through a link.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.start import Credential, StartSpec

FILLED = ".astraeus-filled"
# Each level of a copy holds two open folders and two stack frames: deeper trees are refused.
MAX_FILL_DEPTH = 128

FILL_NOT_ALLOWED = "fill_from is not allowed on this machine"

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a pipe swapped in after the type check cannot hang the copy.
_SOURCE_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def drive_folder(root: Path, spec: StartSpec, drive: str) -> Path:
    return root / str(spec.workspace_id) / drive


def drives_to_fill(spec: StartSpec, root: Path) -> list[tuple[str, Path, Path]]:
    """(drive, source, folder) of each mount whose drive is still to be filled."""
    out = []
    for mount in spec.mounts:
        folder = drive_folder(root, spec, mount.drive)
        # lexists: a workload may plant a link as the marker; it is never followed.
        if mount.fill_from and not os.path.lexists(folder / FILLED):
            out.append((mount.drive, Path(mount.fill_from), folder))
    return out


# --- filling a drive -----------------------------------------------------------------------


class _TooDeep(Exception):
    pass


def fill_drive(
    source: Path, folder: Path, *, allowed_roots: Sequence[Path], gid: int | None
) -> str | None:
    """Copy the source into the drive; the reason it could not, or None when it is filled.

    Only folders at or under ``allowed_roots`` (the machine owner's choice) may be copied:
    the copy runs as root. Links inside the source are copied as links, never followed;
    devices, pipes and sockets are skipped. A reason names no path of the machine but the
    user's own and the allowed roots.
    """
    if not allowed_roots:
        return FILL_NOT_ALLOWED
    resolved = Path(os.path.realpath(source))
    if not any(_within(resolved, Path(os.path.realpath(r))) for r in allowed_roots):
        allowed = ", ".join(str(r) for r in allowed_roots)
        return f"fill_from must be under a folder this machine allows: {allowed}"
    try:
        source_fd = _open_folder(resolved)
    except OSError:
        return f"Could not fill drive {folder.name}: fill_from is not a folder on this machine"
    try:
        _fill(source_fd, folder, gid)
    except _TooDeep:
        return (
            f"Could not fill drive {folder.name}: fill_from has folders nested more than "
            f"{MAX_FILL_DEPTH} deep"
        )
    except OSError as error:
        # strerror only: the exception's text carries the agent's own paths.
        return f"Could not fill drive {folder.name}: {error.strerror or 'the copy failed'}"
    finally:
        os.close(source_fd)
    return None


def _fill(source_fd: int, folder: Path, gid: int | None) -> None:
    """Copy beside the drive, where workloads cannot write, then move the copy in."""
    _make_drive_folder(folder, gid)
    partial = folder.with_name(folder.name + ".filling")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        os.mkdir(partial, 0o700)
        tree = partial / "tree"
        os.mkdir(tree, 0o700)
        tree_fd = os.open(tree, _FOLDER)
        try:
            _copy_folder(source_fd, tree_fd, gid, depth=0)
        finally:
            os.close(tree_fd)
        marker = os.open(partial / FILLED, _NEW_FILE, 0o640)
        if gid is not None:
            os.fchown(marker, 0, gid)
        os.close(marker)
        for name in os.listdir(tree):
            _replace(tree / name, folder / name)
        os.replace(partial / FILLED, folder / FILLED)  # last: the drive is whole
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _replace(item: Path, target: Path) -> None:
    """Move a copied item over whatever a workload left at its name (never through a link)."""
    try:
        kind = os.lstat(target).st_mode
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(kind):
            shutil.rmtree(target)  # safe against links on Linux (descriptor based)
        else:
            os.unlink(target)
    os.replace(item, target)


def _copy_folder(source: int, target: int, gid: int | None, depth: int) -> None:
    if depth > MAX_FILL_DEPTH:
        raise _TooDeep
    for name in os.listdir(source):
        try:
            kind = os.stat(name, dir_fd=source, follow_symlinks=False).st_mode
        except FileNotFoundError:
            continue  # removed while we copy
        if stat.S_ISLNK(kind):
            os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
            if gid is not None:
                os.chown(name, 0, gid, dir_fd=target, follow_symlinks=False)
        elif stat.S_ISDIR(kind):
            _copy_subfolder(source, target, name, gid, depth)
        elif stat.S_ISREG(kind):
            _copy_file(source, target, name, gid)
        # devices, pipes and sockets are not data: skipped


def _copy_subfolder(source: int, target: int, name: str, gid: int | None, depth: int) -> None:
    child_source = os.open(name, _FOLDER, dir_fd=source)
    try:
        os.mkdir(name, 0o700, dir_fd=target)
        child_target = os.open(name, _FOLDER, dir_fd=target)
        try:
            _copy_folder(child_source, child_target, gid, depth + 1)
            _settle(child_target, os.fstat(child_source), gid)
        finally:
            os.close(child_target)
    finally:
        os.close(child_source)


def _copy_file(source: int, target: int, name: str, gid: int | None) -> None:
    file = os.open(name, _SOURCE_FILE, dir_fd=source)
    try:
        info = os.fstat(file)
        if not stat.S_ISREG(info.st_mode):
            return  # swapped after the check
        copy = os.open(name, _NEW_FILE, 0o600, dir_fd=target)
        try:
            _copy_bytes(file, copy)
            _settle(copy, info, gid)
        finally:
            os.close(copy)
    finally:
        os.close(file)


def _copy_bytes(source: int, target: int) -> None:
    try:
        while os.sendfile(target, source, None, 1 << 30):
            pass
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        while chunk := os.read(source, 1 << 20):
            os.write(target, chunk)


def _settle(fd: int, source: os.stat_result, gid: int | None) -> None:
    """The copy's owner and mode: root and the workspace's group, which may read and write;
    the source's permission bits (never setuid) where workloads run as the agent's user."""
    folder = stat.S_ISDIR(source.st_mode)
    if gid is None:
        os.fchmod(fd, (source.st_mode & 0o777) | (0o700 if folder else 0))
    else:
        os.fchown(fd, 0, gid)
        executable = source.st_mode & stat.S_IXUSR
        os.fchmod(fd, 0o2770 if folder else 0o770 if executable else 0o660)
    os.utime(fd, ns=(source.st_atime_ns, source.st_mtime_ns))


def _make_drive_folder(folder: Path, gid: int | None) -> None:
    """``<data>/drives`` (0711: no one lists the workspaces), the workspace's folder (its
    workers may enter) and the drive (setgid: what workers write there stays the group's)."""
    drives, workspace = folder.parent.parent, folder.parent
    drives.mkdir(parents=True, exist_ok=True)
    workspace.mkdir(exist_ok=True)
    folder.mkdir(exist_ok=True)
    if gid is None:
        return
    for path, group, mode in ((drives, 0, 0o711), (workspace, gid, 0o750), (folder, gid, 0o2770)):
        fd = os.open(path, _FOLDER)
        try:
            os.fchown(fd, 0, group)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


# --- exposing drives at mount paths ---------------------------------------------------------


def drive_variable(drive: str) -> str:
    """``ASTRAEUS_DRIVE_TRAINING_DATA`` for the drive ``training-data``."""
    return "ASTRAEUS_DRIVE_" + re.sub(r"[^A-Z0-9]", "_", drive.upper())


@dataclass
class Exposed:
    """The drives' folders by variable, the links made at mount paths (``folders[i]`` is the
    drive folder ``links[i]`` points at), the folders of the drives mounted read-only (each
    once), or the reason the worker cannot start."""

    variables: dict[str, str] = field(default_factory=dict)
    links: list[Path] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    read_only: list[Path] = field(default_factory=list)
    problem: str | None = None


class _Refused(Exception):
    pass


class _LinkInTheWay(Exception):
    pass


def expose_drives(
    spec: StartSpec,
    root: Path,
    *,
    home: Path,
    mount_roots: Sequence[Path],
    gid: int | None,
) -> Exposed:
    """Create the workers' drive folders; their paths by variable, and links at mount paths.

    Each drive's folder is in ``ASTRAEUS_DRIVE_<NAME>``, and a link is made at the mount's
    path: a relative path is under the worker's own folder ``home`` (missing folders made
    there); an absolute one must be under ``home`` or under a folder of ``mount_roots`` that
    exists. Nothing already at the path is ever replaced. The first refusal stops, and the
    links made so far are removed. A read-only drive's folder is made read-only in the
    worker's own mount namespace as it starts (agent/enter.py): the link leads there. (The
    Docker executor bind-mounts the folder at the path.)
    """
    exposed = Exposed()
    for index, mount in enumerate(spec.mounts):
        folder = drive_folder(root, spec, mount.drive)
        try:
            _make_drive_folder(folder, gid)
            link = _link(index, mount.path, folder, home, mount_roots, gid)
        except _Refused as refusal:
            problem = str(refusal)
        except OSError as error:
            problem = f"Could not link mounts[{index}].path: {error.strerror or 'failed'}"
        else:
            exposed.variables[drive_variable(mount.drive)] = str(folder)
            exposed.links.append(link)
            exposed.folders.append(folder)
            if mount.read_only and folder not in exposed.read_only:
                exposed.read_only.append(folder)
            continue
        remove_links(exposed.links, exposed.folders)
        return Exposed(problem=problem)
    return exposed


def _link(
    index: int,
    raw: str,
    folder: Path,
    home: Path,
    mount_roots: Sequence[Path],
    gid: int | None,
) -> Path:
    """Make the link at a mount path; the link, with no link in its parents."""
    home_real = Path(os.path.realpath(home))
    if "\0" not in raw:
        # '..' is undone by text; the walk below then refuses any link on the way.
        path = Path("/" + os.path.normpath(home_real / raw).lstrip("/"))
        for base in (Path(os.path.normpath(home)), home_real):
            if _within(path, base):
                parts = path.relative_to(base).parts
                if not parts:  # home itself
                    raise _Refused(f"mounts[{index}].path already exists on this machine")
                try:
                    parent = _open_inside(home_real, parts[:-1], gid)
                except _LinkInTheWay:
                    raise _Refused(_outside(index, mount_roots)) from None
                return _make_link(index, parent, home_real.joinpath(*parts), folder)
        parent_real = Path(os.path.realpath(path.parent))
        if path.name and any(_within(parent_real, Path(os.path.realpath(r))) for r in mount_roots):
            return _make_link(index, _open_folder(parent_real), parent_real / path.name, folder)
    raise _Refused(_outside(index, mount_roots))


def _outside(index: int, mount_roots: Sequence[Path]) -> str:
    allowed = (
        f": {', '.join(str(r) for r in mount_roots)}"
        if mount_roots
        else " (none: its agent's --mount-root or ASTRAEUS_AGENT_MOUNT_ROOTS names them)"
    )
    return (
        f"mounts[{index}].path must be relative (under the worker's own folder) or under a "
        f"folder this machine allows{allowed}"
    )


def _make_link(index: int, parent: int, link: Path, folder: Path) -> Path:
    try:
        os.symlink(folder, link.name, target_is_directory=True, dir_fd=parent)
    except FileExistsError:
        raise _Refused(f"mounts[{index}].path already exists on this machine") from None
    finally:
        os.close(parent)
    return link


def _open_inside(home: Path, parts: Sequence[str], gid: int | None) -> int:
    """The folder at ``parts`` under home, made where missing (owned as home is)."""
    fd = _open_folder(home)
    owner = os.fstat(fd)
    for part in parts:
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
            made = True
        except FileExistsError:
            made = False
        fd = _open_child(fd, part)
        if made and gid is not None:
            os.fchown(fd, owner.st_uid, owner.st_gid)
    return fd


def remove_links(links: Sequence[Path], folders: Sequence[Path]) -> None:
    """Remove each link made at a mount path when the worker ends, only if it is still a link
    to the drive folder it was made for (``folders[i]`` for ``links[i]``): never anything
    a workload or anyone else put there since."""
    for link, folder in zip(links, folders, strict=True):
        try:
            parent = _open_folder(link.parent)
        except OSError:
            continue
        try:
            if os.readlink(link.name, dir_fd=parent) == str(folder):
                os.unlink(link.name, dir_fd=parent)
        except OSError:
            pass  # gone, or no longer a link
        finally:
            os.close(parent)


# --- paths ---------------------------------------------------------------------------------


def _within(path: Path, root: Path) -> bool:
    """Whether ``path`` is ``root`` or under it, by components (/data2 is not under /data)."""
    return path.is_relative_to(root)


def _open_folder(path: Path) -> int:
    """Open an absolute folder one component at a time, refusing any link on the way."""
    fd = os.open("/", _FOLDER)
    for part in path.parts[1:]:
        fd = _open_child(fd, part)
    return fd


def _open_child(fd: int, part: str) -> int:
    """The folder ``part`` of the open folder ``fd`` (closed), never through a link."""
    try:
        return os.open(part, _FOLDER, dir_fd=fd)
    except NotADirectoryError:
        if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
            raise _LinkInTheWay from None  # it would lead out of home: never followed
        raise
    finally:
        os.close(fd)


def credential_variables(
    credentials: Sequence[Credential], values: dict[str, str], secrets_dir: str
) -> dict[str, str]:
    """The credentials given as variables, and where the ones given as files are."""
    env = {c.env: values[c.secret] for c in credentials if c.env and c.secret in values}
    if any(c.file for c in credentials):
        env["ASTRAEUS_SECRETS_DIR"] = secrets_dir
    return env


def write_secret_files(
    credentials: Sequence[Credential],
    values: dict[str, str],
    folder: Path,
    mode: int = 0o600,
    *,
    owner: tuple[int, int] | None = None,
) -> None:
    """Credentials given as files: one file each, readable by the worker's user only (a
    container's user may be anyone: its folder is bound into that container alone).

    With ``owner`` (uid, gid: the agent is root and the workload is not), the folder and files
    become that user's, the folder 0500 and the files 0400: its own secrets are readable by it
    alone. Never written through a link: the folder is made here, before the workload runs."""
    folder.mkdir(mode=0o700 if mode == 0o600 else 0o755, parents=True, exist_ok=True)
    for c in credentials:
        if c.file and c.secret in values:
            path = folder / c.file
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            descriptor = os.open(path, flags, 0o400 if owner else mode)
            with os.fdopen(descriptor, "w") as f:
                if owner is not None:
                    os.fchown(f.fileno(), *owner)
                f.write(values[c.secret])
    if owner is not None:
        os.chown(folder, *owner, follow_symlinks=False)
        folder.chmod(0o500)
