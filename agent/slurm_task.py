"""One worker of an Astraeus run on a Slurm cluster (issue 25): what `srun` starts for each
task of the run's job, on its node, inside the job's step (Slurm's cgroup and GPUs).

    python -m agent.slurm_task --run-dir DIR --run NAME --master-port PORT -- COMMAND...

It gives the command what torchrun-style code expects (RANK from SLURM_PROCID, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR: the job's first node, MASTER_PORT), as the agent does for its own
workers; keeps its output as the agent keeps a worker's log (agent/logs.py: lines cut at 64 KiB,
the log capped, each write's time); and writes where the server reads it, in the run's folder:
``<rank>.start.json`` as the command starts (its node and time) and ``<rank>.end.json`` as it
ends (exit code or signal, time, and the failure snapshot: its last 50 lines, at most 16 KiB).
It exits as the command did. Slurm's signals (a cancel, the time limit, --kill-on-bad-exit) are
passed to the command's process group.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.logs import WorkerLog

READ_BYTES = 64 * 1024


def _first_node(nodelist: str) -> str:
    """The job's first node (rank 0's with block distribution), as Slurm expands its list."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return socket.gethostname().split(".")[0]


def environment(run: str, master_port: int, env: dict[str, str]) -> dict[str, str]:
    rank = env.get("SLURM_PROCID", "0")
    return {
        **env,
        "RANK": rank,
        "WORLD_SIZE": env.get("SLURM_NTASKS", "1"),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": env.get("SLURM_NTASKS_PER_NODE", env.get("SLURM_NTASKS", "1")),
        "MASTER_ADDR": _first_node(env.get("SLURM_JOB_NODELIST", "")),
        "MASTER_PORT": str(master_port),
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
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command after --")
    env = environment(args.run, args.master_port, dict(os.environ))
    rank = env["RANK"]
    folder: Path = args.run_dir
    env["ASTRAEUS_PROGRESS_FILE"] = str(folder / f"{rank}.progress")
    log = WorkerLog(folder / "logs", f"{args.run}-{rank}")
    log.begin()
    node = socket.gethostname().split(".")[0]
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
        _write(
            folder / f"{rank}.end.json",
            {
                "node": node,
                "ended_at": _now(),
                "exit_code": 127,
                "signal": None,
                "log_tail": log.snapshot(),
            },
        )
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
    _write(
        folder / f"{rank}.end.json",
        {
            "node": node,
            "ended_at": ended,
            "exit_code": code,
            "signal": sig,
            "log_tail": log.snapshot() if code != 0 else "",
        },
    )
    sys.stdout.flush()
    return code


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
