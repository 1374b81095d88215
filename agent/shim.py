"""The worker's keeper: one small process per worker that outlives the agent.

The agent does not hold its workers' pipes. It starts this shim (in a session of its own),
which starts the worker's command, copies its output to the log on disk, waits for it, and
writes how it ended to ``exit.json`` (a typed cause and its details: the server writes the
sentence). A restarted agent finds the shim still there, or the exit
it recorded, and carries on: no state change or failure snapshot is lost with the agent (the
role containerd's shim plays for a container).

    python -m agent.shim <worker folder>

The folder holds ``spec.json`` (written by the agent); the shim adds ``worker.pid`` (the
worker's process group) and, at the end, ``exit.json`` (code, cause, signal, detail, time).
The worker's process begins as ``agent/enter.py``, which joins its control group and becomes
the workload's user before the command runs: the shim itself stays root, the workload never
is.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from agent.cgroups import WorkerCgroup
from agent.logs import WorkerLog

ENTER = str(Path(__file__).with_name("enter.py"))
SPEC = "spec.json"
WORKER_PID = "worker.pid"
EXIT = "exit.json"
KILLED = 128 + signal.SIGKILL  # 137: how a shell reports a command killed by SIGKILL
UNREADABLE = "unreadable.json"  # enter.py's report: a file the command names its user may not read


class EndCause(StrEnum):
    """How a worker's attempt ended (proto EndCause, END_CAUSE_ and the name in capitals)."""

    EXITED = "exited"  # by itself, with its exit code
    OOM_KILLED = "oom_killed"  # by the kernel, for its memory limit
    SIGNALLED = "signalled"  # by a signal
    NOT_FOUND = "not_found"  # its command is not there (127)
    LOST = "lost"  # its process ended while the agent was away
    LOST_BEFORE_START = "lost_before_start"  # its container never started
    IMAGE_PULL = "image_pull"  # its image could not be pulled (detail: the engine's words)
    NOT_STARTED = "not_started"  # it could not be started here (detail: why)
    STOPPED_BEFORE_START = "stopped_before_start"
    UNREADABLE = "unreadable"  # not run: it names a file its user may not read (detail: which)
    PORT_TAKEN = "port_taken"  # its gang's MASTER_PORT is another program's (detail: the port)


@dataclass
class Exit:
    """How a worker ended: its cause and the facts the machine alone knows. No sentence: the
    server writes it from these."""

    code: int | None
    cause: EndCause
    signal: int | None = None
    detail: str = ""
    # When the process ended (Unix ms), where it was seen to end; not part of how it ended.
    at_ms: int | None = field(default=None, compare=False)
    # A process of the worker was killed for memory, said where no group counts the kills
    # (a container's engine says it of the container): counted in task_oom_kills_total.
    oom_kill_seen: bool = field(default=False, compare=False)
    # For UNREADABLE: the user it runs as, and the folder it may not enter ("": the file).
    uid: int | None = None
    blocked_at: str = ""
    # For PORT_TAKEN: the port held for the gang's next placement here (agent/rendezvous.py).
    offered_port: int | None = None
    # Its control group's process limit (pids.max), when the limit refused it a process or a
    # thread at least once: said with how it ended, whatever that was.
    pids_limit: int | None = None


def write_atomically(path: Path, text: str, *, private: bool = False) -> None:
    """Readers see the old file or the whole new one, never half of it."""
    partial = path.with_suffix(path.suffix + ".partial")
    descriptor = os.open(
        partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644
    )
    with os.fdopen(descriptor, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    partial.replace(path)


def record_exit(folder: Path, exit: Exit) -> None:
    """How the worker ended, and when (``exit.at_ms``, Unix ms: now by default)."""
    at = exit.at_ms if exit.at_ms is not None else int(time.time() * 1000)
    recorded = {"code": exit.code, "cause": str(exit.cause), "signal": exit.signal}
    if exit.uid is not None:
        recorded |= {"uid": exit.uid, "blocked_at": exit.blocked_at}
    if exit.oom_kill_seen:  # an agent restarted before it sampled the end still counts it
        recorded["oom_kill_seen"] = True
    if exit.pids_limit is not None:
        recorded["pids_limit"] = exit.pids_limit
    write_atomically(folder / EXIT, json.dumps(recorded | {"detail": exit.detail, "at_ms": at}))


def recorded_exit(folder: Path) -> Exit | None:
    """The end written in the folder's exit.json, or None before it is written. A shim of an
    agent before causes wrote a code and a sentence: its code alone says how (none: lost)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        recorded = json.loads((folder / EXIT).read_text())
        code, at = recorded.get("code"), recorded.get("at_ms")
        if "cause" in recorded:
            cause = EndCause(recorded["cause"])
        else:
            cause = EndCause.LOST if code is None else EndCause.EXITED
        signal, uid = recorded.get("signal"), recorded.get("uid")
        pids_limit = recorded.get("pids_limit")
        return Exit(
            code if code is None else int(code),
            cause,
            signal=signal if signal is None else int(signal),
            detail=str(recorded.get("detail") or ""),
            at_ms=int(at) if at else None,
            uid=uid if uid is None else int(uid),
            blocked_at=str(recorded.get("blocked_at") or ""),
            oom_kill_seen=bool(recorded.get("oom_kill_seen")),
            pids_limit=pids_limit if pids_limit is None else int(pids_limit),
        )
    return None


def cgroup_of(spec: dict[str, Any]) -> WorkerCgroup | None:
    group = spec.get("cgroup")
    if not group:
        return None
    cpu, cpu_limit, pids = group.get("cpu"), group.get("cpu_limit"), group.get("pids")
    return WorkerCgroup(
        int(group["version"]),
        Path(group["memory"]),
        Path(cpu) if cpu else None,
        Path(cpu_limit) if cpu_limit else None,
        Path(pids) if pids else None,
    )


def run(folder: Path) -> int:
    spec = json.loads((folder / SPEC).read_text())
    log = WorkerLog(Path(spec["log_root"]), spec["worker"])
    group = cgroup_of(spec)
    kills_before = group.oom_kills() if group else 0
    refused_before = group.pids_refused() if group else 0
    try:
        # An empty environment and an isolated interpreter: nothing of the spec's reaches
        # a root process (enter.py gives the command its environment as it execs it).
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", ENTER, str(folder)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={},
            cwd="/",
            start_new_session=True,
        )
    except OSError as error:
        missing = isinstance(error, FileNotFoundError)
        log.append(f"{spec['argv'][0]}: {error.strerror}\n".encode())
        record_exit(
            folder, Exit(127, EndCause.NOT_FOUND) if missing else Exit(126, EndCause.EXITED)
        )
        return 0
    write_atomically(folder / WORKER_PID, str(child.pid))
    assert child.stdout is not None
    descriptor = child.stdout.fileno()
    # When the process ended, as it ends: its output may close later (a child of its own holds
    # the pipe), and a gang's first failure is the earliest process end (issue 20).
    ended_ms: list[int] = []
    reaper = threading.Thread(target=_reap, args=(child, ended_ms), daemon=True)
    reaper.start()
    while chunk := os.read(descriptor, 65536):
        log.append(chunk)
    reaper.join()
    ran = how_it_ended(child.returncode, group, kills_before, ended_ms)
    if group is not None and group.pids_refused() > refused_before:
        ran.pids_limit = group.pids_limit()
    record_exit(folder, not_run(folder, ended_ms) or ran)
    return 0


def not_run(folder: Path, ended_ms: list[int]) -> Exit | None:
    """The end enter.py reported when it did not run the command: a file it names that its
    user may not read (its ``unreadable.json``); None when it ran it."""
    report = folder / UNREADABLE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        found = json.loads(report.read_text() or "null")
        if found is not None:
            return Exit(
                None,
                EndCause.UNREADABLE,
                detail=str(found["path"]),
                at_ms=ended_ms[0] if ended_ms else None,
                uid=int(found["uid"]),
                blocked_at=str(found["blocked_at"]),
            )
    return None


def killed_for_memory(returncode: int, kills_before: int, kills_after: int) -> bool:
    """Whether the worker's main process was the one the kernel killed for memory: it died of
    SIGKILL (or, a shell that ran it, ended 137: 128 + SIGKILL) while its group counted an OOM
    kill. A child killed for memory while the main process lived on ends nothing: the worker
    ends as its main process does (the kill is counted all the same: task_oom_kills_total)."""
    killed = returncode in (-signal.SIGKILL, KILLED)
    return killed and kills_after > kills_before


def how_it_ended(
    returncode: int, group: WorkerCgroup | None, kills_before: int, ended_ms: list[int]
) -> Exit:
    """Killed for memory (killed_for_memory), by a signal (the exit code is 128 + its number,
    the shell's convention), or exited by itself."""
    at_ms = ended_ms[0] if ended_ms else None
    if group is not None and killed_for_memory(returncode, kills_before, group.oom_kills()):
        return Exit(KILLED, EndCause.OOM_KILLED, at_ms=at_ms)
    if returncode < 0:
        return Exit(128 - returncode, EndCause.SIGNALLED, signal=-returncode, at_ms=at_ms)
    return Exit(returncode, EndCause.EXITED, at_ms=at_ms)


def _reap(child: subprocess.Popen[bytes], ended_ms: list[int]) -> None:
    child.wait()
    ended_ms.append(int(time.time() * 1000))


def _ignore(number: int, frame: object) -> None:
    """Signals reach the worker's own group; the shim stays to write how it ended."""


def main() -> int:
    # The agent's signals are not the worker's: only the agent's stop reaches the worker. A
    # handler (not SIG_IGN, which the worker would inherit) keeps the shim alive to record it.
    for number in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, _ignore)
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
