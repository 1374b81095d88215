"""Reading a Slurm cluster through its client commands (issue 25): `sacct --json` for every
job's history (from slurmdbd), `squeue --json` for the live queue and each pending job's reason,
`sinfo --json` for the nodes (parsing.py reads them; issue 38). Each command runs with the
cluster's slurm.conf, UTC times in one format, and a timeout: while slurmctld is down the
commands block instead of failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from backend.slurm import parsing
from backend.slurm.rules import SlurmJob, SlurmNode

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TIMEOUT_S = 20.0
JOBS_PER_CALL = 500  # job ids named in one sacct call
# What a command may print before it is cut off (a queue of 100 000 jobs is about 200 MB of
# squeue's JSON; sacct's is ~2.5 KB a job).
MAX_OUTPUT = 512 * 1024 * 1024


class SlurmUnavailable(Exception):
    """A Slurm command failed or did not answer in time: the import tries again later."""


@dataclass(frozen=True)
class SlurmSettings:
    """How the server reaches a cluster's Slurm: the slurm.conf its commands read, where the
    commands are (None: the PATH), and how long each may take."""

    conf: str | None = None
    bin: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    # Runs submitted from Astraeus: a folder the server and every node see (each run's job
    # output, its workers' logs, starts and ends), and the Python on the nodes that has
    # Astraeus's agent package (agent.slurm_task). Without a state folder, runs are not
    # submitted to the cluster (its jobs are still imported).
    state_dir: str | None = None
    python: str = "python3"
    # The server's user is a Slurm operator: a priority above 50 may lower a job's nice below 0.
    operator: bool = False
    # Imported jobs whose output stops this long are stalled from their last output (counted
    # so; Slurm keeps them running): a duration as specs write it ("30m"); None: never.
    stall_timeout: str | None = None

    @classmethod
    def of(cls, stored: dict[str, Any] | None) -> SlurmSettings:
        stored = stored or {}
        return cls(
            conf=stored.get("conf"),
            bin=stored.get("bin"),
            timeout_s=float(stored.get("timeout_s") or DEFAULT_TIMEOUT_S),
            state_dir=stored.get("state_dir"),
            python=stored.get("python") or "python3",
            operator=bool(stored.get("operator")),
            stall_timeout=stored.get("stall_timeout") or None,
        )

    def stored(self) -> dict[str, Any]:
        return {
            "conf": self.conf,
            "bin": self.bin,
            "timeout_s": self.timeout_s,
            "state_dir": self.state_dir,
            "python": self.python,
            "operator": self.operator,
            "stall_timeout": self.stall_timeout,
        }


class SlurmCommands:
    """One cluster's client commands."""

    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings
        # The records the commands printed that could not be read (set aside, not imported)
        self.quarantined: list[parsing.Quarantined] = []

    def _env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TZ": "UTC",
            "SLURM_TIME_FORMAT": "%Y-%m-%dT%H:%M:%S",
            "LC_ALL": "C",
        }
        if self.settings.conf:
            env["SLURM_CONF"] = self.settings.conf
        return env

    async def submit(self, script: str, workdir: str) -> str:
        """sbatch a batch script (on standard input); the job's id."""
        out = await self.run("sbatch", "--parsable", f"--chdir={workdir}", stdin=script)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmUnavailable(f"sbatch printed no job id: {out.strip()[:200]!r}")
        return job_id

    async def cancel(self, job_id: str) -> None:
        await self.run("scancel", job_id)

    async def requeue(self, job_id: str, start: datetime) -> None:
        """Queue a running job again (its instance ends), to start at ``start`` at the
        earliest (in place of the begin time Slurm gives a requeued job: 2 minutes on)."""
        await self.run("scontrol", "requeue", job_id)
        await self.run(
            "scontrol", "update", f"jobid={job_id}", f"starttime={start:%Y-%m-%dT%H:%M:%S}"
        )

    async def run(self, name: str, *args: str, stdin: str | None = None) -> str:
        program = str(Path(self.settings.bin) / name) if self.settings.bin else name
        try:
            process = await asyncio.create_subprocess_exec(
                program,
                *args,
                env=self._env(),
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=MAX_OUTPUT,
            )
        except OSError as e:
            raise SlurmUnavailable(f"{name}: {e.strerror or e}") from e
        try:
            out, err = await asyncio.wait_for(
                process.communicate(stdin.encode() if stdin is not None else None),
                self.settings.timeout_s,
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise SlurmUnavailable(
                f"{name} did not answer within {self.settings.timeout_s:g}s "
                "(is slurmctld or slurmdbd up?)"
            ) from None
        if process.returncode != 0:
            said = err.decode(errors="replace").strip().splitlines()
            raise SlurmUnavailable(
                f"{name} exited with {process.returncode}: {said[-1] if said else 'no message'}"
            )
        if len(out) > MAX_OUTPUT:
            raise SlurmUnavailable(f"{name} printed more than {MAX_OUTPUT} bytes")
        return out.decode(errors="replace")

    async def accounting(self, since: datetime, until: datetime) -> list[SlurmJob]:
        """Every job allocation active at some time in [since, until] (sacct's window), of
        every user; steps are not read (-X). A job that never started reaches this list
        seconds after it is submitted, and one cancelled before it was ever eligible (held,
        before its BeginTime) is never in it: the window lists jobs by when they were eligible.
        Those are read from a second listing, the window's cancelled jobs (--state=CA selects
        by the job's start and end: 22.05 dates such a job's both at its cancel); a job the
        queue showed pending and that is in neither is asked for by id (``jobs``)."""
        window = (
            f"--starttime={since:%Y-%m-%dT%H:%M:%S}",
            f"--endtime={until:%Y-%m-%dT%H:%M:%S}",
        )
        active = await self._sacct(*window)
        listed = {j.job_id for j in active}
        cancelled = await self._sacct(*window, "--state=CANCELLED")
        # (a job in both is read once: --duplicates gives a requeued job's instances, which
        # a second copy would read as instances of their own)
        return active + [j for j in cancelled if j.job_id not in listed]

    async def jobs(self, job_ids: Sequence[str]) -> list[SlurmJob]:
        """These jobs as accounting has them (those it has heard of)."""
        out: list[SlurmJob] = []
        ids = parsing.askable(job_ids)
        for start in range(0, len(ids), JOBS_PER_CALL):
            out += await self._sacct("--jobs=" + ",".join(ids[start : start + JOBS_PER_CALL]))
        return out

    async def _sacct(self, *selection: str) -> list[SlurmJob]:
        common = ("-X", "--allusers", "--duplicates", *selection)
        # (--duplicates: a requeued job's instances, each with its own start and end)
        document = await self._json("sacct", *common)
        exits = parsing.parse_exit_codes(
            await self.run(
                "sacct", "-P", "--noheader", *common, "--format=" + ",".join(parsing.EXIT_FIELDS)
            )
        )
        return self._kept("sacct", lambda: parsing.parse_sacct(document, exits))

    async def queue(self) -> list[SlurmJob]:
        """The live queue (pending and running jobs), with pending jobs' reasons."""
        document = await self._json("squeue", "--all")
        return self._kept("squeue", lambda: parsing.parse_squeue(document))

    async def nodes(self) -> list[SlurmNode]:
        document = await self._json("sinfo")
        return self._kept("sinfo", lambda: parsing.parse_sinfo(document))

    async def _json(self, name: str, *args: str) -> object:
        text = await self.run(name, "--json", *args)
        try:
            return json.loads(text)
        except ValueError as e:
            raise SlurmUnavailable(f"{name} --json printed what is not JSON: {e}") from e

    def _kept(self, name: str, read: Callable[[], parsing.Read[T]]) -> list[T]:
        """The records read; those that could not be are kept aside in ``quarantined``. A
        document with errors, or of another shape, is the command's failure."""
        try:
            found = read()
        except parsing.BadSlurmOutput as e:
            message = str(e) if isinstance(e, parsing.SlurmSaidError) else f"{name}: {e}"
            raise SlurmUnavailable(message) from e
        for q in found.quarantined:
            log.warning("slurm: %s printed %s, which Astraeus cannot read: %s", name, q.what, q.why)
        self.quarantined += found.quarantined
        return found.found
