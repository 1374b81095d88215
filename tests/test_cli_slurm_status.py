"""``astra astraeus status <run>`` of a Slurm run (issue 38): one more line, ``Slurm:    job 12 ·
partition gpu · account nlp · QOS normal · priority 4294901759 · cancelled by root``; a run on
any other cluster reads as the seed prints it (seed L-29), to the character. The answers are the
server's own to the query the CLI sends."""

from __future__ import annotations

import json
from typing import Any

import httpx

from backend.cli.astra.client import Api, Target
from backend.cli.astra.main import RUN_QUERY, format_slurm, format_status
from backend.cli.astra.terminal import as_json
from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import graphql
from tests.support.slurm_jobs import slurm_run

SLURM_LINE = (
    "Slurm:    job 12 · partition gpu · account nlp · QOS normal · priority 4294901759"
    " · cancelled by root"
)


async def run_as_the_cli_reads_it(client: httpx.AsyncClient, token: str, name: str) -> Any:
    """The CLI's own query, answered by the server, as ``astra`` shows it on a terminal."""
    answer = await graphql(client, token, RUN_QUERY, name=name)
    assert "errors" not in answer, answer
    api = Api(Target(api="http://127.0.0.1:1/v1", token="t"), for_terminal=True)
    return api.answer(answer["data"])["run"]


async def test_a_slurm_runs_status_ends_with_its_job(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38
    await slurm_run(db, clock, tenancy)
    run = await run_as_the_cli_reads_it(client, tenancy.member_token, "llama-sft")
    assert format_status(run).splitlines() == [
        "llama-sft: Pending — Run created",
        "  llama-sft-0  Pending  -  Waiting to be placed with its gang",
        SLURM_LINE,
    ]
    # --json: the job as GraphQL answers it
    assert json.loads(as_json(run))["slurm"] == {
        "jobId": "12",
        "submittedHere": True,
        "jobName": "llama-sft",
        "account": "nlp",
        "user": "alice",
        "partition": "gpu",
        "qos": "normal",
        "priority": 4294901759,
        "cancelledBy": "root",
    }


async def test_a_run_on_another_cluster_reads_as_the_seed_prints_it(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: seed L-61 … L-64, byte for byte, with no Slurm line
    world = World(db, clock, tenancy)
    await world.machine("gpu-07", gpus=1)
    await world.machine("gpu-08", gpus=1)
    await world.submit()
    await world.schedule()
    await world.start("llama-sft-0", "llama-sft-1")
    run = await run_as_the_cli_reads_it(client, tenancy.member_token, "llama-sft")
    assert run["slurm"] is None
    assert format_status(run) == (
        "llama-sft: Running — 2 of 2 workers running\n"
        "  llama-sft-0  Running  gpu-07  Container running\n"
        "  llama-sft-1  Running  gpu-08  Container running"
    )


def test_what_slurm_did_not_say_is_left_out() -> None:
    # issue 38: an imported job never cancelled, without a QOS or a priority
    job = {
        "jobId": "7_3",
        "partition": "debug",
        "account": "lab",
        "qos": "",
        "priority": None,
        "cancelledBy": None,
    }
    assert format_slurm(job) == "Slurm:    job 7_3 · partition debug · account lab"


async def test_another_workspace_gets_no_run_and_no_job(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: the CLI's query with another workspace's token finds nothing
    await slurm_run(db, clock, tenancy)
    for token in (tenancy.other_token, tenancy.foreign_token):
        answer = await graphql(client, token, RUN_QUERY, name="llama-sft")
        assert answer["data"] == {"run": None}, answer
