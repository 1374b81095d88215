"""The failure panel's data: the worker that failed a run for good and its advice; a worker
restarting after a failure explains its last one (seed L-48, L-49, L-50, L-58, L-59)."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import update

from backend.db import Database
from backend.lifecycle.sentences import EndCause
from backend.lifecycle.states import Wait
from backend.models import Machine
from tests.lifecycle.world import World
from tests.support import FakeClock, Tenancy
from tests.support.api import graphql

QUERY = """query($name: String!) { run(name: $name) { state reason
  failedWorker { name state advice { reason exitCode kind lookAt open } lastFailure }
  workers { name state reason restartAt restarts advice { reason kind lookAt } } } }"""


@pytest.fixture
async def world(db: Database, clock: FakeClock, tenancy: Tenancy) -> World:
    world = World(db, clock, tenancy)
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    return world


async def test_a_failed_gang_names_its_first_failure_and_advises(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await world.submit(workers=2, gpus=8, restart_policy="never")
    await world.schedule()
    await world.start("llama-sft-0", "llama-sft-1")
    world.clock.advance(seconds=30)
    await world.report("llama-sft-1", "exited", exit_code=1, log_tail="Traceback")
    world.clock.advance(seconds=5)
    await world.report("llama-sft-0", "exited", exit_code=143)  # stopped with its gang
    run = (await graphql(client, tenancy.member_token, QUERY, name="llama-sft"))["data"]["run"]
    assert (run["state"], run["reason"]) == (
        "Failed",
        "Worker llama-sft-1 failed on gpu-08: Exited with code 1; the gang does not run without it",
    )
    failed = run["failedWorker"]
    assert failed["name"] == "llama-sft-1"
    assert failed["advice"] == {
        "reason": "Exited with code 1",
        "exitCode": 1,
        "kind": "program",
        "lookAt": "Your program: its log.",
        "open": "log",
    }
    assert failed["lastFailure"]["log_tail"] == "Traceback"
    stopped = next(w for w in run["workers"] if w["name"] == "llama-sft-0")
    assert stopped["state"] == "Stopped" and stopped["advice"] is None  # a consequence only


async def test_a_worker_restarting_explains_its_last_failure(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    await world.submit(workers=1, gpus=8)
    await world.schedule()
    await world.start("llama-sft-0")
    await world.report(
        "llama-sft-0",
        "exited",
        exit_code=137,
        cause=EndCause.OOM_KILLED,
    )
    run = (await graphql(client, tenancy.member_token, QUERY, name="llama-sft"))["data"]["run"]
    assert run["failedWorker"] is None  # the run has not failed: it restarts
    [worker] = run["workers"]
    assert (worker["state"], worker["restarts"]) == ("Pending", 1)  # the restart it waits for
    assert worker["advice"]["kind"] == "out_of_memory"
    assert worker["advice"]["lookAt"].startswith("Memory: the Memory chart near the limit.")


async def test_a_run_that_does_not_start_says_where_to_look(
    client: httpx.AsyncClient, db: Database, clock: FakeClock, tenancy: Tenancy
) -> None:
    # seed L-61: no machine fits; L-45: at the barrier (Starting together)
    world = World(db, clock, tenancy)
    await world.submit(workers=2, gpus=8)
    await world.schedule()
    query = """{ run(name: "llama-sft") { state waitAdvice { reason kind lookAt open } } }"""
    run = (await graphql(client, tenancy.member_token, query))["data"]["run"]
    assert run["state"] == "Pending"
    assert run["waitAdvice"] == {
        "reason": "No machine fits: local has no ready machine",
        "kind": "machines",
        "lookAt": "The per-machine reasons: Read a pending reason.",
        "open": "machines",
    }
    await world.machine("gpu-07")
    await world.machine("gpu-08")
    await world.schedule()
    await world.report("llama-sft-0", "ready")
    run = (await graphql(client, tenancy.member_token, query))["data"]["run"]
    assert (run["state"], run["waitAdvice"]["kind"]) == ("Starting", "barrier")
    assert run["waitAdvice"]["reason"] == "Starting together: 1 of 2 ready"
    await world.report("llama-sft-1", "ready")
    await world.start("llama-sft-0", "llama-sft-1")
    run = (await graphql(client, tenancy.member_token, query))["data"]["run"]
    assert (run["state"], run["waitAdvice"]) == ("Running", None)


async def test_a_run_pulling_its_image_points_at_the_image_and_its_reuse(
    client: httpx.AsyncClient, world: World, tenancy: Tenancy
) -> None:
    # seed L-66: Pulling for a long time -> a large image on a slow link; later runs on that
    # machine reuse it (the reuse itself is a Docker engine's: test_docker_image_reuse.py)
    async with world.db.transaction() as session:  # machines whose agents run containers
        await session.execute(update(Machine).values(executor="docker"))
    await world.submit(workers=1, gpus=8, image="ghcr.io/acme/train:v9")
    await world.schedule()
    pulling = (Wait.IMAGE, "ghcr.io/acme/train:v9")
    await world.report("llama-sft-0", "Pulling", waits=pulling, detail="2.1 GB of 3.4 GB")
    query = """{ run(name: "llama-sft") { state waitAdvice { reason kind lookAt open } } }"""
    run = (await graphql(client, tenancy.member_token, query))["data"]["run"]
    assert run == {
        "state": "Pulling",
        "waitAdvice": {
            "reason": "Pulling image ghcr.io/acme/train:v9: 2.1 GB of 3.4 GB",
            "kind": "pulling",
            "lookAt": "A large image on a slow link. Later runs on that machine reuse it.",
            "open": "log",
        },
    }
