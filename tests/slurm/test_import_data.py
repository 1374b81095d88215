"""What a real site's Slurm gives the import (issue 38, F1, F2, F7), against a real one-node
Slurm (tests/support/slurm.py): an array with pending tasks is one run per task that exists,
each equal to sacct's task; a `|` in a job's name or a node's drain reason imports; a record
that cannot be read is set aside, the rest imported; a failing squeue or sacct is the import's
error, never "no jobs"."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from backend.db import Database
from backend.models import Machine, Run
from backend.organizations import service as organizations
from backend.slurm import service as importer
from backend.slurm.jobs import NOT_A_JOB
from backend.slurm.rules import SlurmJob
from backend.slurm.service import ImportResult, Snapshot
from tests.support import FakeClock, Tenancy
from tests.support.slurm import (
    SlurmCluster,
    assert_equals_sacct,
    hpc,
    run_of,
    sacct,
    slurm_of,
    tick_after,
    utc,
    wait_for,
)
from tests.support.slurm import marks as slurm_marks

pytestmark = slurm_marks()


async def imported(db: Database, clock: FakeClock, cluster_id: int) -> ImportResult:
    clock.moment = datetime.now(UTC)
    return await importer.import_cluster(db, clock, cluster_id)


async def job_ids(db: Database, cluster_id: int) -> dict[str, tuple[str, str]]:
    """Each imported job's run: its name and state."""
    async with db.read() as session:
        rows = await session.execute(
            select(Run.external_id, Run.name, Run.state).where(Run.cluster_id == cluster_id)
        )
        return {str(job): (name, state) for job, name, state in rows.all()}


async def test_a_pending_array_is_a_run_per_task_each_equal_to_sacct(  # issue 38 F1
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    """Before: the pending tasks' record ("4_[2-8%1]") became two runs that match no task, and
    asking sacct for it ("sacct: fatal: Bad job array element specified") stopped every import
    after. Now each task is a run once it is a job of its own (not before: accounting lists a
    pending range as one record, which no task's history matches), with its array's id in its
    name: two arrays of one name never collide."""
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    gres = ("-A", alpha, "--gres=gpu:1", "-J", "sweep", "--wrap", "sleep 1")
    first = slurm.sbatch("--array=1-8%2", *gres)
    second = slurm.sbatch("--array=1-2", *gres)
    tasks = {f"{first}_{k}" for k in range(1, 9)} | {f"{second}_{k}" for k in (1, 2)}

    pending_seen = False
    deadline = asyncio.get_running_loop().time() + 120
    while True:  # imported each second while tasks wait and run, as the import actor does
        result = await imported(db, clock, cluster_id)
        assert result.error is None, result.error
        runs = await job_ids(db, cluster_id)
        assert set(runs) <= tasks, f"not a task: {set(runs) - tasks}"
        pending_seen |= len(runs) < len(tasks)
        if len(runs) == len(tasks) and all(s == "Completed" for _, s in runs.values()):
            break
        assert asyncio.get_running_loop().time() < deadline, runs
        await asyncio.sleep(1.0)
    assert pending_seen  # (the import did see the array with tasks still pending)
    assert {name for name, _ in runs.values()} == {
        f"sweep-{job.replace('_', '-')}" for job in tasks
    }

    await tick_after(db, clock, max(utc(sacct(slurm, task)["end"]) for task in tasks))
    for task in sorted(tasks):
        await assert_equals_sacct(db, slurm, task, gpus=1)


async def test_a_bar_in_a_job_name_or_a_drain_reason_imports(  # issue 38 F2
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    """Before: `sacct -P` and `sinfo` split on "|": a job named a|b, or a node drained with
    the reason a|b, stopped every import ("sacct printed 17 fields, not 16")."""
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    job = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "a|b", "--wrap", "sleep 10")
    await wait_for(slurm, job, "RUNNING")
    assert (await imported(db, clock, cluster_id)).error is None
    assert (await run_of(db, job)).state == "Running"
    done = await wait_for(slurm, job, "COMPLETED")
    assert (await imported(db, clock, cluster_id)).error is None
    run = await run_of(db, job)
    assert run.name == f"a-b-{job}" and (await slurm_of(db, run)).job_name == "a|b"
    assert "slurm" not in run.spec  # (the Slurm job is kept apart from the run's spec)
    await tick_after(db, clock, utc(done["end"]))
    await assert_equals_sacct(db, slurm, job, gpus=1)

    slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=drain", "reason=a|b c")
    try:
        assert (await imported(db, clock, cluster_id)).error is None
        async with db.read() as session:
            node = await session.scalar(select(Machine).where(Machine.cluster_id == cluster_id))
        assert node is not None
        assert (node.state, node.reason) == ("draining", "Slurm: drained (a|b c)")
    finally:
        slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume")

    later = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "later", "--wrap", "true")
    ended = await wait_for(slurm, later, "COMPLETED")
    result = await imported(db, clock, cluster_id)
    assert (result.error, result.created, result.quarantined) == (None, 1, {})
    await tick_after(db, clock, utc(ended["end"]))
    await assert_equals_sacct(db, slurm, later, gpus=1)


def commands_folder(tmp_path: Path) -> Path:
    """A folder of the cluster's commands (SlurmSettings.bin): Slurm's own, until a test puts
    a broken one in its place."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("sacct", "sinfo", "squeue", "sbatch", "scancel", "scontrol"):
        found = shutil.which(name)
        assert found is not None
        (folder / name).symlink_to(found)
    return folder


def replace(folder: Path, name: str, script: str | None) -> None:
    """The command replaced by a shell script (None: Slurm's own again)."""
    command = folder / name
    command.unlink()
    if script is None:
        found = shutil.which(name)
        assert found is not None
        command.symlink_to(found)
        return
    command.write_text("#!/bin/sh\n" + script)
    command.chmod(0o755)


async def test_a_failing_squeue_or_sacct_is_the_imports_error_not_no_jobs(  # issue 38 F7
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
    tmp_path: Path,
) -> None:
    alpha, _ = slurm_accounts
    folder = commands_folder(tmp_path)
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"}, bin=str(folder))
    job = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "long", "--wrap", "sleep 60")
    await wait_for(slurm, job, "RUNNING")
    assert (await imported(db, clock, cluster_id)).error is None
    assert (await run_of(db, job)).state == "Running"

    async def error_shown() -> str | None:
        result = await imported(db, clock, cluster_id)
        async with db.read() as session:
            org = await organizations.organization_by_name(session, "default")
            found = await importer.status(session, org.id, "hpc")
        assert found.error == result.error
        assert (await run_of(db, job)).state == "Running"  # nothing read as ended
        return result.error

    said = "squeue: error: Unable to contact slurm controller (connect failure)"
    replace(folder, "squeue", f"echo '{said}' >&2\nexit 1\n")
    assert await error_shown() == f"squeue exited with 1: {said}"
    errors = '{"meta": {}, "errors": [{"error_number": 1, "description": "Invalid user"}], '
    replace(folder, "squeue", f"""echo '{errors}"jobs": []}}'\n""")
    assert await error_shown() == "squeue failed: Invalid user"
    replace(folder, "squeue", "echo '{\"errors\": []'\n")
    assert (await error_shown() or "").startswith("squeue --json printed what is not JSON")
    replace(folder, "squeue", None)
    replace(folder, "sacct", f"""echo '{errors}"jobs": []}}'\n""")
    assert await error_shown() == "sacct failed: Invalid user"
    replace(folder, "sacct", None)

    # A node sinfo lists that cannot be read is set aside, shown, and the rest imported.
    real = shutil.which("sinfo")
    replace(
        folder,
        "sinfo",
        f'{real} "$@" | python3 -c \'import json, sys; d = json.load(sys.stdin); '
        'd["nodes"].append({"name": "odd", "cpus": "many"}); print(json.dumps(d))\'\n',
    )
    slurm.run("scancel", job)
    await wait_for(slurm, job, "CANCELLED")
    result = await imported(db, clock, cluster_id)
    assert (result.error, result.quarantined) == (None, {"node odd": "not a number: 'many'"})
    async with db.read() as session:
        org = await organizations.organization_by_name(session, "default")
        assert (await importer.status(session, org.id, "hpc")).quarantined == result.quarantined
        nodes = await session.scalars(select(Machine.name).where(Machine.cluster_id == cluster_id))
        assert list(nodes) == [slurm.node]
    assert (await run_of(db, job)).state == "Stopped"


async def test_a_heterogeneous_jobs_parts_are_runs_as_sacct_names_them(  # issue 38 F1
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
    tmp_path: Path,
) -> None:
    """Before: squeue's parts of a heterogeneous job were named by their own ids (job 7's
    second part "8") where sacct names them "7+1": runs that no accounting record ends. (Its
    two parts never fit this one node together: they wait, and are cancelled.)"""
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    script = tmp_path / "het.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -A {alpha} -n1\n#SBATCH hetjob\n#SBATCH -n1\ntrue\n")
    job = slurm.sbatch(str(script))
    parts = {f"{job}+0", f"{job}+1"}
    assert (await imported(db, clock, cluster_id)).error is None
    assert {j: s for j, (_, s) in (await job_ids(db, cluster_id)).items()} == {
        part: "Pending" for part in parts
    }
    slurm.run("scancel", job)
    await wait_for(slurm, f"{job}+1", "CANCELLED")
    assert (await imported(db, clock, cluster_id)).error is None
    assert {j: s for j, (_, s) in (await job_ids(db, cluster_id)).items()} == {
        part: "Stopped" for part in parts
    }


async def test_runs_an_earlier_import_made_of_pending_tasks_are_stopped(  # issue 38 F1
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    """A site upgraded with the runs the version before issue 38 made of an array's pending
    tasks (job 4 and "4_[2-3%1]"): they stop, as no Slurm job, and the import goes on (it
    asked sacct for "4_[2-3%1]" at every import, and failed: "Bad job array element")."""
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    array = slurm.sbatch("--array=1-3%1", "-A", alpha, "-J", "old", "--wrap", "true")
    clock.moment = datetime.now(UTC)
    pending = SlurmJob(array, "old", alpha, "gpu", "root", "PENDING", clock.now())
    earlier = [pending, dataclasses.replace(pending, job_id=f"{array}_[2-3%1]")]
    before = Snapshot(clock.now(), [], earlier)
    await db.unit(lambda s: importer.apply(s, clock, cluster_id, before))
    tasks = {f"{array}_{k}" for k in (1, 2, 3)}
    deadline = asyncio.get_running_loop().time() + 90
    while True:
        result = await imported(db, clock, cluster_id)
        assert result.error is None, result.error
        runs = await job_ids(db, cluster_id)
        if all(runs.get(task, ("", ""))[1] == "Completed" for task in tasks):
            break
        assert asyncio.get_running_loop().time() < deadline, runs
        await asyncio.sleep(1.0)
    assert {job: state for job, (_, state) in runs.items() if job not in tasks} == {
        job.job_id: "Stopped" for job in earlier
    }
    for job in earlier:
        assert (await run_of(db, job.job_id)).reason == NOT_A_JOB
