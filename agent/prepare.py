"""Preparing a worker before the gang barrier: its credentials and its drives.

A drive is a named folder on the machine (``<data>/drives/<workspace id>/<drive>``) that
outlives runs; a mount may name a folder of the machine to fill it from, copied once, before
the first worker that needs it starts. The reasons are the seed's own words while waiting.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path
from typing import Any

FILLED = ".astraeus-filled"


def waiting_for_secret(name: str) -> str:
    return f"waiting for external secret {name}"


def waiting_for_drive(name: str) -> str:
    return f"Waiting for drive {name} to be filled"


def drive_folder(root: Path, payload: dict[str, Any], drive: str) -> Path:
    return root / str(payload.get("workspace_id", "0")) / drive


def drives_to_fill(payload: dict[str, Any], root: Path) -> list[tuple[str, Path, Path]]:
    """(drive, source, folder) of each mount whose drive is still to be filled."""
    out = []
    for mount in payload.get("mounts") or []:
        source = mount.get("fill_from")
        folder = drive_folder(root, payload, mount["drive"])
        if source and not (folder / FILLED).exists():
            out.append((mount["drive"], Path(source), folder))
    return out


def fill_drive(source: Path, folder: Path) -> str | None:
    """Copy the source into the drive; the reason it could not, or None when it is filled."""
    if not source.is_dir():
        return f"Could not fill drive {folder.name}: {source} is not a folder on this machine"
    partial = folder.with_name(folder.name + ".filling")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, partial)
        for item in partial.iterdir():
            target = folder / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            item.replace(target)
        (folder / FILLED).touch()
    except OSError as error:
        return f"Could not fill drive {folder.name}: {error.strerror or error}"
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return None


def drive_variable(drive: str) -> str:
    """``ASTRAEUS_DRIVE_TRAINING_DATA`` for the drive ``training-data``."""
    return "ASTRAEUS_DRIVE_" + re.sub(r"[^A-Z0-9]", "_", drive.upper())


def expose_drives(payload: dict[str, Any], root: Path) -> dict[str, str]:
    """Create the workers' drive folders; their paths by variable, and links at mount paths.

    A process cannot be given a mount of its own without privileges: each drive's folder is
    in ``ASTRAEUS_DRIVE_<NAME>``, and a link is made at the mount's path where that path is
    free and its parent writable. (The Docker executor bind-mounts the folder at the path.)
    """
    variables = {}
    for mount in payload.get("mounts") or []:
        folder = drive_folder(root, payload, mount["drive"])
        folder.mkdir(parents=True, exist_ok=True)
        variables[drive_variable(mount["drive"])] = str(folder)
        path = Path(mount["path"])
        with contextlib.suppress(OSError):
            if path.is_symlink() and path.resolve() != folder.resolve():
                path.unlink()  # an earlier run's link to another workspace's drive
            if not path.exists() and os.access(path.parent, os.W_OK):
                path.symlink_to(folder, target_is_directory=True)
    return variables


def credential_variables(
    credentials: list[dict[str, Any]], values: dict[str, str], secrets_dir: str
) -> dict[str, str]:
    """The credentials given as variables, and where the ones given as files are."""
    env = {
        c["env"]: values[c["secret"]] for c in credentials if c.get("env") and c["secret"] in values
    }
    if any(c.get("file") for c in credentials):
        env["ASTRAEUS_SECRETS_DIR"] = secrets_dir
    return env


def write_secret_files(
    credentials: list[dict[str, Any]], values: dict[str, str], folder: Path, mode: int = 0o600
) -> None:
    """Credentials given as files: one file each, readable by the worker's user only (a
    container's user may be anyone: its folder is bound into that container alone)."""
    folder.mkdir(mode=0o700 if mode == 0o600 else 0o755, parents=True, exist_ok=True)
    for c in credentials:
        if c.get("file") and c["secret"] in values:
            path = folder / c["file"]
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(descriptor, "w") as f:
                f.write(values[c["secret"]])
