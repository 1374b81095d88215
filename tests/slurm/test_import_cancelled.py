"""Jobs cancelled before they ran (issue 38 F4), against a real one-node Slurm
(tests/support/slurm.py): a job cancelled while held, and one cancelled before its BeginTime,
submitted and cancelled between two imports, are never in accounting's window (it lists jobs
by when they were eligible: never, for these) nor seen in the queue. Each is imported Stopped,
having held nothing, its wait counted from its submission to its cancel as Slurm dates them
(as for a job the import saw pending), and a later job still imports."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from backend.db import Database
from backend.slurm import service as importer
from tests.support import FakeClock, Tenancy
from tests.support.slurm import (
    SlurmCluster,
    assert_equals_sacct,
    history,
    hpc,
    import_until,
    ledger,
    run_of,
    slurm_of,
    tick_after,
    utc,
    workers_of,
)
from tests.support.slurm import marks as slurm_marks

pytestmark = slurm_marks()


def by_id(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """The job as sacct has it when asked by its id (the day's listing never has it)."""
    line = cluster.run(
        "sacct", "-X", "-P", "-n", "-j", job_id, "-o", "State,Submit,Start,End,NodeList"
    ).strip()
    if not line:
        return {"state": ""}
    state, submit, start, end, nodes = line.split("|")
    return {"state": state, "submit": submit, "start": start, "end": end, "nodes": nodes}


async def cancelled_by_id(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    deadline = asyncio.get_running_loop().time() + 30
    while not (found := by_id(cluster, job_id))["state"].startswith("CANCELLED"):
        assert asyncio.get_running_loop().time() < deadline, found
        await asyncio.sleep(0.3)
    return found


async def test_jobs_cancelled_while_held_or_before_their_begin_time_are_imported(  # issue 38 F4
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    clock.moment = datetime.now(UTC)
    assert (await importer.import_cluster(db, clock, cluster_id)).error is None

    # submitted and cancelled between two imports: never in the queue an import read
    job = ("-A", alpha, "--gres=gpu:1", "--wrap", "sleep 30")
    held = slurm.sbatch("-H", "-J", "held", *job)
    later = slurm.sbatch("--begin=now+1hour", "-J", "later", *job)
    await asyncio.sleep(1.1)  # (a wait of a second at least: sacct dates to the second)
    slurm.run("scancel", held, later)
    for cancelled in (held, later):
        found = await cancelled_by_id(slurm, cancelled)
        assert found["nodes"] == "None assigned", found  # (its start: None, then the cancel)
    after = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "after", "--wrap", "true")
    await import_until(db, clock, cluster_id, after, "Completed")
    clock.moment = datetime.now(UTC)
    assert (await importer.import_cluster(db, clock, cluster_id)).error is None

    for cancelled, name in ((held, "held"), (later, "later")):
        run = await run_of(db, cancelled)
        assert (run.state, run.reason) == ("Stopped", "Stopped: cancelled in Slurm")
        assert run.started_at is None and run.attempt == 0
        found = by_id(slurm, cancelled)
        submit, end = utc(found["submit"]), utc(found["end"])
        (worker,) = await workers_of(db, run)
        # as asked (slurmdbd may not have it), and who cancelled it (issue 38)
        assert (run.name, worker.gpus) == (f"{name}-{cancelled}", 1)
        assert (await slurm_of(db, run)).cancelled_by == "root"
        assert await history(db, worker) == [
            (submit, "Pending", "waiting", 0),
            (end, "Stopped", "ended", 0),
        ]
        await tick_after(db, clock, end)
        waited = (end - submit).total_seconds()
        assert waited >= 1
        assert await ledger(db, "run", run.id) == {("waiting", False): waited}


async def test_jobs_cancelled_the_moment_they_are_submitted_ask_what_they_asked(  # issue 38 F4
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    """slurmdbd, told of a cancel before the job's start record, often has the job named
    "allocation", asking for nothing (about one job in two here): each is imported as it was
    submitted, from the controller's record of it."""
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    clock.moment = datetime.now(UTC)
    assert (await importer.import_cluster(db, clock, cluster_id)).error is None
    jobs = []
    for _ in range(4):
        held = slurm.sbatch("-H", "-J", "at-once", "-A", alpha, "--gres=gpu:2", "--wrap", "true")
        slurm.run("scancel", held)
        jobs.append(held)
    for cancelled in jobs:
        await cancelled_by_id(slurm, cancelled)
    after = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "after", "--wrap", "true")
    await import_until(db, clock, cluster_id, after, "Completed")
    for cancelled in jobs:
        run = await run_of(db, cancelled)
        (worker,) = await workers_of(db, run)
        assert (run.name, run.state, worker.gpus) == (f"at-once-{cancelled}", "Stopped", 2)


async def test_jobs_that_ran_or_were_cancelled_while_slurmdbd_was_down_are_imported(  # 38
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    """slurmdbd down: accounting cannot be read, which is the import's error (never "no
    jobs"), and nothing is lost: once it is back (slurmctld sends what it kept), a job that ran
    and one cancelled while held meanwhile are imported, equal to sacct."""
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    clock.moment = datetime.now(UTC)
    assert (await importer.import_cluster(db, clock, cluster_id)).error is None
    slurm.stop_accounting()
    try:
        ran = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "ran", "--wrap", "sleep 1")
        held = slurm.sbatch("-H", "-A", alpha, "--gres=gpu:1", "-J", "held", "--wrap", "true")
        await asyncio.sleep(1.1)
        slurm.run("scancel", held)
        await asyncio.sleep(3)  # (ran has ended: the queue no longer runs it)
        clock.moment = datetime.now(UTC)
        failed = await importer.import_cluster(db, clock, cluster_id)
        assert failed.error is not None and failed.error.startswith("sacct exited with 1"), failed
    finally:
        slurm.start_accounting()
    await import_until(db, clock, cluster_id, ran, "Completed")
    await import_until(db, clock, cluster_id, held, "Stopped")
    await tick_after(db, clock, datetime.now(UTC))
    await assert_equals_sacct(db, slurm, ran, 1)
    run = await run_of(db, held)
    found = by_id(slurm, held)
    submit, end = utc(found["submit"]), utc(found["end"])
    assert (run.state, run.started_at, run.created_at) == ("Stopped", None, submit)
    assert await ledger(db, "run", run.id) == {("waiting", False): (end - submit).total_seconds()}
