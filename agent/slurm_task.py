"""One worker of an Astraeus run on a Slurm cluster (issue 25): what `srun` starts for each
task of the run's job, on its node, inside the job's step (Slurm's cgroup and GPUs).

    python -m agent.slurm_task --run-dir DIR --run NAME -- COMMAND...

It gives the command what torchrun-style code expects (RANK from SLURM_PROCID, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT), as the agent does for its own workers; keeps its
output as the agent keeps a worker's log (agent/logs.py: lines cut at 64 KiB, the log capped,
each write's time); and writes where the server reads it, in the run's folder:
``<rank>.start.json`` as the command starts (its node and time) and ``<rank>.end.json`` as it
ends (exit code or signal, time, and the failure snapshot: its last 50 lines, at most 16 KiB).
It exits as the command did. Slurm's signals (a cancel, the time limit, --kill-on-bad-exit) are
passed to the command's process group.

MASTER_PORT is chosen where it is known to be free: on rank 0's node, by rank 0. A port the
server derived (from the run's id) met another cluster's run of the same id, or another job's
on the node, and the second gang failed with EADDRINUSE. Rank 0 takes a port the kernel picks
(agent/rendezvous.py: held, and claimed machine-wide, until its command starts) and writes it
with its node in the run's folder, in a file of this job instance (its job id and restart
count: a requeued job's ranks never read the port of the instance before); the other ranks
wait for it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent import rendezvous
from agent.logs import WorkerLog

READ_BYTES = 64 * 1024

# How long a rank other than 0 waits for rank 0's port. Rank 0 writes it as soon as its task
# starts, which srun does for all tasks together: a wait this long means rank 0 never started
# (its node lost, its Python broken), and the job must fail rather than hold its GPUs idle.
MASTER_WAIT_S = 300.0
MASTER_POLL_S = 0.05


@dataclass
class Master:
    """Where the gang meets: rank 0's node and port, and, on rank 0, the port held."""

    addr: str
    port: int
    claim: rendezvous.Claim | None = None


def master_file(folder: Path, env: dict[str, str]) -> Path:
    """Rank 0's port for this job instance: the job's id and its restart count."""
    job = env.get("SLURM_JOB_ID", "")
    restart = env.get("SLURM_RESTART_COUNT", "0")
    return folder / f"master-{job}-{restart}.json"


def publish_master(folder: Path, env: dict[str, str]) -> Master | None:
    """Rank 0: a free port, held, written for the other ranks; None when none is free."""
    held = rendezvous.claim_free()
    if held is None:
        return None
    master = Master(socket.gethostname(), held.port, held)
    _write(master_file(folder, env), {"addr": master.addr, "port": master.port})
    return master


def await_master(folder: Path, env: dict[str, str], wait_s: float) -> Master | None:
    """The other ranks: rank 0's port once it is written; None past ``wait_s`` seconds."""
    path = master_file(folder, env)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            found = json.loads(path.read_text())
            return Master(str(found["addr"]), int(found["port"]))
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(MASTER_POLL_S)


def environment(run: str, master: Master, env: dict[str, str]) -> dict[str, str]:
    rank = env.get("SLURM_PROCID", "0")
    return {
        **env,
        "RANK": rank,
        "WORLD_SIZE": env.get("SLURM_NTASKS", "1"),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": env.get("SLURM_NTASKS_PER_NODE", env.get("SLURM_NTASKS", "1")),
        "MASTER_ADDR": master.addr,
        "MASTER_PORT": str(master.port),
        "ASTRAEUS_RUN": run,
        "ASTRAEUS_WORKER": f"{run}-{rank}",
    }


def _write(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)  # the server never reads half a file


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.slurm_task")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command after --")
    folder: Path = args.run_dir
    rank = os.environ.get("SLURM_PROCID", "0")
    log = WorkerLog(folder / "logs", f"{args.run}-{rank}")
    log.begin()
    # Slurm's name for the node (the import's machine), which slurmd may be started as
    # though the host is named otherwise (slurmd -N); the host's where Slurm does not say.
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    master = _master(folder, dict(os.environ), log)
    if master is None:
        _end(folder / f"{rank}.end.json", node, _now(), 1, None, log)
        return 1
    env = environment(args.run, master, dict(os.environ))
    env["ASTRAEUS_PROGRESS_FILE"] = str(folder / f"{rank}.progress")
    if master.claim is not None:
        master.claim.started()  # the command binds the port now
    try:
        return _run(command, env, folder, rank, node, log)
    finally:
        if master.claim is not None:
            master.claim.end()


def _master(folder: Path, env: dict[str, str], log: WorkerLog) -> Master | None:
    """Rank 0 publishes its port, the others wait for it; None (said in the log) when the
    task cannot start: no free port, or no port from rank 0 in time."""
    if env.get("SLURM_PROCID", "0") == "0":
        master = publish_master(folder, env)
        if master is None:
            log.append(b"no free port on this node for MASTER_PORT\n")
        return master
    wait_s = MASTER_WAIT_S  # read here, so that a test can shorten it
    master = await_master(folder, env, wait_s)
    if master is None:
        name = master_file(folder, env).name
        log.append(f"waited {wait_s:g} s for rank 0's MASTER_PORT ({name}): none came\n".encode())
    return master


def _run(
    command: list[str], env: dict[str, str], folder: Path, rank: str, node: str, log: WorkerLog
) -> int:
    """The command, its output into its log, its start and end written in the run's folder;
    its exit code."""
    try:
        child = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as e:
        log.append(f"cannot start {command[0]}: {e.strerror or e}\n".encode())
        _end(folder / f"{rank}.end.json", node, _now(), 127, None, log)
        return 127
    _write(folder / f"{rank}.start.json", {"node": node, "started_at": _now(), "pid": child.pid})

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    assert child.stdout is not None
    reader = threading.Thread(target=_copy, args=(child.stdout, log), daemon=True)
    reader.start()
    status = child.wait()
    # dated when the process ended, before its last output is read: the rank that crashed
    # first must not look later than the ranks that died of its absence
    ended = _now()
    reader.join(timeout=5)
    code, sig = (status, None) if status >= 0 else (128 - status, -status)
    _end(folder / f"{rank}.end.json", node, ended, code, sig, log)
    sys.stdout.flush()
    return code


def _end(path: Path, node: str, ended: str, code: int, sig: int | None, log: WorkerLog) -> None:
    """How the task ended, with its log's last lines when it failed."""
    _write(
        path,
        {
            "node": node,
            "ended_at": ended,
            "exit_code": code,
            "signal": sig,
            "log_tail": log.snapshot() if code != 0 else "",
        },
    )


def _copy(stream: Any, log: WorkerLog) -> None:
    """The command's output into its log as it arrives (and to the job's output, as Slurm
    keeps it)."""
    while True:
        data = stream.read1(READ_BYTES) if hasattr(stream, "read1") else stream.read(READ_BYTES)
        if not data:
            return
        log.append(data, int(time.time() * 1000))
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    sys.exit(main())
