"""A preempted run is not restarting in a loop (issue 36): the time it ran before it was
preempted resets its restarts in a row as a failure's stop does (seed L-69: "10 minutes
running resets the count"), so the API gives no Restarting in a loop panel beside its
Preempted advice (seed L-57, L-68), and a failure after it runs again counts from 1."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from backend.db import Database
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import graphql

QUERY = """query($name: String!) { run(name: $name) { state
  advice { kind } restartLoop { restarts } workers { restarts } } }"""


@pytest.fixture
async def world(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    return world


async def panels(client: httpx.AsyncClient, token: str) -> tuple[Any, ...]:
    answer = await graphql(client, token, QUERY, name="sweep-7")
    assert "errors" not in answer, answer
    run = answer["data"]["run"]
    job = (
        await client.get("/v1/jobs/sweep-7", headers={"Authorization": f"Bearer {token}"})
    ).json()
    return run["state"], run["advice"], run["restartLoop"], job["restart_loop"]


async def test_a_run_preempted_after_running_long_is_not_restarting_in_a_loop(
    world: World, client: httpx.AsyncClient, tenancy: Tenancy
) -> None:
    await world.submit(name="sweep-7", workers=1, gpus=8, priority=10)
    await world.schedule()
    await world.start("sweep-7-0")
    world.clock.advance(seconds=30)
    await world.report("sweep-7-0", "exited", exit_code=1, log_tail="boom\n")
    world.clock.advance(seconds=30)  # its backoff after one failure
    assert [r.placed for r in [await world.schedule()]] == [["sweep-7"]]
    await world.start("sweep-7-0")
    world.clock.advance(minutes=20)  # well past the 10 minutes that reset the count
    loop = await panels(client, tenancy.member_token)
    assert loop == ("Running", None, None, None)

    await world.submit(name="llm", workers=1, gpus=8, priority=90)
    assert (await world.schedule()).preempted == ["sweep-7"]
    world.clock.advance(seconds=3)
    await world.report("sweep-7-0", "exited", exit_code=143, log_tail="stopped\n")
    state, advice, graphql_loop, rest_loop = await panels(client, tenancy.member_token)
    assert (state, advice) == ("Pending", {"kind": "preempted"})
    assert (graphql_loop, rest_loop) == (None, None)  # was 1: the failure 20 minutes before

    # llm runs and ends; sweep-7 runs again and fails at once: its first failure in a row
    assert (await world.schedule()).placed == ["llm"]
    await world.start("llm-0")
    await world.report("llm-0", "exited", exit_code=0)
    assert (await world.schedule()).placed == ["sweep-7"]
    await world.start("sweep-7-0")
    world.clock.advance(seconds=10)
    await world.report("sweep-7-0", "exited", exit_code=1, log_tail="boom again\n")
    state, reason = await world.status("sweep-7")
    assert state == "Pending" and "(1/10)" in reason, reason
    _, _, graphql_loop, rest_loop = await panels(client, tenancy.member_token)
    assert graphql_loop == {"restarts": 1} and rest_loop["restarts"] == 1
