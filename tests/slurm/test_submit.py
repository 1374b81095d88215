"""Astraeus on Slurm (issue 25): a run submitted to a Slurm-backed cluster becomes one Slurm job
whose tasks are its workers (srun; agent.slurm_task on each node gives them torchrun's
environment and keeps their logs and ends), against a real one-node Slurm with two GPUs. An
unmodified PyTorch DDP (gloo) script trains as a two-worker gang and completes; one whose rank
fails shows that rank as the first failure, with its snapshot; the ledgers are to the second."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import select

from backend.cli.astra.workdir import pack
from backend.db import Database
from backend.ids import Kind
from backend.models import Run
from backend.organizations import service as organizations
from backend.slurm import service as importer
from tests.support import FakeClock, Tenancy
from tests.support.api import CREATE, graphql
from tests.support.ids import shown
from tests.support.slurm import (
    SlurmCluster,
    ddp_spec,
    history,
    hpc,
    import_until,
    ledger,
    run_history,
    run_of,
    run_of_name,
    sacct,
    submit,
    submitted_job,
    tick_after,
    utc,
    wait_for,
    workers_of,
)
from tests.support.slurm import (
    marks as slurm_marks,
)

pytestmark = slurm_marks()


async def test_a_two_worker_ddp_run_is_one_slurm_job_and_completes(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
    tmp_path: Path,
    torch_ok: None,
) -> None:
    alpha, _ = slurm_accounts
    state = tmp_path / "state"
    cluster_id = await hpc(
        db, clock, slurm, {alpha: "default"}, state_dir=str(state), python=sys.executable
    )
    clock.moment = datetime.now(UTC)
    await submit(client, tenancy.member_token, ddp_spec("ddp"))
    job = await submitted_job(db, clock, cluster_id, "ddp")
    line = slurm.run("squeue", "-h", "-j", job, "-o", "%j|%a|%D|%C|%b").strip()
    assert line.startswith(f"ddp|{alpha}|1|2|"), line  # one job: both workers, one node
    done = await wait_for(slurm, job, "COMPLETED", within=120)

    clock.moment = datetime.now(UTC)
    await importer.import_cluster(db, clock, cluster_id)
    run = await run_of(db, job)
    assert (run.state, run.reason) == ("Completed", "2 of 2 workers completed")
    workers = await workers_of(db, run)
    assert [(w.name, w.state, w.exit_code, w.reason) for w in workers] == [
        ("ddp-0", "Completed", 0, "Exited with code 0"),
        ("ddp-1", "Completed", 0, "Exited with code 0"),
    ]
    # Slurm's times are whole seconds; the run was created here within the one it started in
    start, end = max(utc(done["start"]), run.created_at), max(utc(done["end"]), run.created_at)
    for w in workers:
        steps = [(state, phase, held) for _, state, phase, held in await history(db, w)]
        assert steps == [
            ("Pending", "waiting", 0),
            ("Running", "running", 1),
            ("Completed", "ended", 0),
        ]
        assert [at for at, *_ in await history(db, w)][1:] == [start, end]
    # Each worker's log is on its node as the agent keeps logs: the DDP ranks met. The run's
    # folder, and its job's comment, name it by its shown id (other Slurm users see both).
    key = await shown(db, Kind.RUN, run.id)
    folder = state / f"run-{key}" / "logs"
    shown_job = slurm.run("scontrol", "show", "job", "-o", job).split()
    assert f"Comment=astraeus-run-{key}" in shown_job and key != str(run.id)
    for rank in (0, 1):
        log = (folder / f"ddp-{rank}" / "current.log").read_text()
        assert f"rank {rank} of 2: joined at {slurm.node}:" in log
        assert f"rank {rank}: done" in log

    await tick_after(db, clock, end)
    held = (end - start).total_seconds() * 2  # two workers of one GPU each
    waited = (start - run.created_at).total_seconds() * 2
    found = await ledger(db, "run", run.id)
    assert found.pop(("idle", True)) == round(held, 3)
    assert found == ({("waiting", False): round(waited, 3)} if round(waited, 3) else {})


async def test_a_run_whose_rank_fails_shows_the_first_failure_and_its_snapshot(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
    tmp_path: Path,
    torch_ok: None,
) -> None:
    alpha, _ = slurm_accounts
    cluster_id = await hpc(
        db,
        clock,
        slurm,
        {alpha: "default"},
        state_dir=str(tmp_path / "state"),
        python=sys.executable,
    )
    clock.moment = datetime.now(UTC)
    await submit(
        client,
        tenancy.member_token,
        ddp_spec("crash", "--steps", "60", "--exit-at", "2", "--exit-rank", "1"),
    )
    job = await submitted_job(db, clock, cluster_id, "crash")
    await wait_for(slurm, job, "FAILED", within=120)
    clock.moment = datetime.now(UTC)
    await importer.import_cluster(db, clock, cluster_id)

    run = await run_of(db, job)
    first, second = await workers_of(db, run)
    assert run.state == "Failed"
    assert run.reason == (
        f"Worker crash-1 failed on {slurm.node}: Exited with code 3; "
        "the gang does not run without it"
    )
    assert run.first_failure is not None
    assert (run.first_failure["worker"], run.first_failure["machine"]) == ("crash-1", slurm.node)
    assert (second.state, second.exit_code) == ("Failed", 3)
    assert second.last_failure is not None
    assert second.last_failure["reason"] == "Exited with code 3"
    assert "rank 1: giving up at step 2" in second.last_failure["log_tail"]
    # rank 0 was ended by Slurm because rank 1 failed (--kill-on-bad-exit)
    assert (first.state, first.reason) == ("Stopped", "Stopping: worker crash-1 failed")


async def test_a_run_of_a_workspace_without_a_slurm_account_waits_saying_so(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
    tmp_path: Path,
) -> None:
    alpha, _ = slurm_accounts
    cluster_id = await hpc(db, clock, slurm, {alpha: "default"}, state_dir=str(tmp_path))
    clock.moment = datetime.now(UTC)
    run = await submit(client, tenancy.other_token, ddp_spec("theirs"))
    assert run["state"] == "Pending"
    await importer.import_cluster(db, clock, cluster_id)
    query = "query($n: String!) { run(name: $n) { state reason } }"
    found = (await graphql(client, tenancy.other_token, query, n="theirs"))["data"]["run"]
    assert found == {
        "state": "Pending",
        "reason": "Waits for a Slurm account: workspace team-b has none on cluster hpc "
        "(astraeus cluster account hpc ACCOUNT --workspace team-b)",
    }
    assert slurm.run("squeue", "-h", "-n", "theirs").strip() == ""

    # An account Slurm refuses: the run says why, and the others are submitted all the same.
    async with db.transaction() as session:
        org = await organizations.organization_by_name(session, "default")
        await importer.map_account(session, clock, org.id, "hpc", "ghost", "team-b")
    await submit(client, tenancy.member_token, ddp_spec("ours") | {"command": ["true"]})
    await importer.import_cluster(db, clock, cluster_id)
    found = (await graphql(client, tenancy.other_token, query, n="theirs"))["data"]["run"]
    assert found["state"] == "Pending"
    assert found["reason"].startswith("Not submitted to Slurm: sbatch exited with 1: ")
    assert "Invalid account" in found["reason"]
    assert (await run_of_name(db, "ours")).external_id is not None

    # What Slurm cannot run (yet) is refused, naming the field.
    spec = ddp_spec("boxed") | {"image": "pytorch/pytorch:2.4"}
    answer = await graphql(client, tenancy.member_token, CREATE, spec=spec)
    errors = answer["data"]["createRun"]["errors"]
    assert {e["field"] for e in errors} == {"image"}
    assert "which Slurm runs" in errors[0]["message"]


async def test_a_submitted_run_stopped_here_is_cancelled_in_slurm(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
    tmp_path: Path,
) -> None:
    alpha, _ = slurm_accounts
    cluster_id = await hpc(
        db, clock, slurm, {alpha: "default"}, state_dir=str(tmp_path), python=sys.executable
    )
    clock.moment = datetime.now(UTC)
    spec = ddp_spec("long") | {"workers": 1, "command": ["sleep", "300"]}
    await submit(client, tenancy.member_token, spec)
    job = await submitted_job(db, clock, cluster_id, "long")
    await wait_for(slurm, job, "RUNNING")
    # another workspace cannot stop it; its own can, and Slurm cancels it
    stop = "mutation($n: String!) { stopRun(name: $n) { run { state reason } errors { code } } }"
    clock.moment = datetime.now(UTC)  # asked now: within the second Slurm then ends it in
    theirs = await graphql(client, tenancy.other_token, stop, n="long")
    assert theirs["data"]["stopRun"]["errors"][0]["code"] == "JOB_NOT_FOUND"
    mine = (await graphql(client, tenancy.member_token, stop, n="long"))["data"]["stopRun"]
    assert mine["run"]["reason"].startswith("Stopping: asked by ")
    await importer.import_cluster(db, clock, cluster_id)
    await wait_for(slurm, job, "CANCELLED")
    clock.moment = datetime.now(UTC)
    await importer.import_cluster(db, clock, cluster_id)
    run = await run_of(db, job)
    assert run.state == "Stopped" and run.reason.startswith("Stopped by ")
    # a stop from here is a stop (issue 38 F5): each worker Stopped as the run, no failure
    # (not "Killed by signal 15", the signal scancel ended its task with)
    (worker,) = await workers_of(db, run)
    assert (worker.state, worker.reason) == ("Stopped", run.reason)
    assert (worker.cause, worker.last_failure, run.first_failure) == (None, None, None)
    # and its history in order: running (Slurm's start), asked to stop (its row, written while
    # the import had not yet read the job running, says Running), then stopped, never before
    # it was asked (Slurm's end is in whole seconds)
    steps = await run_history(db, run)
    assert [(state, reason) for _, state, reason in steps] == [
        ("Pending", "Run created"),
        ("Running", "1 of 1 worker running"),
        ("Running", "Stopping: asked by alice"),
        ("Stopped", "Stopped by alice"),
    ]
    assert [(state, phase) for _, state, phase, _ in await history(db, worker)] == [
        ("Pending", "waiting"),
        ("Running", "running"),
        ("Stopped", "ended"),
    ]
    delete = "mutation($n: String!) { deleteRun(name: $n) { run { state } errors { code } } }"
    deleted = (await graphql(client, tenancy.member_token, delete, n="long"))["data"]
    assert (
        deleted["deleteRun"]["errors"] == [] and deleted["deleteRun"]["run"]["state"] == "Deleted"
    )


async def test_a_stalled_runs_job_that_ended_meanwhile_is_not_run_again(  # issue 25
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
    tmp_path: Path,
) -> None:
    """A run whose stall asked for its job to be queued again, the job ending in Slurm before
    the import asks: Slurm would requeue even a finished job (and run it again), so the import
    asks only of a job it has just read running; this one is recorded as it ended."""
    alpha, _ = slurm_accounts
    cluster_id = await hpc(
        db, clock, slurm, {alpha: "default"}, state_dir=str(tmp_path), python=sys.executable
    )
    clock.moment = datetime.now(UTC)
    spec = ddp_spec("quick") | {"workers": 1, "command": ["sleep", "6"], "stall_timeout": "1m"}
    await submit(client, tenancy.member_token, spec)
    job = await submitted_job(db, clock, cluster_id, "quick")
    await import_until(db, clock, cluster_id, job, "Running")
    async with db.transaction() as session:  # as the lifecycle's stall rule leaves it
        run = await session.scalar(select(Run).where(Run.external_id == job))
        assert run is not None and run.state == "Running"
        run.stop_cause, run.restart_at = "stall", datetime.now(UTC)
    await wait_for(slurm, job, "COMPLETED")
    clock.moment = datetime.now(UTC)
    assert (await importer.import_cluster(db, clock, cluster_id)).error is None
    assert (await run_of(db, job)).state == "Completed"
    assert slurm.run("squeue", "-h", "-j", job, check=False).strip() == ""  # not queued again
    assert sacct(slurm, job)["state"] == "COMPLETED"


AGAIN = """mutation($name: String!, $new: String!) { runAgain(name: $name, newName: $new) {
  run { name spec } errors { code message } } }"""


async def test_run_again_resubmits_a_run_astraeus_submitted_not_one_it_imported(  # issue 38
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
    tmp_path: Path,
) -> None:
    """The Slurm job is kept apart from the run's specification (no "slurm" key in it): Run
    again of a run Astraeus submitted submits its specification to the same cluster as a new
    Slurm job; of a job imported from Slurm (no script of Astraeus's), it says so."""
    alpha, _ = slurm_accounts
    cluster_id = await hpc(
        db, clock, slurm, {alpha: "default"}, state_dir=str(tmp_path), python=sys.executable
    )
    clock.moment = datetime.now(UTC)
    spec = ddp_spec("once") | {"workers": 1, "command": ["true"]}
    await submit(client, tenancy.member_token, spec)
    first = await submitted_job(db, clock, cluster_id, "once")
    await import_until(db, clock, cluster_id, first, "Completed", within=120)

    again = await graphql(client, tenancy.member_token, AGAIN, name="once", new="twice")
    created = again["data"]["runAgain"]
    assert created["errors"] == [] and created["run"]["name"] == "twice"
    assert "slurm" not in created["run"]["spec"]
    second = await submitted_job(db, clock, cluster_id, "twice")
    assert second != first
    await import_until(db, clock, cluster_id, second, "Completed", within=120)
    assert (await run_of(db, second)).name == "twice"

    imported = slurm.sbatch("-A", alpha, "--gres=gpu:1", "-J", "outside", "--wrap", "true")
    await import_until(db, clock, cluster_id, imported, "Completed")
    name = (await run_of(db, imported)).name
    refused = await graphql(client, tenancy.member_token, AGAIN, name=name, new="copy")
    assert refused["data"]["runAgain"]["run"] is None
    assert refused["data"]["runAgain"]["errors"] == [
        {
            "code": "RUN_IMPORTED",
            "message": f"The run '{name}' is Slurm job {imported}, imported: Astraeus has no "
            "script of it to run again; submit it to Slurm again (sbatch).",
        }
    ]
    async with db.read() as session:
        specs = list(await session.scalars(select(Run.spec)))
    assert len(specs) == 3 and not [s for s in specs if "slurm" in s]


async def test_a_run_with_its_code_starts_each_task_in_it_on_the_node(  # issue 41
    db: Database,
    clock: FakeClock,
    tenancy: Tenancy,
    client: httpx.AsyncClient,
    slurm: SlurmCluster,
    slurm_accounts: tuple[str, str],
    tmp_path: Path,
) -> None:
    """`--workdir` on a Slurm cluster: the archive is checked against its digest and unpacked
    into the run's folder, which the nodes read as they read its logs; every task starts there
    (sbatch --chdir), running a train.py no node had."""
    alpha, _ = slurm_accounts
    state = tmp_path / "state"
    cluster_id = await hpc(
        db, clock, slurm, {alpha: "default"}, state_dir=str(state), python=sys.executable
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(
        "import os, pathlib\n"
        "print('rank', os.environ['RANK'], 'in', pathlib.Path.cwd().name, "
        "open('lr.txt').read().strip(), flush=True)\n"
    )
    (project / "lr.txt").write_text("0.001\n")
    packed = pack(project)
    digest = f"sha256:{packed.digest}"
    headers = {"Authorization": f"Bearer {tenancy.member_token}"}
    stored = await client.put(f"/v1/code/{digest}", content=packed.archive, headers=headers)
    assert stored.status_code == 201, stored.text
    clock.moment = datetime.now(UTC)
    spec = {
        "name": "shipped",
        "cluster": "hpc",
        "workers": 2,
        "command": [sys.executable, "train.py"],
        "code": digest,
    }
    await submit(client, tenancy.member_token, spec)
    job = await submitted_job(db, clock, cluster_id, "shipped")
    await wait_for(slurm, job, "COMPLETED", within=120)
    clock.moment = datetime.now(UTC)
    await importer.import_cluster(db, clock, cluster_id)
    run = await run_of(db, job)
    assert run.state == "Completed", run.reason
    key = await shown(db, Kind.RUN, run.id)
    for rank in (0, 1):
        log = (state / f"run-{key}" / "logs" / f"shipped-{rank}" / "current.log").read_text()
        assert f"rank {rank} in code 0.001" in log
