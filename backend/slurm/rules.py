"""Slurm's words in Astraeus's (issue 25), pure: a job and a node as Slurm's commands give
them (parsing.py reads them), and what each becomes here: a run with one worker per node, its states
with their times to the second, the phases the goodput tick counts, and a pending job's reason
in the seed's words ("Queued behind …", "Waits for namespace quota: …", "No machine fits: …").

Nothing here runs a command or touches the database (commands.py reads Slurm; service.py
writes runs).
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from backend.lifecycle.external import (  # (the lifecycle's: what Slurm says enters by them)
    Change,
)
from backend.lifecycle.sentences import (
    OOM_KILLED,
    exited_with,
    preempted_sentence,
    slurm_running,
    time_limit_sentence,
    worker_failed_sentence,
    workers_completed,
    workers_running,
)
from backend.lifecycle.states import Phase, RunState, Wait
from backend.scheduling.rules import seen_from


@dataclass(frozen=True)
class SlurmJob:
    """One job allocation: what it asked, where and when it ran, how it ended."""

    job_id: str  # "12", an array's task "12_3", a heterogeneous job's part "12+1"
    name: str
    account: str
    partition: str
    user: str
    state: str  # sacct's base state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...
    submit: datetime
    start: datetime | None = None
    end: datetime | None = None
    nodes: tuple[str, ...] = ()
    node_count: int = 1
    gpus: int = 0  # in all, over its nodes: allocated once it started, asked before
    exit_code: int | None = None
    signal: int | None = None
    time_limit: timedelta | None = None
    priority: int = 0
    qos: str = ""
    cancelled_by: str | None = None  # who cancelled it, as accounting names them
    reason: str = ""  # squeue's, while it is pending
    # Its instances that ran before Slurm queued it again (a preemption with requeue, a node
    # failure, scontrol requeue), oldest first.
    previous: tuple[Instance, ...] = ()
    # The GPUs Slurm gave it on each of its nodes (gres indexes), in its nodes' order: squeue's,
    # while it runs (accounting keeps only their count).
    gpu_indexes: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class Instance:
    """One run of a job that Slurm then queued again: its start, its end, its state then."""

    start: datetime
    end: datetime
    state: str
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmNode:
    name: str
    partitions: tuple[str, ...]
    gpus: int
    gpu_model: str
    cpus: float
    memory_bytes: int
    state: str  # sinfo's long state: idle, mixed, allocated, drained, down*, ...
    reason: str


_GPU_INDEXES = re.compile(r"(?:^|,)gpu[^(,]*\(IDX:([^)]*)\)")


def gres_indexes(detail: str) -> tuple[int, ...]:
    """A node's GPU indexes from one of squeue's ``gres_detail`` ("gpu:2(IDX:0-1)",
    "gpu:a100:3(IDX:0,2-3),shard:0"): the GPUs of every type, in order; () for none."""
    out: list[int] = []
    for listed in _GPU_INDEXES.findall(detail):
        for part in listed.split(","):
            low, _, high = part.partition("-")
            if low.isdigit() and (not high or high.isdigit()):
                out.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(out)))


def task_gpus(job: SlurmJob, nodes: dict[int, str], per_worker: int) -> dict[int, tuple[int, ...]]:
    """Each task's GPUs: its node's (squeue's indexes), shared among the node's tasks in rank
    order, ``per_worker`` each, as srun binds them with --gpus-per-task."""
    by_node = dict(zip(job.nodes, job.gpu_indexes, strict=False))
    taken: dict[str, int] = {}
    out: dict[int, tuple[int, ...]] = {}
    for rank in sorted(nodes):
        node = nodes[rank]
        first = taken.get(node, 0)
        indexes = by_node.get(node, ())[first : first + per_worker]
        taken[node] = first + per_worker
        if indexes:
            out[rank] = indexes
    return out


# ---- what a job becomes here ----


def run_name(job: SlurmJob) -> str:
    """A run's name for a job: its job name made a name here, and its id ("train-12")."""
    stem = re.sub(r"[^a-z0-9-]+", "-", job.name.lower()).strip("-")
    ident = re.sub(r"[^a-z0-9]+", "-", job.job_id.lower()).strip("-")
    stem = stem[: 62 - len(ident)].strip("-")
    return f"{stem}-{ident}" if stem else f"job-{ident}"


def worker_gpus(job: SlurmJob) -> list[int]:
    """Each node's GPUs (a worker per node): the job's GPUs split as evenly as they go."""
    count = max(job.node_count, len(job.nodes), 1)
    base, extra = divmod(job.gpus, count)
    return [base + (1 if rank < extra else 0) for rank in range(count)]


# Slurm's ended states and how Astraeus says them; the run state, its cause (runs.cause:
# its advice is classified by it), and whether the worker failed.
_ENDED: dict[str, tuple[RunState, str | None]] = {
    "COMPLETED": (RunState.COMPLETED, None),
    "FAILED": (RunState.FAILED, "exited"),
    "OUT_OF_MEMORY": (RunState.FAILED, "oom_killed"),
    "NODE_FAIL": (RunState.FAILED, "machine_lost"),
    "BOOT_FAIL": (RunState.FAILED, "machine_lost"),
    "TIMEOUT": (RunState.FAILED, "time_limit"),
    "DEADLINE": (RunState.FAILED, "time_limit"),
    "PREEMPTED": (RunState.STOPPED, "preempted"),
    "CANCELLED": (RunState.STOPPED, None),
    "REVOKED": (RunState.STOPPED, None),
}
LIVE_STATES = frozenset({"PENDING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"})


def ended(job: SlurmJob) -> bool:
    return job.state in _ENDED


def end_sentence(job: SlurmJob) -> str:
    """What a worker of an ended job reads, in the seed's words where it has some."""
    if job.state == "OUT_OF_MEMORY":
        return OOM_KILLED
    if job.state in ("NODE_FAIL", "BOOT_FAIL"):
        return "Machine lost: Slurm found its node failed"
    if job.state in ("TIMEOUT", "DEADLINE") and job.time_limit is not None:
        return time_limit_sentence(job.time_limit)
    if job.state == "PREEMPTED":
        return preempted_sentence("Slurm")
    if job.state in ("CANCELLED", "REVOKED"):
        return "Stopped: cancelled in Slurm"
    if job.signal:
        return f"Killed by signal {job.signal}"
    return exited_with(job.exit_code if job.exit_code is not None else -1)


# A job Slurm started again after a requeue is placed again (the accounting counts a held
# phase after a wait to be placed again only from a new placement: "restart"), then running.
# Slurm says only the second it started: it is counted running from a millisecond after.
RESTART_GAP = timedelta(milliseconds=1)


def changes(
    job: SlurmJob, workers: list[str], draining: frozenset[str] = frozenset()
) -> list[Change]:
    """The job's life as Astraeus's transitions: submitted (waiting), each instance that ran
    and was queued again (running, held; then waiting to be placed again, as Slurm says why:
    ``requeue_change``; ``draining``: the nodes draining now), its current one started
    (running, its GPUs held), ended. A job cancelled before it ran holds nothing."""
    out = [
        Change(
            at=job.submit,
            state=RunState.PENDING.value,
            phase=Phase.WAITING.value,
            held=False,
            run_reason=f"Run created from Slurm job {job.job_id}",
            worker_reason="Waiting to be placed with its gang",
        )
    ]

    def then(change: Change) -> None:  # never before the change before it
        out.append(replace(change, at=max(change.at, out[-1].at)))

    def started(at: datetime, until: datetime | None) -> None:
        if len(out) > 1:  # a later attempt: placed again (restart), then running
            then(
                Change(
                    at=at,
                    state=RunState.STARTING.value,
                    phase=Phase.RESTART.value,
                    held=True,
                    run_reason=f"Started again by Slurm (job {job.job_id})",
                    worker_reason=f"Started again by Slurm (job {job.job_id})",
                )
            )
            # (never past the instance's end: one requeued within the second it started held
            # its GPUs no longer than Slurm says)
            at = min(at + RESTART_GAP, until) if until is not None else at + RESTART_GAP
        then(_started(job, at, workers))

    for instance in job.previous:
        started(instance.start, instance.end)
        then(requeue_change(instance.end, instance.state, _on(instance.nodes, draining)))
    if job.start is not None and job.state != "PENDING":
        started(job.start, job.end)
    if ended(job):
        state, cause = _ENDED[job.state]
        if state == RunState.COMPLETED:
            run_reason = workers_completed(len(workers))
        elif state == RunState.FAILED and workers:
            node = job.nodes[0] if job.nodes else None
            run_reason = worker_failed_sentence(workers[0], node, end_sentence(job))
        else:
            run_reason = end_sentence(job)
        then(
            Change(
                at=job.end or job.start or job.submit,
                state=state.value,
                phase=Phase.ENDED.value,
                held=False,
                run_reason=run_reason,
                worker_reason=end_sentence(job),
                cause=cause,
                exit_code=job.exit_code,
            )
        )
    return out


def _started(job: SlurmJob, at: datetime, workers: list[str]) -> Change:
    return Change(
        at=at,
        state=RunState.RUNNING.value,
        phase=Phase.RUNNING.value,
        held=True,
        run_reason=workers_running(len(workers), len(workers)),
        worker_reason=slurm_running(job.job_id),
    )


REQUEUED = "Requeued in Slurm (scontrol requeue)"


def _on(nodes: tuple[str, ...], draining: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted(set(nodes) & draining))


def requeue_change(at: datetime, state: str, drained: tuple[str, ...] = ()) -> Change:
    """A running job queued again, from the end of the instance that ran, counted as Slurm
    says why (issue 38): its node failed (a failure), higher-priority work preempted it, or it
    was requeued (`scontrol requeue`, an administrator's or its owner's) off a node that is
    draining (the seed's preemption: "stopping for higher-priority work or a drain"); else
    requeued for no cause Slurm names: waiting again, no one's loss."""
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        phase, reason = Phase.REQUEUED_FAILURE, "Machine lost: Slurm found its node failed"
    elif state == "PREEMPTED":
        phase, reason = Phase.REQUEUED_PREEMPTION, preempted_sentence("Slurm")
    elif drained:
        phase, reason = Phase.REQUEUED_PREEMPTION, f"{REQUEUED}: node {drained[0]} is draining"
    else:
        phase, reason = Phase.REQUEUED_ADMIN, REQUEUED
    return Change(
        at=at,
        state=RunState.PENDING.value,
        phase=phase.value,
        held=False,
        run_reason=reason,
        worker_reason=reason,
    )


# ---- a pending job's reason ----

# Slurm's reasons (squeue's REASON) that say the job waits for a limit of its account or QOS.
_LIMIT = re.compile(r"^(Assoc|QOS)(Grp|Max)")
_NO_NODE = {
    "ReqNodeNotAvail",
    "NodeDown",
    "PartitionDown",
    "PartitionInactive",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionConfig",
    "BadConstraints",
    "Reservation",
}


@dataclass(frozen=True)
class Ahead:
    """The job a pending job waits behind in its partition, as its workspace may name it."""

    workspace_id: int | None
    name: str


def pending_reason(
    job: SlurmJob, workspace_id: int, ahead: Ahead | None
) -> tuple[str, Wait | None]:
    """A pending job's reason in the seed's words, from Slurm's, with what it waits for."""
    reason = job.reason
    if reason == "Priority" and ahead is not None:
        named = (
            seen_from(workspace_id, ahead.workspace_id, ahead.name)
            if ahead.workspace_id is not None
            else "a job of another account"
        )
        return f"Queued behind {named}", Wait.QUEUE
    if reason in ("Resources", "Priority"):
        return f"Waits for resources: next to run in partition {job.partition}", Wait.QUEUE
    if _LIMIT.match(reason):
        return f"Waits for namespace quota: Slurm's limit {reason} on {job.account}", Wait.QUEUE
    if reason in _NO_NODE:
        return f"No machine fits: Slurm says {reason} in partition {job.partition}", Wait.MACHINES
    if reason == "Dependency":
        return "Waits for the jobs it depends on", Wait.QUEUE
    if reason == "DependencyNeverSatisfied":
        return "Cannot start: a job it depends on will never satisfy it", Wait.QUEUE
    if reason == "BeginTime":
        return "Waits for its begin time", Wait.QUEUE
    if reason in ("JobHeldUser", "JobHeldAdmin"):
        who = "its user" if reason == "JobHeldUser" else "an administrator"
        return f"Held by {who} in Slurm", Wait.QUEUE
    if reason in ("", "None"):
        return "Waits for Slurm's scheduler", Wait.QUEUE
    return f"Waits in Slurm's queue: {reason}", Wait.QUEUE


def queue_ahead(pending: list[SlurmJob]) -> dict[str, SlurmJob]:
    """For each pending job, the one just ahead of it in its partition's queue (Slurm's order:
    priority, then submission, then id)."""
    by_partition: dict[str, list[SlurmJob]] = {}
    for job in pending:
        by_partition.setdefault(job.partition, []).append(job)
    out = {}
    for jobs in by_partition.values():
        jobs.sort(key=lambda j: (-j.priority, j.submit, _id_key(j.job_id)))
        for before, job in itertools.pairwise(jobs):
            out[job.job_id] = before
    return out


def _id_key(job_id: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", job_id))


# ---- nodes ----


def machine_state(node: SlurmNode) -> tuple[str, str]:
    """A node's state and reason as a machine's: ready, draining or lost."""
    state = node.state.rstrip("*~#!%$@^-")
    if node.state.endswith("*") or state in ("down", "fail", "failing", "not_responding"):
        return "lost", f"Slurm: {node.state}" + (f" ({node.reason})" if node.reason else "")
    if state.startswith("drain"):
        return "draining", f"Slurm: {node.state}" + (f" ({node.reason})" if node.reason else "")
    return "ready", f"Slurm: {node.state}"


def without_stubs(accounted: list[SlurmJob]) -> list[SlurmJob]:
    """Accounting's records less those of jobs slurmdbd has only heard began: a job's start
    reaches it before the job's own record, and it lists the job meanwhile named "allocation",
    in no partition, asking for nothing; an array's last task, whose id is the array's, under
    the array's id with no task ("34" for "34_3"). Such a record is read at the next import,
    once the job's record has come (a job still queued is read from the queue meanwhile).

    Every job Slurm accepts is in a partition. Kept of those in none: a job cancelled before it
    ran, which slurmdbd may only ever hear of by its end (``merge`` takes what it asked from
    the controller), unless its id is an array's."""
    arrays = {j.job_id.split("_", 1)[0] for j in accounted if "_" in j.job_id}
    return [
        j
        for j in accounted
        if j.partition or (ended(j) and j.start is None and j.job_id not in arrays)
    ]


def merge(accounted: list[SlurmJob], queued: list[SlurmJob]) -> list[SlurmJob]:
    """One record per job: the live queue's for a job still in it (slurmctld's view is newer
    than accounting's, and only it has a pending job's reason), else accounting's. A job that
    ended is read from accounting only, which has its end and exit code: one the queue shows
    ended before slurmdbd has it is read at the next import. (The queue is read first: a job
    accounting has ended after it was read is taken as ended.)"""
    out: dict[str, SlurmJob] = {}
    instances: dict[str, list[SlurmJob]] = {}
    for job in accounted:
        instances.setdefault(job.job_id, []).append(job)
    for job_id, found in instances.items():
        # sacct --duplicates: a requeued job's instances, the current one last (not started,
        # or started after the others)
        found.sort(key=lambda j: (j.start is None, j.start or j.submit))
        ran = tuple(
            Instance(j.start, j.end, j.state, j.nodes)
            for j in found[:-1]
            if j.start is not None and j.end is not None
        )
        current = found[-1]
        if current.state == "REQUEUED" and current.start and current.end:
            # accounting's record of the instance that ran, while the job waits again
            ran = (*ran, Instance(current.start, current.end, "REQUEUED", current.nodes))
            current = replace(current, state="PENDING", start=None, end=None, nodes=())
        # a requeued instance is submitted anew; the job was submitted with the first
        first_submit = min(j.submit for j in found)
        out[job_id] = replace(current, previous=ran, submit=first_submit)
    for job_id, job in list(out.items()):
        if ended(job) and job.end is None:
            # accounting has its end but not yet when (slurmdbd, back after being down, gets
            # the state and the time seconds apart): read again at the next import
            del out[job_id]
    for job in queued:
        known = out.get(job.job_id)
        if known is not None and known.start is None and ended(known) and ended(job):
            # Never ran: slurmdbd may have heard only of its end (a job cancelled moments after
            # its submission, before the controller sent its start record: named
            # "allocation", in no partition, submitted at its cancel, asking for nothing). The
            # controller keeps the job a while after its end with what it asked for.
            out[job.job_id] = _asked_as_queued(known, job)
            continue
        if job.state == "COMPLETING" and known is not None:
            continue  # its processes ending: accounting has how the instance ended
        if job.state in LIVE_STATES and (known is None or not ended(known)):
            if known is not None:
                job = replace(job, previous=known.previous, submit=min(job.submit, known.submit))
            out[job.job_id] = job
    return sorted(out.values(), key=lambda j: (j.submit, _id_key(j.job_id)))


def _asked_as_queued(accounted: SlurmJob, queued: SlurmJob) -> SlurmJob:
    """A job that ended before it ran, as accounting has its end and the controller what it
    asked for and when it was submitted."""
    return replace(
        accounted,
        name=queued.name or accounted.name,
        partition=queued.partition or accounted.partition,
        submit=min(queued.submit, accounted.submit),
        node_count=queued.node_count or accounted.node_count,
        gpus=queued.gpus or accounted.gpus,
        time_limit=queued.time_limit or accounted.time_limit,
    )


# ---- a run of Astraeus's as a Slurm job ----


@dataclass(frozen=True)
class Submission:
    """What a run asks of Slurm: one job whose tasks are its workers (the gang is Slurm's
    allocation: placed whole or not at all), each run by agent.slurm_task on its node."""

    run_key: str  # the run's shown id (backend/ids.py): its number is the install's own
    run: str
    account: str
    partition: str | None
    workers: int
    gpus: int  # per worker
    cpus: int  # per worker
    memory_mb: int | None  # per worker
    command: tuple[str, ...]
    environment: tuple[tuple[str, str], ...]
    time_limit: timedelta | None
    priority: int  # Astraeus's, 0 to 100
    run_dir: str
    python: str
    operator: bool = False  # the server's Slurm user may lower a nice below 0


# Astraeus's priority (0 to 100, 50 by default) as Slurm's nice value: a higher priority is a
# lower nice. Slurm lets anyone raise their nice; only its operators lower it below 0: where
# the server's user is not one, a priority above 50 is submitted at nice 0.
NICE_PER_PRIORITY = 1000


def nice(priority: int, *, operator: bool = False) -> int:
    value = (50 - priority) * NICE_PER_PRIORITY
    return value if operator else max(value, 0)


def slurm_minutes(limit: timedelta) -> int:
    """sbatch's --time in minutes, rounded up: a run is never cut before its own limit."""
    return max(1, -(-int(limit.total_seconds()) // 60))


def batch_script(s: Submission) -> str:
    """The job's batch script: its resources as #SBATCH lines, then one srun of the workers."""
    quote = shlex.quote
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={s.run}",
        f"#SBATCH --account={s.account}",
        f"#SBATCH --ntasks={s.workers}",
        f"#SBATCH --cpus-per-task={s.cpus}",
        f"#SBATCH --output={s.run_dir}/slurm-%j.out",
        f"#SBATCH --comment=astraeus-run-{s.run_key}",
        # a stall's restart queues the job again (scontrol requeue), whatever the cluster's
        # JobRequeue says
        "#SBATCH --requeue",
        f"#SBATCH --nice={nice(s.priority, operator=s.operator)}",
    ]
    if s.partition:
        lines.append(f"#SBATCH --partition={s.partition}")
    if s.gpus:
        lines.append(f"#SBATCH --gpus-per-task={s.gpus}")
    if s.memory_mb:
        lines.append(f"#SBATCH --mem-per-cpu={-(-s.memory_mb // s.cpus)}M")
    if s.time_limit is not None:
        lines.append(f"#SBATCH --time={slurm_minutes(s.time_limit)}")
    lines.append("")
    for name, value in s.environment:
        lines.append(f"export {name}={quote(value)}")
    task = [
        s.python,
        "-m",
        "agent.slurm_task",
        "--run-dir",
        s.run_dir,
        "--run",
        s.run,
        "--",
        *s.command,
    ]
    # One failed rank ends the job (the gang does not run without it): --kill-on-bad-exit.
    lines.append("exec srun --kill-on-bad-exit=1 " + " ".join(quote(a) for a in task))
    return "\n".join(lines) + "\n"
