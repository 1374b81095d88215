"""``GET /v1/jobs/<run>`` with its Slurm job (issue 38): ``slurm`` holds the job's id,
partition, account, QOS, Slurm's priority and who cancelled it, null on any other cluster."""

from __future__ import annotations

import httpx

from backend.db import Database
from backend.rest.openapi import document
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import auth
from tests.support.slurm_jobs import slurm_run


async def test_a_slurm_runs_job_shows_its_slurm_job(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: the job's facts in snake case; never the import's own bookkeeping (applied)
    await slurm_run(db, clock, tenancy)
    answer = await client.get("/v1/jobs/llama-sft", headers=auth(tenancy.member_token))
    assert answer.status_code == 200
    assert answer.json()["slurm"] == {
        "job_id": "12",
        "submitted_here": True,
        "job_name": "llama-sft",
        "account": "nlp",
        "user": "alice",
        "partition": "gpu",
        "qos": "normal",
        "priority": 4294901759,
        "cancelled_by": "root",
    }


async def test_a_run_on_another_cluster_has_a_null_slurm(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38
    await World(db, clock, tenancy).submit(name="local-run")
    answer = await client.get("/v1/jobs/local-run", headers=auth(tenancy.member_token))
    assert answer.status_code == 200
    assert answer.json()["slurm"] is None


async def test_another_workspace_gets_404_and_nothing_of_the_job(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # issue 38: as private as its run
    await slurm_run(db, clock, tenancy)
    for outsider in (tenancy.other_token, tenancy.foreign_token):
        answer = await client.get(
            "/v1/jobs/llama-sft", params={"workspace": "default"}, headers=auth(outsider)
        )
        assert answer.status_code == 404, answer.text
        assert "nlp" not in answer.text and "4294901759" not in answer.text


def test_the_openapi_document_describes_the_slurm_job() -> None:
    # issue 38: the answer's schema is generated from the same model as the body
    schemas = document()["components"]["schemas"]
    job = schemas["Job"]["properties"]["slurm"]
    assert {"$ref": "#/components/schemas/SlurmJob"} in job["anyOf"]
    assert schemas["SlurmJob"]["required"] == [
        "job_id",
        "submitted_here",
        "job_name",
        "account",
        "user",
        "partition",
        "qos",
        "priority",
        "cancelled_by",
    ]
