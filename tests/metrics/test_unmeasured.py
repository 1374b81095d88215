"""Metrics a machine's agent cannot measure are said to be absent, not shown as nothing (issue 20):
the range answer (REST and GraphQL) names the workers whose machine does not measure the metric
and says why; another workspace learns nothing of them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from backend.access import service as access
from backend.db import Database
from backend.errors import NotFound
from backend.metrics import service as metrics
from backend.metrics.service import RangeParams
from backend.models import Machine
from tests.lifecycle.world import World
from tests.metrics.conftest import HOUR, T0, Placed, at
from tests.support import FakeClock, Tenancy

RX = "task_network_receive_bytes_total"
TX = "task_network_transmit_bytes_total"
HOST_NETWORK = "Not measured: this machine's agent runs processes on the host's network"


async def said(db: Database, machine_id: int, executor: str, unmeasured: Sequence[str]) -> None:
    """What the machine's agent said in its Hello."""
    async with db.transaction() as session:
        await session.execute(
            update(Machine)
            .where(Machine.id == machine_id)
            .values(executor=executor, unmeasured_metrics=list(unmeasured))
        )


async def query(
    db: Database, clock: FakeClock, token: str, metric: str, *match: str
) -> dict[str, Any]:
    clock.moment = at(T0 + HOUR)
    async with db.read() as session:
        principal = await access.authenticate(session, token)
        answer = await metrics.range_query(
            session,
            principal,
            RangeParams(metric=metric, match=match, start=str(T0), end=str(T0 + HOUR)),
            now=clock.now(),
            retention=timedelta(days=15),
        )
    return answer.to_json()


async def test_network_bytes_of_workers_sharing_the_hosts_network_are_not_measured(
    db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed
) -> None:
    for machine_id in (placed.gpu07, placed.gpu08):
        await said(db, machine_id, "process", [RX, TX])
    answer = await query(db, clock, tenancy.member_token, RX, "run:llama-sft")
    assert answer["series"] == []
    assert answer["unmeasured"] == ["llama-sft-0", "llama-sft-1"]
    assert answer["not_measured"] == HOST_NETWORK
    # What the machines measure is not said to be absent.
    measured = await query(db, clock, tenancy.member_token, "task_gpu_utilization_ratio")
    assert (measured["unmeasured"], measured["not_measured"]) == ([], None)


async def test_the_sentence_says_how_many_when_some_machines_measure_it(
    db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed
) -> None:
    await said(db, placed.gpu07, "docker", [RX, TX])
    await said(db, placed.gpu08, "docker", [])  # a container network of its own, say
    answer = await query(db, clock, tenancy.member_token, TX, "run:llama-sft")
    assert answer["unmeasured"] == ["llama-sft-0"]
    assert answer["not_measured"] == (
        "Not measured: this machine's agent runs containers on the host's network (1 of 2 workers)"
    )
    await said(db, placed.gpu08, "process", ["task_memory_used_bytes"])
    memory = await query(
        db, clock, tenancy.member_token, "task_memory_used_bytes", "worker:llama-sft-1"
    )
    assert memory["not_measured"] == "Not measured: this machine gives its agent no control groups"


async def test_another_workspace_learns_nothing_of_the_workers_or_their_machines(
    db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed
) -> None:
    for machine_id in (placed.gpu07, placed.gpu08, placed.gpu09):
        await said(db, machine_id, "process", [RX, TX])
    with pytest.raises(NotFound):
        await query(db, clock, tenancy.other_token, RX, "run:llama-sft")
    theirs = await query(db, clock, tenancy.other_token, RX)
    assert theirs["unmeasured"] == ["sweep-7-0"]  # their own worker only
    assert theirs["not_measured"] == HOST_NETWORK


GRAPHQL = """query($m: String!, $match: [String!]) {
  metricRange(metric: $m, match: $match, start: "START", end: "END") {
    metric series { labels } unmeasured notMeasured
  }
}""".replace("START", str(T0)).replace("END", str(T0 + HOUR))


async def test_graphql_says_so_too_and_to_no_other_workspace(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed
) -> None:
    clock.moment = at(T0 + HOUR)
    for machine_id in (placed.gpu07, placed.gpu08):
        await said(db, machine_id, "process", [RX, TX])

    async def ask(token: str) -> dict[str, Any]:
        answer = await client.post(
            "/graphql",
            json={"query": GRAPHQL, "variables": {"m": RX, "match": ["run:llama-sft"]}},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    mine = await ask(tenancy.member_token)
    assert mine["data"]["metricRange"] == {
        "metric": RX,
        "series": [],
        "unmeasured": ["llama-sft-0", "llama-sft-1"],
        "notMeasured": HOST_NETWORK,
    }
    other = await ask(tenancy.other_token)
    assert other["data"] is None
    assert "llama-sft-0" not in str(other) and "Not measured" not in str(other)


def console_query() -> str:
    """The query the console's Metrics section asks (frontend/src/pages/Metrics.tsx)."""
    source = (Path(__file__).parents[2] / "frontend/src/pages/Metrics.tsx").read_text()
    return source.split("export const QUERY = /* GraphQL */ `", 1)[1].split("`;", 1)[0]


async def test_the_consoles_query_gets_the_sentence(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed
) -> None:
    clock.moment = at(T0 + HOUR)
    await said(db, placed.gpu07, "process", [RX, TX])
    variables = {
        "metric": RX,
        "match": ["worker:llama-sft-0"],
        "by": "worker",
        "start": str(T0 // 1000),
        "rate": True,
    }
    answer = await client.post(
        "/graphql",
        json={"query": console_query(), "variables": variables},
        headers={"Authorization": f"Bearer {tenancy.member_token}"},
    )
    body = answer.json()
    assert "errors" not in body, body
    assert body["data"]["metricRange"]["notMeasured"] == HOST_NETWORK
    assert body["data"]["metricRange"]["unmeasured"] == ["llama-sft-0"]


async def test_an_ended_runs_workers_are_still_said_not_measured(
    db: Database, clock: FakeClock, tenancy: Tenancy, placed: Placed
) -> None:
    # issue 36: once a run ended its workers hold no machine, and its network chart said "No
    # samples" as if the workload sent nothing: the machine they last ran on still did not
    # measure it (seed L-34, L-38)
    world = World(db, clock, tenancy)
    await said(db, placed.gpu07, "process", [RX, TX])
    await world.start("llama-sft-0", "llama-sft-1")
    await world.report("llama-sft-0", "exited", exit_code=0)
    await world.report("llama-sft-1", "exited", exit_code=0)
    assert await world.status("llama-sft") == ("Completed", "2 of 2 workers completed")
    assert [w.machine_id for w in await world.workers("llama-sft")] == [None, None]
    answer = await query(db, clock, tenancy.member_token, RX, "run:llama-sft")
    assert answer["unmeasured"] == ["llama-sft-0"]
    assert answer["not_measured"] == HOST_NETWORK + " (1 of 2 workers)"
    worker = await query(db, clock, tenancy.member_token, RX, "worker:llama-sft-0")
    assert (worker["unmeasured"], worker["not_measured"]) == (["llama-sft-0"], HOST_NETWORK)
