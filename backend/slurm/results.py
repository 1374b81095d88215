"""What agent.slurm_task writes in a submitted run's folder, read back (issue 25): where each
worker started, and how each ended with its failure snapshot. The folder is on a filesystem
the nodes and the server both see (the cluster's state folder); a file not yet there is a
worker not yet started, or ended without saying (killed with SIGKILL)."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

from backend.lifecycle.external import TaskEnd

MAX_FILE = 64 * 1024  # a start or end file (an end's snapshot is at most 16 KiB)


def run_dir(state_dir: str, key: str) -> Path:
    """A submitted run's folder, named by the run's shown id (its number is the install's
    own: the folder, and the job's comment, are seen by the cluster's other users)."""
    return Path(state_dir) / f"run-{key}"


def found_run_dir(state_dir: str, key: str, run_id: int) -> Path:
    """The run's folder, or the one a run submitted before folders were named by its shown id
    has (run-<number>) while its job still runs."""
    folder = run_dir(state_dir, key)
    legacy = Path(state_dir) / f"run-{run_id}"
    return legacy if not folder.exists() and legacy.exists() else folder


def prepare(folder: Path) -> None:
    """The run's folder, before its job is submitted (Slurm writes the job's output there).
    The job runs as the user that submits it, the server's: the folder is that user's alone
    (another user's job on the cluster can neither read its logs nor write its ends)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)


def _read(path: Path) -> dict[str, object] | None:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE + 1)
    except OSError:
        return None
    if len(data) > MAX_FILE:
        return None
    try:
        found = json.loads(data)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def starts(folder: Path, workers: int) -> dict[int, str]:
    """Each started worker's node."""
    out = {}
    for rank in range(workers):
        found = _read(folder / f"{rank}.start.json")
        if found is not None and isinstance(found.get("node"), str):
            out[rank] = str(found["node"])
    return out


def ends(folder: Path, workers: int) -> dict[int, TaskEnd]:
    """Each ended worker's end (those that wrote one)."""
    out = {}
    for rank in range(workers):
        found = _read(folder / f"{rank}.end.json")
        if found is None:
            continue
        try:
            ended = datetime.fromisoformat(str(found["ended_at"]))
            code = int(found["exit_code"])  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError):
            continue
        sig = found.get("signal")
        node = found.get("node")
        tail = found.get("log_tail")
        out[rank] = TaskEnd(
            rank=rank,
            node=node if isinstance(node, str) else None,
            ended_at=ended,
            exit_code=code,
            signal=sig if isinstance(sig, int) and sig else None,
            log_tail=tail if isinstance(tail, str) else "",  # cut as every snapshot is (lifecycle)
        )
    return out
