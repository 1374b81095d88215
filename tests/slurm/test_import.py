"""Accounting for jobs Astraeus did not submit (issue 25), against a real one-node Slurm
(tests/support/slurm.py: slurmctld, slurmd and slurmdbd with munge, two GPUs as gres): jobs
submitted with plain `sbatch` appear as runs of the workspace their account is mapped to, with
their history to the second, and the goodput tick counts them into the same ledgers: waiting
while pending (not held), held from start to end on the node, its partition the pool."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from backend.access import service as access
from backend.accounting import counting
from backend.db import Database
from backend.errors import Conflict, NotFound
from backend.models import Machine
from backend.organizations import service as organizations
from backend.runs import service as runs
from backend.scheduling import service as scheduling
from backend.slurm import service as importer
from backend.slurm.commands import SlurmSettings
from backend.slurm.rules import RESTART_GAP
from tests.support import FakeClock, Tenancy
from tests.support.api import gql
from tests.support.slurm import (
    SlurmCluster,
    history,
    hpc,
    ledger,
    run_of,
    slurm_backed,
    slurm_of,
    tick_after,
    utc,
    wait_for,
    workers_of,
)
from tests.support.slurm import marks as slurm_marks

pytestmark = slurm_marks()


async def test_a_job_submitted_with_plain_sbatch_appears_with_its_ledger(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    job = slurm.sbatch("-A", alpha, "--gres=gpu:2", "-J", "train llama", "--wrap", "sleep 2")
    done = await wait_for(slurm, job, "COMPLETED")
    submit, start, end = utc(done["submit"]), utc(done["start"]), utc(done["end"])

    clock.moment = datetime.now(UTC)
    result = await importer.import_cluster(db, clock, cluster_id)
    assert (result.error, result.created) == (None, 1)
    run = await run_of(db, job)
    assert run.name == f"train-llama-{job}" and run.state == "Completed"
    assert run.reason == "1 of 1 worker completed"
    assert (run.created_at, run.started_at, run.ended_at) == (submit, start, end)
    kept = await slurm_of(db, run)  # issue 38: what Slurm says of it, apart from the spec
    assert (kept.job_id, kept.submitted, kept.job_name, kept.account, kept.user) == (
        job,
        False,
        "train llama",
        alpha,
        "root",
    )
    assert (kept.partition, kept.qos, kept.cancelled_by) == ("gpu", "normal", None)
    assert kept.priority is not None and kept.priority > 0 and "slurm" not in run.spec
    (worker,) = await workers_of(db, run)
    assert (worker.name, worker.gpus, worker.state) == (f"{run.name}-0", 2, "Completed")
    assert await history(db, worker) == [
        (submit, "Pending", "waiting", 0),
        (start, "Running", "running", 2),
        (end, "Completed", "ended", 0),
    ]
    async with db.read() as session:
        node = await session.scalar(select(Machine).where(Machine.cluster_id == cluster_id))
    assert node is not None and node.name == slurm.node and node.executor == "slurm"

    # Imported again: nothing changes, nothing is recorded twice.
    again = await importer.import_cluster(db, clock, cluster_id)
    assert (again.created, again.changed) == (0, 0)
    assert len(await history(db, worker)) == 3

    # The tick counts it to the second: the wait not held, the run held (idle: no agent on
    # the node sampled its GPUs), on the node.
    await tick_after(db, clock, end)
    waited, ran = (start - submit).total_seconds() * 2, (end - start).total_seconds() * 2
    expected = {("idle", True): ran} | ({("waiting", False): waited} if waited else {})
    assert await ledger(db, "run", run.id) == expected
    assert await ledger(db, "machine", node.id) == {("idle", True): ran}


async def test_a_failed_job_shows_its_exit_code_and_first_failure(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    job = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "oops", "--wrap", "exit 3")
    done = await wait_for(slurm, job, "FAILED")
    clock.moment = datetime.now(UTC)
    await importer.import_cluster(db, clock, cluster_id)
    run = await run_of(db, job)
    (worker,) = await workers_of(db, run)
    assert run.state == "Failed" and run.cause == "exited"
    assert run.reason == (
        f"Worker {worker.name} failed on {slurm.node}: Exited with code 3; "
        "the gang does not run without it"
    )
    assert run.first_failure is not None and run.first_failure["worker"] == worker.name
    assert worker.exit_code == 3 and worker.last_failure is not None
    assert worker.last_failure["reason"] == "Exited with code 3"
    assert worker.last_failure["exit_code"] == 3
    assert datetime.fromisoformat(worker.last_failure["failed_at"]) == utc(done["end"])


async def test_a_pending_job_shows_slurms_reason_and_its_wait_is_not_held(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    alpha, beta = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default", beta: "team-b"})
    holder = slurm.sbatch("-A", alpha, "--gres=gpu:2", "-J", "holder", "--wrap", "sleep 60")
    await wait_for(slurm, holder, "RUNNING")
    next_job = slurm.sbatch("-A", alpha, "--gres=gpu:2", "-J", "next", "--wrap", "true")
    next_submitted = time.monotonic()
    behind = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "behind", "--wrap", "true")
    other = slurm.sbatch("-A", beta, "--gres=gpu:1", "-J", "theirs", "--wrap", "true")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until slurmctld has weighed them all
        reasons = slurm.run("squeue", "-h", "-t", "PD", "-o", "%i %r").split()
        if "None" not in reasons and len(reasons) == 6:
            break
        await asyncio.sleep(0.3)

    clock.moment = datetime.now(UTC)
    assert (await importer.import_cluster(db, clock, cluster_id)).created == 4
    running, first, second, theirs = [
        await run_of(db, j) for j in (holder, next_job, behind, other)
    ]
    assert (running.state, running.reason) == ("Running", "1 of 1 worker running")
    assert (first.state, first.reason) == (
        "Pending",
        "Waits for resources: next to run in partition gpu",
    )
    assert second.reason == f"Queued behind {first.name}"
    # team-b's job waits behind default's: it is not told which run that is
    assert theirs.workspace_id != second.workspace_id
    assert theirs.reason == "Queued behind a run of another workspace"

    # Astraeus's scheduler never places a Slurm cluster's runs.
    async with db.transaction() as session:
        await scheduling.schedule_all(session, clock)
    assert (await run_of(db, next_job)).state == "Pending"

    # Cancelled while pending: it waited (not held) and never held its GPUs.
    # sacct dates to the second: cancelled in the second it was submitted, it
    # would have waited 0 s and left no row to compare (CI of 51595a9).
    await asyncio.sleep(max(0.0, next_submitted + 1.1 - time.monotonic()))
    slurm.run("scancel", next_job)
    cancelled = await wait_for(slurm, next_job, "CANCELLED")
    clock.moment = datetime.now(UTC)
    assert (await importer.import_cluster(db, clock, cluster_id)).changed >= 1
    first = await run_of(db, next_job)
    assert (first.state, first.reason) == ("Stopped", "Stopped: cancelled in Slurm")
    await tick_after(db, clock, utc(cancelled["end"]))
    waited = (utc(cancelled["end"]) - utc(cancelled["submit"])).total_seconds() * 2
    assert waited >= 2
    assert await ledger(db, "run", first.id) == {("waiting", False): waited}


async def test_an_imported_run_is_slurms_and_is_seen_only_by_its_workspace(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    job = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "mine", "--wrap", "sleep 30")
    await wait_for(slurm, job, "RUNNING")
    clock.moment = datetime.now(UTC)
    await importer.import_cluster(db, clock, cluster_id)
    run = await run_of(db, job)

    query = "query($n: String!) { run(name: $n) { name state reason workers { name } } }"
    mine = await gql(client, tenancy.member_token, query, n=run.name)
    assert mine["data"]["run"]["state"] == "Running"
    theirs = await gql(client, tenancy.other_token, query, n=run.name)
    assert theirs["data"]["run"] is None or theirs.get("errors")
    answer = await client.get(
        f"/jobs/{run.name}", headers={"Authorization": f"Bearer {tenancy.other_token}"}
    )
    assert answer.status_code == 404

    async with db.transaction() as session:
        principal = await access.authenticate(session, tenancy.member_token)
        with pytest.raises(Conflict, match=f"scancel {job}"):
            await runs.stop_run(session, clock, principal, run.name)
        with pytest.raises(Conflict, match="not ended: stop it first"):
            await runs.delete_run(session, clock, principal, run.name, ledger=counting)
    async with db.transaction() as session:
        other = await access.authenticate(session, tenancy.other_token)
        with pytest.raises(NotFound):
            await runs.stop_run(session, clock, other, run.name)
    assert (await run_of(db, job)).state == "Running"


async def test_a_slurm_that_does_not_answer_is_the_imports_error(  # issue 25
    db: Database, clock: FakeClock, tenancy: Tenancy, tmp_path: Path
) -> None:
    options = SlurmSettings(conf=str(tmp_path / "slurm.conf"), timeout_s=2)
    created = await slurm_backed(db, clock, "gone", options)
    # Without its slurm.conf, squeue looks for slurmctld elsewhere and blocks: cut off.
    result = await importer.import_cluster(db, clock, created)
    assert result.error == "squeue did not answer within 2s (is slurmctld or slurmdbd up?)"
    async with db.read() as session:
        org = await organizations.organization_by_name(session, "default")
        found = await importer.status(session, org.id, "gone")
    assert found.error == result.error and found.imported_at is None


async def test_the_admin_commands_create_map_and_import(  # issue 25
    slurm: SlurmCluster, slurm_accounts: tuple[str, str], tmp_path: Path
) -> None:
    """`astraeus cluster create --slurm`, `cluster account`, `cluster import`, `cluster status`
    on an embedded data folder, as an admin types them."""
    alpha, beta = slurm_accounts
    env = {**os.environ, "ASTRAEUS_DATA_DIR": str(tmp_path / "data")}

    def astraeus(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "backend.cli.server", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    astraeus("db", "upgrade")
    astraeus("bootstrap")
    conf = str(slurm.conf)
    out = astraeus(
        "cluster", "create", "hpc", "--slurm", "--slurm-conf", conf, "--stall-timeout", "45m"
    )
    assert "run by Slurm" in out
    astraeus("cluster", "account", "hpc", alpha, "--workspace", "default")
    job = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "cli", "--wrap", "true")
    ignored = slurm.sbatch("-A", beta, "--gres=gpu:1", "-J", "unmapped", "--wrap", "true")
    await wait_for(slurm, job, "COMPLETED")
    await wait_for(slurm, ignored, "COMPLETED")
    out = astraeus("cluster", "import", "hpc")
    assert "1 job of mapped accounts read, 1 new run, 0 changed" in out
    assert f"not imported, their accounts mapped to no workspace: {beta} (1 job)" in out
    status = astraeus("cluster", "status", "hpc")
    assert f"account {alpha} -> workspace default" in status and "last error" not in status
    assert "imported jobs whose output stops for 45m are counted stalled" in status


async def test_a_job_slurm_requeues_waits_again_and_runs_again(  # issue 25, issue 38
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
) -> None:
    """Slurm queues a running job again: the run waits to be placed again (not held), then runs
    another attempt; the ledger counts each instance's time where it went. Counted as Slurm
    says why (issue 38): an administrator's `scontrol requeue` is no one's loss (waiting, not a
    preemption); the same off a draining node is the seed's preemption ("a drain")."""
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"})
    job = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "again", "--wrap", "sleep 300")
    await wait_for(slurm, job, "RUNNING")
    clock.moment = datetime.now(UTC)
    await importer.import_cluster(db, clock, cluster_id)
    assert (await run_of(db, job)).state == "Running"
    node = slurm.node

    async def requeued(drain: bool) -> dict[str, str]:
        if drain:
            slurm.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=maint")
        slurm.run("scontrol", "requeue", job)
        found = await wait_for(slurm, job, "REQUEUED")
        clock.moment = datetime.now(UTC)
        await importer.import_cluster(db, clock, cluster_id)
        if drain:
            slurm.run("scontrol", "update", f"nodename={node}", "state=resume")
        slurm.run("scontrol", "update", f"jobid={job}", "starttime=now")  # not Slurm's 2 min
        await wait_for(slurm, job, "RUNNING")
        return found

    first = await requeued(drain=False)
    run = await run_of(db, job)
    assert (run.state, run.reason) == ("Pending", "Requeued in Slurm (scontrol requeue)")
    (worker,) = await workers_of(db, run)
    assert (worker.phase, worker.restarts, worker.machine_id) == ("requeued:admin", 1, None)
    clock.moment = datetime.now(UTC)
    await importer.import_cluster(db, clock, cluster_id)
    assert (await run_of(db, job)).state == "Running"

    second = await requeued(drain=True)
    run = await run_of(db, job)
    assert (run.state, run.reason) == (
        "Pending",
        f"Requeued in Slurm (scontrol requeue): node {node} is draining",
    )
    slurm.run("scancel", job)
    third = await wait_for(slurm, job, "CANCELLED")
    clock.moment = datetime.now(UTC)
    await importer.import_cluster(db, clock, cluster_id)
    run = await run_of(db, job)
    assert run.state == "Stopped" and run.attempt == 3
    steps = [(state, phase) for _, state, phase, _ in await history(db, worker)]
    assert steps == [
        ("Pending", "waiting"),
        ("Running", "running"),
        ("Pending", "requeued:admin"),
        ("Starting", "restart"),  # placed again by Slurm, running a millisecond after
        ("Running", "running"),
        ("Pending", "requeued:preemption"),
        ("Starting", "restart"),
        ("Running", "running"),
        ("Stopped", "ended"),
    ]

    await tick_after(db, clock, utc(third["end"]))
    submit, start1, end1 = (utc(first[k]) for k in ("submit", "start", "end"))
    start2, end2 = utc(second["start"]), utc(second["end"])
    start3, end3 = utc(third["start"]), utc(third["end"])
    # each restart's gap, but never past its instance's end (one requeued within the second
    # it started held its GPUs for no time)
    gaps = sum(
        min(RESTART_GAP, end - start).total_seconds()
        for start, end in ((start2, end2), (start3, end3))
    )
    ran = end1 - start1 + end2 - start2 + end3 - start3
    expected = {
        ("idle", True): ran.total_seconds() - gaps,
        ("restart", True): gaps,
        ("preemption", False): (start3 - end2).total_seconds(),
        ("waiting", False): (start1 - submit + start2 - end1).total_seconds(),
    }
    assert await ledger(db, "run", run.id) == {k: v for k, v in expected.items() if v}
