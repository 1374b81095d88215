"""A run's Slurm job in GraphQL (issue 38): Run.slurm with its id, partition, account, QOS,
Slurm's priority and who cancelled it; null on any other cluster; nothing of it to another
workspace or organisation; loaded once for a whole list of runs."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import event

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import graphql
from tests.support.slurm_jobs import slurm_run

SLURM = "slurm { jobId submittedHere jobName account user partition qos priority cancelledBy }"
RUN = f"""query($name: String!, $ws: String) {{
  run(name: $name, workspace: $ws) {{ name cluster {SLURM} }}
}}"""
RUNS = f'{{ runs(all: true, workspace: "default") {{ name {SLURM} }} }}'


async def test_a_slurm_run_shows_its_job(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: the job's facts as Slurm says them; its priority past GraphQL's 32-bit Int
    await slurm_run(db, clock, tenancy)
    answer = await graphql(client, tenancy.member_token, RUN, name="llama-sft")
    assert answer == {
        "data": {
            "run": {
                "name": "llama-sft",
                "cluster": "hpc",
                "slurm": {
                    "jobId": "12",
                    "submittedHere": True,
                    "jobName": "llama-sft",
                    "account": "nlp",
                    "user": "alice",
                    "partition": "gpu",
                    "qos": "normal",
                    "priority": 4294901759,
                    "cancelledBy": "root",
                },
            }
        }
    }


async def test_an_imported_job_not_cancelled_without_a_priority(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: imported (not submitted here), never cancelled, Slurm gave no priority
    await slurm_run(db, clock, tenancy, submitted=False, priority=None, cancelled_by=None)
    found = (await graphql(client, tenancy.member_token, RUN, name="llama-sft"))["data"]
    slurm = found["run"]["slurm"]
    assert (slurm["submittedHere"], slurm["priority"], slurm["cancelledBy"]) == (
        False,
        None,
        None,
    )


async def test_a_run_on_another_cluster_has_no_slurm_job(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: the agent's cluster 'local' is not Slurm's
    await World(db, clock, tenancy).submit(name="local-run")
    answer = await graphql(client, tenancy.member_token, RUN, name="local-run")
    assert answer == {"data": {"run": {"name": "local-run", "cluster": "local", "slurm": None}}}


async def test_another_workspace_sees_nothing_of_the_job(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: the job is as private as its run, to a member of another workspace of the
    # organisation and to another organisation's
    await slurm_run(db, clock, tenancy)
    for token in (tenancy.other_token, tenancy.foreign_token):
        for query, variables in ((RUN, {"name": "llama-sft", "ws": "default"}), (RUNS, {})):
            answer = await graphql(client, token, query, **variables)
            data = str(answer.get("data"))
            assert "llama-sft" not in data and "nlp" not in data and "4294901759" not in data, (
                answer
            )


async def test_a_list_of_runs_reads_their_jobs_in_a_fixed_number_of_statements(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: the jobs of a list of runs through one loader, never one run at a time
    async def statements() -> tuple[int, Any]:
        seen: list[str] = []

        def count(*args: Any) -> None:
            seen.append(args[2])

        event.listen(db.engine.sync_engine, "before_cursor_execute", count)
        try:
            answer = await graphql(client, tenancy.member_token, RUNS)
        finally:
            event.remove(db.engine.sync_engine, "before_cursor_execute", count)
        assert "errors" not in answer
        selects = [s for s in seen if s.lstrip().upper().startswith("SELECT")]
        return len(selects), answer["data"]["runs"]

    await slurm_run(db, clock, tenancy, name="s0", job_id="10")
    await World(db, clock, tenancy).submit(name="l0")
    few, _ = await statements()
    for i in range(1, 4):
        await slurm_run(db, clock, tenancy, name=f"s{i}", job_id=f"1{i}")
        await World(db, clock, tenancy).submit(name=f"l{i}")
    many, runs = await statements()
    assert many == few
    jobs = {r["name"]: r["slurm"] and r["slurm"]["jobId"] for r in runs}
    assert jobs == {"s0": "10", "s1": "11", "s2": "12", "s3": "13"} | {
        f"l{i}": None for i in range(4)
    }
