"""The agent on a Slurm node (issue 25, `astraeus agent --executor slurm`): it watches what
Slurm runs there, against a real one-node Slurm that puts its jobs in control groups (v1:
proctrack/cgroup, task/cgroup). For each worker the import places on the node it samples the
group Slurm put it in (CPU, memory, its limit) and its GPUs, reads its progress file, and copies
its log, which the server then serves as any worker's (tail, follow, archived after its end):
a submitted run's workers are its tasks; an imported job's worker is the job on the node, its
output its log. Running time of a worker whose GPUs are busy is productive, to the second."""

from __future__ import annotations

import asyncio
import itertools
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import select

from backend.db import Database
from backend.gateway.servicer import AgentService
from backend.lifecycle import service as lifecycle
from backend.logs.service import WorkerRef
from backend.metrics.rules import BY_NAME, NO_GPU
from backend.models import MetricSample, Run, Worker
from backend.slurm import service as importer
from tests.support import FakeClock, Tenancy
from tests.support.slurm import (
    SlurmCluster,
    ddp_spec,
    history,
    hpc,
    import_until,
    ledger,
    run_of,
    submit,
    submitted_job,
    tick_after,
    utc,
    wait_for,
    watching_node,
    workers_of,
)
from tests.support.slurm import (
    marks as slurm_marks,
)

pytestmark = slurm_marks()

MB = 2**20


async def hpc_of(
    db: Database,
    clock: FakeClock,
    cluster: SlurmCluster,
    state: Path | None = None,
    **settings: str,
) -> tuple[int, str]:
    """Cluster hpc on the module's Slurm, with an account of the test's own mapped to workspace
    default (and, with ``state``, a state folder: runs submitted from here): its id, the account."""
    account = f"acct{uuid.uuid4().hex[:8]}"
    cluster.account(account)
    if state is not None:
        settings |= {"state_dir": str(state), "python": sys.executable}
    return await hpc(db, clock, cluster, {account: "default"}, **settings), account


async def until_printed(service: AgentService, worker: Worker, line: str) -> None:
    """Until the node's agent serves the worker's live log with ``line`` in it."""

    async def printed() -> bool:
        text, archived = await tail(service, worker)
        return line in text and not archived

    await _eventually(f"{line!r} in {worker.name}'s log", printed)


async def until_archived(service: AgentService, worker: Worker) -> None:
    """Until the node's agent serves the worker's log archived: its watch has ended."""

    async def archived() -> bool:
        return (await tail(service, worker))[1]

    await _eventually(f"{worker.name}'s archived log", archived)


async def samples(db: Database, worker_id: int, metric: str) -> list[tuple[int | None, float]]:
    """The worker's samples of a metric: (gpu, value), oldest first."""
    async with db.read() as session:
        rows = await session.execute(
            select(MetricSample.gpu, MetricSample.value)
            .where(MetricSample.worker_id == worker_id, MetricSample.metric == BY_NAME[metric].id)
            .order_by(MetricSample.ts)
        )
        return [(None if gpu == NO_GPU else gpu, value) for gpu, value in rows]


async def tail(service: AgentService, worker: Worker, lines: int = 100) -> tuple[str, bool]:
    """The worker's log as its node's agent serves it (the one machine connected)."""
    machine_id = next(iter(service.streams.by_machine))
    found = await service.tail(machine_id, WorkerRef(worker.id, worker.name), lines, 2**20, 10)
    assert found is not None, "the node's agent did not answer"
    return found.text, found.archived


async def test_a_submitted_runs_workers_are_watched_where_slurm_runs_them(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm_cgroups: SlurmCluster,
    tmp_path: Path,
    torch_ok: None,
) -> None:
    cluster = slurm_cgroups
    cluster_id, _ = await hpc_of(db, clock, cluster, tmp_path / "state")
    async with watching_node(db, clock, cluster, cluster_id, tmp_path / "agent") as service:
        clock.moment = datetime.now(UTC)
        spec = ddp_spec("ddp", "--steps", "40", "--sleep", "0.25") | {"memory_bytes": 900 * MB}
        await submit(client, tenancy.member_token, spec)
        job = await submitted_job(db, clock, cluster_id, "ddp")
        await import_until(db, clock, cluster_id, job, "Running")
        run = await run_of(db, job)
        first, second = await workers_of(db, run)
        # placed on the node, each with the GPU Slurm bound its task to
        assert (first.gpu_ids, second.gpu_ids) == ([0], [1])
        assert first.machine_id is not None and first.machine_id == second.machine_id

        # while it trains, its log is the task's, as its node's agent copies it
        await until_printed(service, first, "rank 0 of 2: joined at")
        done = await wait_for(cluster, job, "COMPLETED", within=120)
        await import_until(db, clock, cluster_id, job, "Completed")

        # its end: the log archived on the node, served as any worker's
        await until_archived(service, first)
        text, _ = await tail(service, first, 5)
        assert "rank 0: done" in text
        second_text, _ = await tail(service, second)
        assert "rank 1 of 2: joined at" in second_text
        assert "rank 0" not in second_text  # each worker its own task's log

    # measured in the group Slurm put each task in, and on its own GPU
    for worker, gpu in ((first, 0), (second, 1)):
        busy = await samples(db, worker.id, "task_gpu_utilization_ratio")
        assert busy and {g for g, _ in busy} == {gpu}
        assert max(v for _, v in busy) == 0.95  # simulated: busy while its steps move
        memory = await samples(db, worker.id, "task_memory_used_bytes")
        assert memory and max(v for _, v in memory) > 50 * MB  # a Python with torch in it
        limits = await samples(db, worker.id, "task_memory_limit_bytes")
        assert {v for _, v in limits} == {2 * 900 * MB}  # --mem-per-cpu: the job's, shared
        assert await samples(db, worker.id, "task_cpu_usage_cores")
    async with db.read() as session:
        stepped = await session.scalar(select(Worker.progress_step).where(Worker.id == first.id))
    assert stepped == 39  # its progress file, read as it wrote it

    # the ledger: held from Slurm's start to its end, productive while its GPUs were busy
    run = await run_of(db, job)
    start, end = max(utc(done["start"]), run.created_at), max(utc(done["end"]), run.created_at)
    await tick_after(db, clock, end)
    found = await ledger(db, "run", run.id)
    held = round((end - start).total_seconds() * 2, 3)
    assert found.get(("productive", True), 0) > 0
    assert round(found.get(("productive", True), 0) + found.get(("idle", True), 0), 3) == held
    assert {k for k in found if k[1]} <= {("productive", True), ("idle", True)}


async def _eventually(what: str, check: object, within: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"waited for {what}"
        await asyncio.sleep(0.5)


async def test_an_imported_jobs_part_on_the_node_is_watched_its_output_its_log(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm_cgroups: SlurmCluster,
    tmp_path: Path,
) -> None:
    cluster = slurm_cgroups
    cluster_id, account = await hpc_of(db, clock, cluster)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\necho starting on $SLURMD_NODENAME\n"
        "for i in $(seq 1 16); do echo tick $i; sleep 0.5; done\necho giving up\nexit 3\n"
    )
    async with watching_node(db, clock, cluster, cluster_id, tmp_path / "agent") as service:
        clock.moment = datetime.now(UTC)
        job = cluster.sbatch(
            "-A", account, "--gres=gpu:1", "--mem=300M", "-o", str(tmp_path / "out-%j"), str(script)
        )
        await import_until(db, clock, cluster_id, job, "Running")
        run = await run_of(db, job)
        (worker,) = await workers_of(db, run)
        assert len(worker.gpu_ids) == 1  # the GPU Slurm gave it (squeue's gres index)

        await until_printed(service, worker, "tick 2")  # the job's output, as it prints
        done = await wait_for(cluster, job, "FAILED", within=60)
        await import_until(db, clock, cluster_id, job, "Failed")

        await until_archived(service, worker)
        text, _ = await tail(service, worker, 2)
        assert text == "tick 16\ngiving up\n"
        first = (await tail(service, worker, 100))[0].splitlines()[0]
        assert first == f"starting on {cluster.node}"

        # Slurm's records of its end hold no output: its node's agent sends its last lines
        async def snapshot() -> str:
            (ended,) = await workers_of(db, run)
            return str((ended.last_failure or {}).get("log_tail") or "")

        await _eventually("the failure snapshot's lines", snapshot)
        (ended,) = await workers_of(db, run)
        assert ended.last_failure is not None
        assert ended.last_failure["reason"] == "Exited with code 3"
        assert ended.last_failure["log_tail"].endswith("tick 15\ntick 16\ngiving up\n")

    # the job's group on the node: its memory, its limit (--mem), its CPU; its GPU idle
    assert {v for _, v in await samples(db, worker.id, "task_memory_limit_bytes")} == {300 * MB}
    assert await samples(db, worker.id, "task_memory_used_bytes")
    assert await samples(db, worker.id, "task_cpu_usage_cores")
    busy = await samples(db, worker.id, "task_gpu_utilization_ratio")
    assert busy and {g for g, _ in busy} == set(worker.gpu_ids) and {v for _, v in busy} == {0.0}
    start, end = utc(done["start"]), utc(done["end"])
    await tick_after(db, clock, end)
    held = round((end - start).total_seconds(), 3)
    found = await ledger(db, "run", run.id)
    assert found.pop(("idle", True)) == held  # held all along, its GPU never busy
    assert set(found) <= {("waiting", False)}


# What a job does to its run's folder, which its user may write: its progress file a link to a
# file of root's holding a step, its log's folder a link to a folder holding a copy of it.
SLY = """
run=$(dirname "$ASTRAEUS_PROGRESS_FILE")
ln -sf "$SECRET" "$ASTRAEUS_PROGRESS_FILE"
mkdir "$run/elsewhere" && cp "$SECRET" "$run/elsewhere/current.log"
mv "$run/logs/$ASTRAEUS_WORKER" "$run/logs/moved"
ln -s "$run/elsewhere" "$run/logs/$ASTRAEUS_WORKER"
sleep 6
"""


async def test_a_job_cannot_lead_its_nodes_agent_to_another_file(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm_cgroups: SlurmCluster,
    tmp_path: Path,
) -> None:
    cluster = slurm_cgroups
    secret = tmp_path / "secret"
    secret.write_text("4242 astm_the-agents-own-credential\n")
    secret.chmod(0o600)
    cluster_id, _ = await hpc_of(db, clock, cluster, tmp_path / "state")
    async with watching_node(db, clock, cluster, cluster_id, tmp_path / "agent") as service:
        clock.moment = datetime.now(UTC)
        spec = {
            "name": "sly",
            "cluster": "hpc",
            "gpus": 1,
            "command": ["bash", "-c", SLY],
            "environment": {"SECRET": str(secret)},
        }
        await submit(client, tenancy.member_token, spec)
        job = await submitted_job(db, clock, cluster_id, "sly")
        await import_until(db, clock, cluster_id, job, "Running")
        (worker,) = await workers_of(db, await run_of(db, job))
        await wait_for(cluster, job, "COMPLETED", within=60)
        await import_until(db, clock, cluster_id, job, "Completed")

        await until_archived(service, worker)
        text, _ = await tail(service, worker)
    assert "astm_" not in text
    async with db.read() as session:
        stepped = await session.scalar(select(Worker.progress_step).where(Worker.id == worker.id))
    assert stepped is None  # its progress file was a link: never read


async def test_an_imported_job_whose_output_stops_is_stalled_from_its_last_line(  # seed G-6
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm_cgroups: SlurmCluster,
    tmp_path: Path,
) -> None:
    """Issue 25. The cluster's stall timeout for imported jobs (--stall-timeout): the
    job's output, copied by its node's agent, is its progress; quiet for the timeout, it is
    stalled from its last line, counted so until it prints again, and Slurm keeps it running.
    Issue 38 F6: its last line is dated when the job wrote it, not when the agent, whose watch
    began after it, first copied it; and it resumes reading as a Slurm job's worker reads."""
    cluster = slurm_cgroups
    cluster_id, account = await hpc_of(db, clock, cluster, stall_timeout="5s")
    script = tmp_path / "quiet.sh"
    script.write_text(
        "#!/bin/bash\nfor i in 1 2 3; do echo step $i; sleep 0.5; done\nsleep 20\n"
        "echo step 4\nsleep 2\n"
    )
    output = tmp_path / "out"
    async with watching_node(db, clock, cluster, cluster_id, tmp_path / "agent"):
        clock.moment = datetime.now(UTC)
        job = cluster.sbatch("-A", account, "--gres=gpu:1", "-o", str(output), str(script))
        # its three lines written before the import places it (and the agent watches it)
        await _eventually("its third line", _printed(output, "step 3"))
        await asyncio.sleep(0.5)
        last_line = datetime.fromtimestamp(output.stat().st_mtime, UTC)
        await import_until(db, clock, cluster_id, job, "Running")
        run = await run_of(db, job)
        (worker,) = await workers_of(db, run)

        async def spoke() -> bool:
            (now,) = await workers_of(db, run)
            return now.progress_at is not None

        await _eventually("its output as progress", spoke)
        await asyncio.sleep(6)  # its output stopped a timeout ago
        clock.moment = datetime.now(UTC)
        # (stalls are found as of the import's last read: issue 38 F3)
        assert (await importer.import_cluster(db, clock, cluster_id)).error is None
        async with db.transaction() as session:
            await lifecycle.check_timers(session, clock)
        (stalled,) = await workers_of(db, run)
        assert stalled.stalled_since is not None and stalled.progress_at is not None
        assert stalled.stalled_since == stalled.progress_at  # from its last line
        # (to the millisecond of the file's last write, not the agent's first copy, seconds on)
        assert abs((stalled.stalled_since - last_line).total_seconds()) < 0.01
        assert (stalled.state, stalled.reason) == ("Running", "Stalled: no progress for 5s")

        async def resumed() -> bool:
            (now,) = await workers_of(db, run)
            return now.stalled_since is None

        await _eventually("its fourth line, stalled no more", resumed)
        (again,) = await workers_of(db, run)
        assert (again.state, again.reason) == ("Running", f"Running in Slurm job {job}")
        done = await wait_for(cluster, job, "COMPLETED", within=60)
        await import_until(db, clock, cluster_id, job, "Completed")

    start, end = utc(done["start"]), utc(done["end"])
    steps = [(at, phase) for at, _, phase, _ in await history(db, worker)]
    (stalled_at,) = [at for at, phase in steps if phase == "stalled"]
    (resumed_at,) = [at for at, phase in steps if phase == "running" and at > stalled_at]
    assert stalled_at == stalled.stalled_since
    await tick_after(db, clock, end)
    found = await ledger(db, "run", run.id)
    assert found.pop(("stalled", True)) == round((resumed_at - stalled_at).total_seconds(), 3)
    idle = (stalled_at - start) + (end - resumed_at)
    assert found.pop(("idle", True)) == round(idle.total_seconds(), 3)
    assert set(found) <= {("waiting", False)}


def _printed(path: Path, line: str) -> object:
    def printed() -> bool:
        return path.exists() and line in path.read_text()

    async def check() -> bool:
        return await asyncio.to_thread(printed)

    return check


async def test_a_submitted_run_that_stalls_is_queued_again_by_slurm_then_given_up(  # seed G-7
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm_cgroups: SlurmCluster,
    tmp_path: Path,
) -> None:
    """Issue 25. on_stall: restart on Slurm: its job is queued again (scontrol requeue, to begin
    after the restart's wait) and runs again as a new attempt; stalled again with its restarts
    spent, it is cancelled and the run fails saying so. The stall is counted stalled, held
    while it runs, not held while it waits to run again."""
    cluster = slurm_cgroups
    cluster_id, _ = await hpc_of(db, clock, cluster, tmp_path / "state")
    spec = {
        "name": "hang",
        "cluster": "hpc",
        "gpus": 1,
        "command": ["bash", "-c", "echo step 1; sleep 120"],
        "stall_timeout": "5s",
        "max_restarts": 1,
    }
    node = cluster.node
    said = {
        1: f"Restarting in 10s (1/1): Worker hang-0 stalled on {node}: no progress for 5s",
        2: "Retry budget exhausted after 1/1 restarts",
    }
    async with watching_node(db, clock, cluster, cluster_id, tmp_path / "agent"):
        clock.moment = datetime.now(UTC)
        await submit(client, tenancy.member_token, spec)
        job = await submitted_job(db, clock, cluster_id, "hang")
        for attempt in (1, 2):
            await import_until(db, clock, cluster_id, job, "Running", within=120)
            run = await run_of(db, job)
            assert run.attempt == attempt

            async def spoke(run: Run = run) -> bool:
                (now,) = await workers_of(db, run)
                return now.progress_at is not None

            await _eventually("its one line as progress", spoke)
            await asyncio.sleep(6)  # quiet for the stall timeout
            clock.moment = datetime.now(UTC)
            assert (await importer.import_cluster(db, clock, cluster_id)).error is None
            async with db.transaction() as session:
                await lifecycle.check_timers(session, clock)
            assert (await run_of(db, job)).reason == said[attempt]
            clock.moment = datetime.now(UTC)
            await importer.import_cluster(db, clock, cluster_id)  # Slurm is asked
        await wait_for(cluster, job, "CANCELLED", within=60)
        await import_until(db, clock, cluster_id, job, "Failed")

    run = await run_of(db, job)
    assert (run.reason, run.cause, run.attempt) == (said[2], "retry_budget", 2)
    (worker,) = await workers_of(db, run)
    steps = await history(db, worker)
    phases = [phase for _, _, phase, _ in steps]
    assert phases == [
        *("waiting", "running", "stalled", "requeued:stall"),  # its first instance
        *("restart", "running", "stalled", "ended"),  # its second
    ]
    await tick_after(db, clock, run.ended_at or clock.now())
    # each phase's time in its category, to the second: its GPU idle while it ran (it says
    # nothing of it), stalled from its last line (held) and while queued again (not held)
    category = {
        "waiting": ("waiting", False),
        "running": ("idle", True),
        "stalled": ("stalled", True),
        "requeued:stall": ("stalled", False),
        "restart": ("restart", True),
    }
    expected: dict[tuple[str, bool], float] = {}
    for (at, _, phase, _), (until, *_) in itertools.pairwise(steps):
        key = category[phase]
        expected[key] = expected.get(key, 0) + (until - at).total_seconds()
    found = await ledger(db, "run", run.id)
    assert found == {k: round(v, 3) for k, v in expected.items() if round(v, 3)}
