"""Which worker's log a run's name means (seed L-10: a run means its first worker; L-59: a failed
run's reason names the first worker that failed, whose log has the cause). Issue 36: `astra
astraeus logs <run>` of a run whose rank 1 failed showed rank 0's log."""

from __future__ import annotations

from datetime import timedelta

from backend.db import Database
from backend.lifecycle.sentences import EndCause
from backend.logs import service as logs
from backend.models import Machine
from tests.lifecycle.world import World
from tests.support.lifecycle import running_gang


async def _located(world: World, db: Database, name: str) -> tuple[str, str]:
    """The worker the name means, and the machine that keeps its log."""
    principal = await world.principal()
    async with db.read() as session:
        worker, machine_id = await logs.locate(session, principal, name)
        machine = await session.get(Machine, machine_id)
    assert machine is not None
    return worker.name, machine.name


async def test_a_failed_runs_name_means_the_worker_that_failed_it(
    world: World, db: Database
) -> None:
    await running_gang(world, restart_policy="never")
    world.clock.advance(seconds=20)
    crashed = world.clock.now() - timedelta(seconds=1)
    await world.report("llama-sft-1", "exited", exit_code=3, at=crashed, log_tail="giving up\n")
    await world.report("llama-sft-0", "exited", exit_code=143, cause=EndCause.SIGNALLED, signal=15)
    state, reason = await world.status("llama-sft")
    assert (state, reason) == (
        "Failed",
        "Worker llama-sft-1 failed on gpu-08: Exited with code 3; the gang does not run without it",
    )
    assert await _located(world, db, "llama-sft") == ("llama-sft-1", "gpu-08")
    # a worker's own name still means that worker
    assert await _located(world, db, "llama-sft-0") == ("llama-sft-0", "gpu-07")


async def test_any_other_runs_name_means_its_first_worker(world: World, db: Database) -> None:
    await running_gang(world)
    assert await _located(world, db, "llama-sft") == ("llama-sft-0", "gpu-07")
